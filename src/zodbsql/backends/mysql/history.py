"""The commit row is read by the locking read that takes the commit lock (locker.py)."""
from __future__ import annotations

from zodbsql.backends.base.connections import DBConnection
from zodbsql.backends.base.history import History


class MySQLHistory(History):
    def read_last_tid(self, conn: DBConnection) -> int:
        locked = getattr(conn, "locked_last_tid", None)
        if locked is not None:   # read under the commit lock in this transaction
            return locked
        return super().read_last_tid(conn)
