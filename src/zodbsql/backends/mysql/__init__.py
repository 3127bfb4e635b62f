"""MySQL and MariaDB (InnoDB): one server shared by processes on many machines.

Design note.

* Connections.  mysqlclient (``MySQLdb``, C) is used when it imports, PyMySQL (pure
  Python, always installed) otherwise; ``driver`` pins one.  Sessions run in autocommit
  mode and every transaction is opened explicitly with ``START TRANSACTION``.  Load
  sessions are REPEATABLE READ; commit (and pack) sessions READ COMMITTED, so a locking
  read sees the newest committed row and no gap locks are taken.
* Locking.  Parallel commits of disjoint objects: vote stages the states in TEMPORARY
  tables, then one locking read (``... FOR UPDATE``, driven by ``temp_store`` in primary
  key order, so every committer locks in oid order and two committers can't deadlock)
  locks the current rows of the changed objects and returns their current tids; the
  conflicts are picked out in Python (at READ COMMITTED InnoDB would drop the lock of a
  row a WHERE rejects, so the locking read has none).  Read-current oids are locked in a
  second pass that never waits (``LOCK IN SHARE MODE NOWAIT`` on MariaDB, ``FOR SHARE
  NOWAIT`` on MySQL 8, chosen from the server's version at connect): a row another
  commit is writing is a ``ReadConflictError`` at once.  ``locker.py`` argues why no
  cycle of waits can form (exclusive waits in oid order only, share locks never wait,
  pack batches lock with ``SKIP LOCKED`` before the commit lock);
  ``tests/storage/test_contention.py`` checks that ``Innodb_deadlocks`` does not move.
  Should InnoDB still pick a victim, that is a retryable ``DeadlockError`` (a ZODB
  ConflictError).  Finish takes the one database-wide lock, ``SELECT ... FROM commit_row
  FOR UPDATE``, held only while the tid is chosen, the staged rows moved and COMMIT
  sent, so commits become visible in tid order.  Every lock wait is bounded by the
  session's ``innodb_lock_wait_timeout``, set from ``commit-lock-timeout`` (whole
  seconds, at least 1); running out is error 1205, raised as ``CommitLockTimeout``.
* Polling and loading.  The poll reads ``commit_row`` and then the rows whose tid is
  newer (index range scans).  History-preserving loads name the snapshot tid
  (``tid <= snapshot``), so no transaction is held between ZODB transactions.
  History-free loads read inside ``START TRANSACTION WITH CONSISTENT SNAPSHOT, READ
  ONLY`` opened by the poll and ended with the ZODB transaction.  Every start polls:
  the server sends no notification, and no exact check is cheaper than the poll's one
  round trip (the README's "Transaction starts without a poll" has the figures).
* Storage layout.  InnoDB clusters rows on the primary key: ``object_state (zoid, tid)``
  keeps an object's revisions together and a load is one descent of that b-tree.
  Oids and tids are signed BIGINT everywhere, states LONGBLOB, text utf8mb4.  Upserts
  are ``INSERT ... SELECT ... ON DUPLICATE KEY UPDATE``; deletes driven by the staged
  oids are ``DELETE t FROM temp_store STRAIGHT_JOIN t``; pack uses permanent work
  tables (the walk reads the table it inserts into, which MySQL refuses for TEMPORARY
  tables) under a named lock, one pack per database.  Oid blocks are one autocommitted
  ``UPDATE ... LAST_INSERT_ID(last_oid + n)``.
* Size limit.  A statement may not exceed the server's ``max_allowed_packet``; it is
  read at connect and a state that can't fit (escaped, up to twice its size) is refused
  in vote before anything is sent, naming max_allowed_packet and the sizes.  With
  mysqlclient the mover builds the staging INSERTs itself, as many rows a statement as
  fit in a packet (``mover.staging_statements``); PyMySQL stages with its executemany.

* Galera (MariaDB Galera Cluster, any node writable).  Found by probing, not
  configured: the first connection reads ``wsrep_on`` and ``wsrep_provider``
  (``connections.is_galera``), and every connection of the backend then knows
  (``MySQLConnection.galera``).  What the design above relies on and Galera does not
  give, and what is done instead:

  - Row locks are local to a node.  A commit on another node that changes the same
    rows is caught by certification at COMMIT: the later one is rolled back as a
    whole and gets error 1213, which on Galera is raised as a retryable
    ``DatabaseConflict`` (a ZODB ConflictError; never a half-visible commit: the write
    set is applied everywhere or nowhere).  Since every commit updates ``commit_row``,
    any two commits that did not see each other conflict there, so certification
    orders all commits of the cluster; a commit rolled back at COMMIT reaches the
    application from ``tpc_finish`` (``transaction`` logs that as critical, and
    retries it under ``attempts()``).  ``storage/commit.py`` raises it at once:
    the server answered, so there is no lost COMMIT to settle.
  - The tid.  The commit-row lock reads ``last_tid`` on the committing node.  A commit
    from another node that replaces that row afterwards either reaches this node
    while the row is locked (its applier aborts the local transaction: 1213) or
    after this commit was sent for certification (which rejects it: 1213).  So every
    commit that gets through read the ``last_tid`` of the one before it in the
    cluster's commit order: tids are strictly increasing in that order, and each
    node applies write sets in that order, so on every node commits become visible
    in tid order, as on one server.
  - Causal reads.  A node applies other nodes' commits shortly after they were
    acknowledged, so a poll could miss a commit acknowledged elsewhere.  The
    statements that must see every commit made before them are prefixed with
    ``SET STATEMENT wsrep_sync_wait = 15 FOR`` (``MySQLConnection.causal``; the same
    round trip, the server first waits until it has applied what the cluster had
    committed): the history-preserving poll and last-tid read, the history-free
    ``START TRANSACTION WITH CONSISTENT SNAPSHOT``, the vote's locking read (so a
    conflict with a commit already made elsewhere is found in vote, where conflict
    resolution can merge it, not at COMMIT) and the commit-row lock.  The session's
    ``wsrep_sync_wait`` is left alone: loads name their snapshot and need no wait.
  - Oid blocks.  Two nodes advancing ``oid_counter`` at once: one is rolled back
    (1213, nothing applied); the autocommitted statement is sent again.
  - ``GET_LOCK`` is local to a node.  The schema lock orders the creation of the
    schema on one node only: on Galera the schema is read causally, and a node that
    finds the tables (each CREATE is replicated at once) without their meta rows
    (committed last) waits for the other node's creation to end.  The pack lock
    keeps two packs from sharing the work tables: on Galera the pack also locks the
    row of ``pack_lock`` from a companion session with streaming replication (each
    changed row replicated at once, so the row is locked on every node), whose
    transaction stays open until the pack's session ends; a node that dies takes
    its lock with it, as the cluster rolls back what it was streaming.  (A pack and
    a commit on different nodes that touch the same rows are settled by
    certification, like two commits.)
  - Temporary tables (the staged states) are not replicated, which is what they are
    for; every permanent table is InnoDB with a primary key, as Galera needs.
  - A node outside the primary component (or still joining) answers error 1047; it
    is raised as ``ConnectionLost``, retryable.

  ``tests/cluster`` runs ZODB's suites against a node, a writer per node with exact
  totals afterwards on every node, and a node killed with SIGKILL under load.

* Round trips.  A commit that writes one object and creates one sends 11 statements on
  its pooled connection: the temp-table clear (TRUNCATE, before the transaction: InnoDB
  keeps what DELETE removes from a temporary table), START TRANSACTION, the staged states
  (one multi-row INSERT, each state with its references), the locking read, the
  commit-row lock (which also reads the last tid), the commit-row update, the
  transactions row (history-preserving) or nothing, two set-based moves, COMMIT.
  Counted with the poll (``tests/storage/test_round_trips.py``): one changed object 12
  statements, 1,000 new objects 14 (the extra ones are oid blocks); history-free 13
  and 15.

EXPLAIN on MariaDB 10.11 (id | select_type | table | type | possible_keys | key |
key_len | ref | rows | Extra)::

  HP load: SELECT tid, checksum, state FROM object_state WHERE zoid = %s AND tid <= %s
           ORDER BY tid DESC LIMIT 1
    1 | SIMPLE | object_state | range | PRIMARY,object_state_tid | PRIMARY | 16 | None | 1 | Using where
  HF load: SELECT tid, checksum, state FROM object_state WHERE zoid = %s
    1 | SIMPLE | object_state | const | PRIMARY | PRIMARY | 8 | const | 1 |
  Poll (both modes): SELECT tid, JSON_ARRAYAGG(zoid) FROM (SELECT tid, zoid FROM
           object_state WHERE tid > %s AND tid <= (SELECT last_tid FROM commit_row)
           LIMIT 100001) AS changed GROUP BY tid
    2 | UNION | <derived3> | ALL | None | None | None | None | 20 | Using filesort
    3 | DERIVED | object_state | range | object_state_tid | object_state_tid | 8 | None | 20 | Using where; Using index
  HP lock/conflict: SELECT t.zoid, t.prev_tid, COALESCE(c.tid, 0) FROM temp_store t
           LEFT JOIN current_object c ON c.zoid = t.zoid ORDER BY t.zoid FOR UPDATE
    1 | SIMPLE | t | index | None | PRIMARY | 8 | None | 29 |
    1 | SIMPLE | c | eq_ref | PRIMARY | PRIMARY | 8 | <db>.t.zoid | 1 |
  HF lock/conflict: (the same against object_state)
    1 | SIMPLE | t | index | None | PRIMARY | 8 | None | 29 |
    1 | SIMPLE | c | eq_ref | PRIMARY | PRIMARY | 8 | <db>.t.zoid | 1 |
  commit lock: SELECT last_tid FROM commit_row WHERE id = 0 FOR UPDATE
    1 | SIMPLE | commit_row | const | PRIMARY | PRIMARY | 1 | const | 1 |
  HP set current: INSERT INTO current_object (zoid, tid) SELECT zoid, %s FROM temp_store
           ON DUPLICATE KEY UPDATE tid = VALUES(tid)
    1 | SIMPLE | temp_store | index | None | PRIMARY | 8 | None | 29 | Using index
  HF move states: INSERT INTO object_state (...) SELECT zoid, %s, ... FROM temp_store
           WHERE state IS NOT NULL ON DUPLICATE KEY UPDATE tid = VALUES(tid), ...
    1 | SIMPLE | temp_store | ALL | None | None | None | None | 29 | Using where
  HF delete removed: DELETE s FROM temp_store t STRAIGHT_JOIN object_state s
           ON s.zoid = t.zoid WHERE t.state IS NULL
    1 | SIMPLE | t | ALL | PRIMARY | None | None | None | 29 | Using where
    1 | SIMPLE | s | eq_ref | PRIMARY | PRIMARY | 8 | <db>.t.zoid | 1 |

(29 staged rows against 200 stored objects; every permanent table is reached by its
primary key or the tid index, never scanned.)
"""
from zodbsql.backends.mysql.adapter import MySQLBackend
from zodbsql.backends.mysql.options import MySQLOptions

__all__ = ["MySQLBackend", "MySQLOptions"]
