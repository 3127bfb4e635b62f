"""SQLite: the embedded default, one database file shared by the processes of one machine.

Design note.

* Locking.  SQLite has one writer at a time, so there are no row locks to take: vote
  opens the write transaction with ``BEGIN IMMEDIATE`` and holds it until finish or
  abort.  The wait for it is SQLite's busy timeout, set from ``commit-lock-timeout``;
  running out ends in :class:`~zodbsql.errors.CommitLockTimeout`, which ``transaction``
  retries.  The busy handler sleeps between tries, so threads that came later can win
  every try: a thread that waited ``PATIENCE`` (a second) there queues instead, and
  the threads of its process that come after queue behind it, in arrival order
  (``writers.py``), until the queue is empty again.  Conflict detection is then one
  statement (the current tids of the stored objects, ``locker.py``) inside that write
  transaction, so it cannot race another committer.
* Journal.  WAL mode: readers never block the writer nor each other, which is what lets
  many ZODB connections in several processes read while one commits.  ``synchronous``
  defaults to FULL (the WAL is synced at each commit, as FileStorage fsyncs); NORMAL
  is faster and still loses nothing when a process dies, only on power loss.  A commit
  checkpoints once the WAL holds ``wal-autocheckpoint`` pages (4000, four times
  SQLite's default): the index pages many commits change are copied once per
  checkpoint, not once every few commits.  A thread of the storage's own makes them,
  at half that, off the commits (``checkpointer.py``); a commit does only when the
  thread falls behind.
* Polling and loading.  History-preserving loads name the snapshot tid
  (``tid <= snapshot``), so no read transaction is held between ZODB transactions and
  checkpoints are never starved by an idle connection; within a ZODB transaction its
  loads share one, begun at the first (``reads_in_transaction``: a statement outside a
  transaction takes and drops the WAL's read lock and the page cache, twice the time of
  a load by oid) and ended as the history-free one is.  History-free data has no old
  revisions, so there the poll opens a read transaction that is the snapshot, ended
  when the ZODB transaction ends (``afterCompletion``), when the ZODB connection is
  closed, or at the next poll.
  A connection left open and unused after an implicit transaction keeps that snapshot
  (ZODB polls again right after each commit), so WAL checkpoints wait for it; explicit
  transaction managers or closing connections avoid that.  A start whose connection's
  ``PRAGMA data_version`` has not changed since its last poll skips the poll
  (``wakeup.py``): nothing was committed since.
* Writing at vote.  Nobody else can commit between a vote's ``BEGIN IMMEDIATE`` and
  its COMMIT, so a commit of states alone takes its tid in vote, after the conflict
  check and resolution, and writes the states into ``object_state`` there
  (``features.py``, ``mover.write_states``); finish only commits.  A 1,000-object
  commit so spends 2.2 ms in SQL before its COMMIT instead of 3.3: no staging table to
  empty, fill and move from.  A commit with a deletion, a copied revision (undo) or a
  blob stages its states in TEMP tables (``temp_store``, ``temp_blob``, in the
  connection's own temporary database, no lock on the main file) for finish's
  set-based steps, as on the servers.
"""
from zodbsql.backends.sqlite.adapter import SQLiteBackend

__all__ = ["SQLiteBackend"]
