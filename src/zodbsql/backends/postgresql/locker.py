"""PostgreSQL locking: row locks in vote, a one-row lock in finish.

Vote locks the current rows of the objects it changes (``FOR UPDATE``) and of the
objects it read-current (``FOR SHARE``), each in oid order, and then runs the portable
conflict query; two commits on disjoint objects never wait for each other.  Finish
locks ``commit_row`` (``FOR UPDATE``) for the short step that allocates the tid, moves
the staged states and commits, so tids are made visible in increasing order.  Every
wait is bounded by ``lock_timeout``, set per transaction from ``commit-lock-timeout``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from zodbsql.backends.base.locker import Locker
from zodbsql.errors import CommitLockTimeout

if TYPE_CHECKING:
    from zodbsql.backends.base.connections import DBConnection

HP_LOCK_STAGED = (
    "SELECT c.zoid FROM current_object c JOIN temp_store t ON t.zoid = c.zoid"
    " ORDER BY c.zoid FOR UPDATE OF c")
HF_LOCK_STAGED = (
    "SELECT c.zoid FROM object_state c JOIN temp_store t ON t.zoid = c.zoid"
    " ORDER BY c.zoid FOR UPDATE OF c")
HP_LOCK_READ = (
    "SELECT zoid FROM current_object WHERE zoid = ANY(%s)"
    " AND zoid NOT IN (SELECT zoid FROM temp_store) ORDER BY zoid FOR SHARE")
HF_LOCK_READ = (
    "SELECT zoid FROM object_state WHERE zoid = ANY(%s)"
    " AND zoid NOT IN (SELECT zoid FROM temp_store) ORDER BY zoid FOR SHARE")
BEGIN_WITH_TIMEOUT = "BEGIN; SET LOCAL lock_timeout = {millis}"
LOCK_COMMIT = "SELECT last_tid FROM commit_row FOR UPDATE"


class PostgreSQLLocker(Locker):
    _row_wait = 0.0

    def begin_commit(self, conn: "DBConnection", timeout: float) -> None:
        # One round trip: open the transaction and bound its lock waits.
        self._row_wait = timeout
        millis = max(1, int(timeout * 1000))
        conn.execute(BEGIN_WITH_TIMEOUT.format(millis=millis))
        conn.in_transaction = True

    def lock_objects(self, conn: "DBConnection", read_current: dict[int, int],
                     ) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
        hp = self.keep_history
        try:
            conn.fetchall(HP_LOCK_STAGED if hp else HF_LOCK_STAGED)
            if read_current:
                conn.fetchall(HP_LOCK_READ if hp else HF_LOCK_READ, (sorted(read_current),))
        except CommitLockTimeout as exc:
            if "deadlock" in str(exc):
                raise
            raise CommitLockTimeout(
                f"another commit held the row lock of an object this one changes or"
                f" read-current for longer than row-lock-timeout ({self._row_wait:g}s);"
                " the transaction can be retried") from exc
        return super().lock_objects(conn, read_current)

    def lock_commit(self, conn: "DBConnection", timeout: float) -> None:
        conn.fetchall(LOCK_COMMIT)
