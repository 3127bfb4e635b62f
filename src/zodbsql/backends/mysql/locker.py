"""InnoDB row locks: vote locks the changed rows in oid order, finish locks commit_row.

Commit connections run at READ COMMITTED, where a locking read sees the newest committed
row, so the conflict check is the locking read itself.  No WHERE filters the locking
read of the staged rows: at READ COMMITTED InnoDB releases the locks of rows a WHERE
rejects, so every staged row is read (and kept locked) and the conflicts are picked out
in Python.

Why no two commits can wait for each other in a cycle (the same argument as
PostgreSQL's, see backends/postgresql/locker.py):

0. Vote first share-locks the pack gate (a meta row), holding no other lock; a pack
   batch that deletes objects locks it for update first, so it waits for every commit
   between vote and finish (whose new references it could not see yet).
1. Vote waits for row locks only while locking the staged rows, exclusively and in
   ascending oid order (the LEFT JOIN is driven by temp_store's primary key).
2. The rows read-current are then share-locked with NOWAIT: a row another commit holds
   for writing is a read conflict at once (``ReadConflictError``), never a wait.
3. After that a commit waits only for ``commit_row``, whose holder is in finish and
   writes only rows it locked itself (or new ones: at READ COMMITTED InnoDB takes no gap
   locks, so inserting new oids waits for nobody).
4. A pack batch, once it holds the gate, locks the rows it deletes with SKIP LOCKED
   (never waiting) before it takes the commit lock.

On Galera these locks hold on one node only: a commit on another node that writes the
same rows is caught by certification instead, and the later of the two is rolled back
(error 1213, a retryable ``DatabaseConflict``).  Every commit updates ``commit_row``, so
any two commits that did not see each other conflict there.  The locking reads are
causal reads (``conn.causal``): the node first applies what the cluster committed, so
a conflict with an already committed transaction is still found in vote (and resolved
by conflict resolution when it can be), and certification only settles commits that
truly overlap in time.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from ZODB.POSException import ReadConflictError

from zodbsql.backends.base.contract import Conflict, ConnectionRole
from zodbsql.backends.base.locker import Locker
from zodbsql.backends.base.statements import in_list
from zodbsql.backends.mysql.connections import MySQLConnection, prepare_for_writing
from zodbsql.errors import CommitLockTimeout, RowLockTimeout

HP_LOCK_STAGED = (
    "SELECT t.zoid, t.prev_tid, COALESCE(c.tid, 0) FROM temp_store t"
    " LEFT JOIN current_object c ON c.zoid = t.zoid ORDER BY t.zoid FOR UPDATE")
HF_LOCK_STAGED = (
    "SELECT t.zoid, t.prev_tid, COALESCE(c.tid, 0) FROM temp_store t"
    " LEFT JOIN object_state c ON c.zoid = t.zoid ORDER BY t.zoid FOR UPDATE")
# {lock}: the server's spelling of a share lock without waiting (MySQLConnection).
HP_LOCK_READ_CURRENT = (
    "SELECT zoid, tid FROM current_object WHERE zoid IN ({oids}) ORDER BY zoid {lock}")
HF_LOCK_READ_CURRENT = (
    "SELECT zoid, tid FROM object_state WHERE zoid IN ({oids}) ORDER BY zoid {lock}")
HP_LOCK_FOR_PACK = (
    "SELECT zoid FROM current_object WHERE zoid IN ({oids}) ORDER BY zoid"
    " FOR UPDATE SKIP LOCKED")
HF_LOCK_FOR_PACK = (
    "SELECT zoid FROM object_state WHERE zoid IN ({oids}) ORDER BY zoid"
    " FOR UPDATE SKIP LOCKED")
LOCK_COMMIT = "SELECT last_tid FROM commit_row WHERE id = 0 FOR UPDATE"
# The pack gate (see PostgreSQL's locker for why): a meta row every voting commit
# share-locks and a pack batch that deletes objects locks for update.
SHARE_PACK_GATE = "SELECT value FROM zodbsql_meta WHERE name = 'pack_gate' LOCK IN SHARE MODE"
CLOSE_PACK_GATE = "SELECT value FROM zodbsql_meta WHERE name = 'pack_gate' FOR UPDATE"
#: Oids per locking read of read-current rows.
CHUNK = 500


class MySQLLocker(Locker):
    HISTORY_PRESERVING = dataclasses.replace(
        Locker.HISTORY_PRESERVING, find_conflicts=HP_LOCK_STAGED,
        lock_read_current=HP_LOCK_READ_CURRENT, lock_for_pack=HP_LOCK_FOR_PACK)
    HISTORY_FREE = dataclasses.replace(
        Locker.HISTORY_FREE, find_conflicts=HF_LOCK_STAGED,
        lock_read_current=HF_LOCK_READ_CURRENT, lock_for_pack=HF_LOCK_FOR_PACK)
    # On Galera the conflict query is also the causal read that applies other nodes'
    # commits before this one allocates its tid: an empty commit keeps it.
    skip_empty_lock: ClassVar[bool] = False

    def begin_commit(self, conn: ConnectionRole, timeout: float) -> None:
        prepare_for_writing(conn, timeout)  # no statement when already set
        conn.begin_write()

    def lock_objects(self, conn: ConnectionRole, read_current: dict[int, int],
                     ) -> tuple[list[Conflict], list[Conflict]]:
        assert isinstance(conn, MySQLConnection)
        try:
            conn.fetchone(SHARE_PACK_GATE)
        except CommitLockTimeout as exc:
            raise CommitLockTimeout(
                "a pack batch held the pack gate for longer than row-lock-timeout"
                " (default: commit-lock-timeout); the transaction can be retried") from exc
        try:
            # Causal on Galera: rows committed on other nodes are applied here first.
            rows = conn.fetchall(conn.causal + self.sql.find_conflicts)
        except CommitLockTimeout as exc:
            raise RowLockTimeout(
                "another commit held the row lock of an object this one changes for"
                " longer than row-lock-timeout (default: commit-lock-timeout;"
                f" {conn.lock_timeout}s,"
                " applied as innodb_lock_wait_timeout); the transaction can be retried"
            ) from exc
        conflicts = [Conflict(int(o), int(e), int(a)) for o, e, a in rows if int(e) != int(a)]
        read_conflicts: list[Conflict] = []
        if read_current:
            current = self._share_lock(conn, sorted(read_current))
            for oid in sorted(read_current):
                actual = current.get(oid, 0)
                if actual != read_current[oid]:
                    read_conflicts.append(Conflict(oid, read_current[oid], actual))
        return conflicts, read_conflicts

    def _share_lock(self, conn: ConnectionRole, oids: list[int]) -> dict[int, int]:
        assert isinstance(conn, MySQLConnection)
        lock = conn.share_lock_nowait
        current: dict[int, int] = {}
        for start in range(0, len(oids), CHUNK):
            chunk = oids[start:start + CHUNK]
            query = self.sql.lock_read_current.format(oids=in_list(len(chunk)), lock=lock)
            try:
                rows = conn.fetchall(query, chunk)
            except CommitLockTimeout as exc:
                # A NOWAIT read never times out: it met a row another commit is writing.
                raise ReadConflictError(
                    "another commit is changing an object this transaction read-current"
                    " (checkCurrentSerialInTransaction); the transaction can be retried"
                ) from exc
            current.update((int(o), int(t)) for o, t in rows)
        return current

    def wait_for_voted_commits(self, conn: ConnectionRole) -> None:
        conn.fetchone(CLOSE_PACK_GATE)

    def lock_for_pack(self, conn: ConnectionRole, oids: list[int]) -> list[int]:
        locked: list[int] = []
        for start in range(0, len(oids), CHUNK):
            chunk = oids[start:start + CHUNK]
            query = self.sql.lock_for_pack.format(oids=in_list(len(chunk)))
            locked.extend(int(row[0]) for row in conn.fetchall(query, chunk))
        return locked

    def lock_commit(self, conn: ConnectionRole, timeout: float) -> int | None:
        assert isinstance(conn, MySQLConnection)
        row = conn.fetchone(conn.causal + LOCK_COMMIT)
        return int(row[0]) if row else 0
