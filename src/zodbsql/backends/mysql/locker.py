"""InnoDB row locks: vote locks the changed rows in oid order, finish locks commit_row.

Commit connections run at READ COMMITTED, where a locking read sees the newest committed
row, so the conflict check is the locking read itself.  No WHERE filters the locking
reads: at READ COMMITTED InnoDB releases the locks of rows a WHERE rejects, so every
staged row is read (and kept locked) and the conflicts are picked out in Python.
"""
from __future__ import annotations

from zodbsql.backends.base.connections import DBConnection
from zodbsql.backends.base.locker import Locker
from zodbsql.backends.mysql.connections import prepare_for_writing

# The LEFT JOIN is driven by temp_store in primary key order: rows are locked by oid.
HP_LOCK_STAGED = (
    "SELECT t.zoid, t.prev_tid, COALESCE(c.tid, 0) FROM temp_store t"
    " LEFT JOIN current_object c ON c.zoid = t.zoid ORDER BY t.zoid FOR UPDATE")
HF_LOCK_STAGED = (
    "SELECT t.zoid, t.prev_tid, COALESCE(c.tid, 0) FROM temp_store t"
    " LEFT JOIN object_state c ON c.zoid = t.zoid ORDER BY t.zoid FOR UPDATE")
HP_LOCK_READ_CURRENT = (
    "SELECT zoid, tid FROM current_object WHERE zoid IN ({oids}) ORDER BY zoid"
    " LOCK IN SHARE MODE")
HF_LOCK_READ_CURRENT = (
    "SELECT zoid, tid FROM object_state WHERE zoid IN ({oids}) ORDER BY zoid"
    " LOCK IN SHARE MODE")
LOCK_COMMIT = "SELECT last_tid FROM commit_row WHERE id = 0 FOR UPDATE"


class MySQLLocker(Locker):
    def begin_commit(self, conn: DBConnection, timeout: float) -> None:
        prepare_for_writing(conn, timeout)  # no statement when already set
        conn.begin_write()

    def lock_objects(self, conn: DBConnection, read_current: dict[int, int],
                     ) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
        sql = HP_LOCK_STAGED if self.keep_history else HF_LOCK_STAGED
        conflicts = [(int(o), int(e), int(a)) for o, e, a in conn.fetchall(sql)
                     if int(e) != int(a)]
        read_conflicts: list[tuple[int, int, int]] = []
        if read_current:
            # A second, share-locked pass; the two passes are each in oid order, so a
            # deadlock needs crossing read-current sets and ends in a retryable
            # DeadlockError rather than a hang.
            template = HP_LOCK_READ_CURRENT if self.keep_history else HF_LOCK_READ_CURRENT
            oids = sorted(read_current)
            current: dict[int, int] = {}
            for start in range(0, len(oids), 500):
                chunk = oids[start:start + 500]
                query = template.format(oids=", ".join(["%s"] * len(chunk)))
                current.update((int(o), int(t)) for o, t in conn.fetchall(query, chunk))
            for oid in oids:
                actual = current.get(oid, 0)
                if actual != read_current[oid]:
                    read_conflicts.append((oid, read_current[oid], actual))
        return conflicts, read_conflicts

    def lock_commit(self, conn: DBConnection, timeout: float) -> None:
        row = conn.fetchone(LOCK_COMMIT)
        # Finish reads the last tid next: MySQLHistory answers from this locking read.
        conn.locked_last_tid = int(row[0]) if row else 0  # type: ignore[attr-defined]
