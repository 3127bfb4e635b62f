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
  join of the staged states against the current tids, inside that write transaction,
  so it cannot race another committer.
* Journal.  WAL mode: readers never block the writer nor each other, which is what lets
  many ZODB connections in several processes read while one commits.  ``synchronous``
  defaults to FULL (the WAL is synced at each commit, as FileStorage fsyncs); NORMAL
  is faster and still loses nothing when a process dies, only on power loss.
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
* Staging.  Commit states go to TEMP tables (``temp_store``, ``temp_blob``), which live in
  the connection's own temporary database and take no lock on the main file.
"""
from zodbsql.backends.sqlite.adapter import SQLiteBackend

__all__ = ["SQLiteBackend"]
