"""PostgreSQL: a server shared by many processes on many machines, with row locks.

Design note.

* Locking.  Two commits on disjoint objects should not wait for each other, so vote
  does not take a database-wide lock: it opens an ordinary (read committed) transaction,
  stages the states, and locks the *rows* of the objects it changes with
  ``SELECT ... FOR UPDATE`` (``current_object`` in history-preserving mode,
  ``object_state`` in history-free mode) and the rows it read-current with
  ``FOR SHARE``, each in oid order so two committers cannot deadlock on their writes (a
  rare deadlock between one commit's write and another's read-current is reported by
  the server and raised as a retryable error).  The portable conflict query then runs
  after the locks are granted, so it sees the newest committed tids and cannot race.
  Finish takes the one global lock, ``commit_row`` ``FOR UPDATE``, only for the short
  step that reads the last tid, allocates the next one, moves the staged states and
  commits; tids therefore become visible strictly in increasing order.  Every wait is
  bounded by ``SET LOCAL lock_timeout`` from ``commit-lock-timeout``; running out raises
  :class:`~zodbsql.errors.CommitLockTimeout`, which ``transaction`` retries.
* Polling and loading.  Connections are in autocommit: outside an explicit transaction
  every statement is its own snapshot and no session sits idle in a transaction.
  History-preserving loads name the snapshot tid (``tid <= snapshot``), so they need no
  transaction.  History-free data has no old revisions, so the poll opens
  ``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY``: the poll and every load until the
  ZODB transaction ends see one snapshot (the core ends it at ``afterCompletion``).
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
  history-preserving            7           11
  history-free                  9           13
  ===========================  ==========  ==========

  The 7: the poll (one UNION statement: last tid and changes), ``BEGIN; SET LOCAL
  lock_timeout`` (one call), the staged states (one pipelined ``executemany``), the row
  locks, the conflict query, ``zodbsql_finish(...)`` (procedures_hp.sql: lock the commit
  row, allocate the tid, record the transaction, move states, current pointers and
  references) and COMMIT.  1,000 new objects add their references (one more
  ``executemany``) and oid blocks from the sequence.  The staging tables are
  ``ON COMMIT DELETE ROWS``, so nothing is spent clearing them.  History-free adds the
  read transaction (BEGIN and ROLLBACK) that holds its snapshot.
* Schemas.  Tables live in the configured schema (``search_path``), so one PostgreSQL
  database can hold several zodbsql databases; only the current schema's tables count
  when the schema is checked.
"""
from zodbsql.backends.postgresql.adapter import PostgreSQLBackend, PostgreSQLOptions

__all__ = ["PostgreSQLBackend", "PostgreSQLOptions"]
