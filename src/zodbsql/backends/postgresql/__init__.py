"""PostgreSQL: a server shared by many processes on many machines, with row locks.

Design note.

* Locking.  Two commits on disjoint objects should not wait for each other, so vote
  does not take a database-wide lock: it opens an ordinary (read committed) transaction
  and calls ``zodbsql_stage_and_lock`` once, which stages the states and runs
  ``zodbsql_lock_objects``.  That function locks the
  *rows* of the objects the commit changes with ``FOR UPDATE`` in oid order
  (``current_object`` in history-preserving mode, ``object_state`` in history-free
  mode), then share-locks the rows it read-current with ``FOR SHARE NOWAIT`` (a row
  another commit is writing is a read conflict at once, never a wait), then returns the
  write and read conflicts against the newest committed tids.  Finish takes the one
  global lock, ``commit_row`` ``FOR UPDATE``, only for the short step that allocates
  the next tid, moves the staged states and commits; tids therefore become visible
  strictly in increasing order.  Every wait is bounded by ``SET LOCAL lock_timeout``
  (``row-lock-timeout`` in vote, ``commit-lock-timeout`` in finish); running out raises
  :class:`~zodbsql.errors.CommitLockTimeout`, which ``transaction`` retries.
* Why no deadlock.  ``locker.py`` gives the argument: every wait for a row lock is a
  commit in its exclusive, ascending-oid step waiting for a holder that waits only for a
  higher oid, for ``commit_row`` (held by a finish that waits for nothing) or for
  nothing at all; share locks never wait; a pack batch locks the rows it deletes with
  ``SKIP LOCKED`` before ``commit_row``.  Following waits, oids strictly increase, so
  no cycle forms.  ``tests/storage/test_contention.py`` checks the server's own
  ``pg_stat_database.deadlocks`` stays at zero under crossing write/read-current sets
  and a shared BTree.  The plans of the two locking steps, as auto_explain printed
  them (costs left out) for a commit of three objects with three read-current oids in
  a database of 20,000: the staged oids reach the first step as an array, so the rows
  are found through the primary key (joined with ``temp_store``, which has no
  statistics, the planner guessed 810 staged rows and scanned the whole table: 7.8 ms
  of every vote at 97,000 objects, against 0.14 ms).  Rows are locked in oid order
  whatever the plan: ``LockRows`` reads an index scan in key order, or a ``Sort`` on
  ``zoid`` when a plan needs one.  The first step's locked rows are gathered into two
  arrays (their oids are also left for finish, in the setting ``zodbsql.existing``:
  the other staged objects are new, and their rows are inserted without ON CONFLICT),
  which a hash join with ``temp_store`` turns into the write conflicts (printed in a
  database of 240,000 objects)::

    Aggregate
      ->  Subquery Scan on l
            ->  LockRows
                  ->  Sort
                        Sort Key: c.zoid
                        ->  Bitmap Heap Scan on current_object c
                              Recheck Cond: (zoid = ANY ('{243025,243026,243027}'::bigint[]))
                              ->  Bitmap Index Scan on current_object_pkey
                                    Index Cond: (zoid = ANY ('{243025,243026,243027}'::bigint[]))
    Hash Left Join
      Hash Cond: (t.zoid = l.zoid)
      Filter: (COALESCE(l.tid, '0'::bigint) <> t.prev_tid)
      ->  Seq Scan on temp_store t
      ->  Hash
            ->  Function Scan on l
    LockRows
      ->  Index Scan using current_object_pkey on current_object c
            Index Cond: (zoid = ANY ('{2,3,4}'::bigint[]))
* Polling and loading.  Connections are in autocommit: outside an explicit transaction
  every statement is its own snapshot and no session sits idle in a transaction.
  History-preserving loads name the snapshot tid (``tid <= snapshot``), so they need no
  transaction.  History-free data has no old revisions, so the poll opens
  ``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY``: the poll and every load until the
  ZODB transaction ends see one snapshot.
  The BEGIN and the poll travel as one simple-protocol query (``poller.py``), so the
  start stays one round trip; the poll is then planned at each start instead of
  prepared once.  A poll that finds the snapshot before it still open ends it first in
  the same query (with COMMIT: connections.py says why): the core leaves it open for
  the poll ZODB sends right after ``afterCompletion`` and at its begin (``sync``), and
  ends it at once where no poll follows (``Connection.close``, an explicit transaction
  manager: core storage/next_poll.py).
  History-preserving, a start skips the poll while nothing committed: every commit
  announces its tid with ``pg_notify`` inside ``zodbsql_finish``, and one session per
  storage listens (``listener.py``, ``listen-for-commits``).  After its own commit, a
  start skips the poll too when the finish query returned, with the tid, the tid
  before it, and that was the instance's snapshot: the changes are its own objects.
  History-free storages listen too, and a start skips its poll only while the read
  transaction its last poll began is open (ZODB's begin after its afterCompletion
  poll): begun at a load instead, it could see a later commit.  After an own commit
  that changed no object, made alone, that read transaction still sees the database
  as the commit does, so the start skips its poll too; after one that changed
  objects, the poll asks only for what came after the commit.
* Storing.  Oids and tids are BIGINT, states BYTEA.  A commit stages into session-local
  TEMPORARY tables (no WAL, invisible to others) and moves them with set-based
  ``INSERT ... SELECT``/``ON CONFLICT`` statements.  Oids come from a SEQUENCE, which
  never blocks and is outside any transaction.  Pack's work tables are TEMPORARY too,
  since one pack uses one connection.
* Round trips.  Every statement is one round trip, so they are counted
  (``tests/storage/test_round_trips.py`` checks these figures):

  ===========================  ==========  ==========
  one ZODB transaction          1 object    1,000 new
  ===========================  ==========  ==========
  history-preserving            2           5
  history-free                  3           6
  ===========================  ==========  ==========

  The 2: ``BEGIN; SET LOCAL lock_timeout`` with ``zodbsql_stage_and_lock`` (the states
  staged, each column one array that ``unnest`` turns into rows, each state's references
  one array of them, then the row locks and the conflict check) as one query, the states
  inline when they take at most 8 KB (a larger commit sends its BEGIN first and the arrays
  in binary), and ``zodbsql_finish(...); COMMIT`` as one query (procedures_hp.sql: lock
  the commit row, allocate the tid, record and log the transaction, move the states with
  their references, and the current pointers; its values go inline, since a query of two
  statements can't carry parameters). A commit that stores nothing is the finish call
  alone, in autocommit: one statement. The poll after the commit is skipped when nothing
  else was committed since the instance's snapshot (above); otherwise it is one statement
  more (one UNION statement: last tid and changes). 1,000 new objects after a pause add
  two oid blocks from the sequence (16 and 1,024 oids); back-to-back big commits take one
  block of 4,096 per 4,096 new objects. The staging tables are ``ON COMMIT DELETE ROWS``,
  so nothing is spent clearing them. History-free adds the poll after the commit: its
  snapshot is a read transaction begun after it, whose BEGIN, and the end of the one
  before, go with the poll's query.
* Standbys, failover, poolers.  Polls and loads may go to a hot standby
  (``replica-dsns``): the lag is read on the standby itself (``standbys.py``), so
  choosing one costs the primary nothing, and the core reads a snapshot there only if
  it is not older than the process's last commit.  ``failover-dsns`` lists the next
  primaries; libpq's ``target_session_attrs=primary`` passes over a standby still in
  recovery, so a promoted one is found by the next session.  Session state (TEMPORARY
  staging tables, prepared statements, ``SET search_path``) rules out poolers that
  share server sessions between transactions: ``pooler.py`` tells them at the first
  session and the storage refuses to start.  ``tests/replica`` runs all three on a
  real primary, standby and pgbouncer.
* Schemas.  Tables live in the configured schema (``search_path``), so one PostgreSQL
  database can hold several zodbsql databases; only the current schema's tables count
  when the schema is checked.
* Plans.  Every session sets ``jit = off``: the planner estimates the prefetch's
  recursive walk at millions of rows on a large table, and JIT compiled it at each run
  (400 ms of a statement that runs in 1 ms).  Vote and finish reach the stored rows of
  the staged or read-current objects through arrays of their oids (``= ANY``), not
  through joins with the staging tables or ``unnest``: those have no statistics, and a
  plan PL/pgSQL cached while a table was small went on scanning it whole as it grew.
"""
from zodbsql.backends.postgresql.adapter import PostgreSQLBackend
from zodbsql.backends.postgresql.options import PostgreSQLOptions

__all__ = ["PostgreSQLBackend", "PostgreSQLOptions"]
