"""SQLite's oid blocks: the counter's advance is not synced on its own.

An allocation outside a commit (ZODB asks for new oids while it stores, before the
vote takes the commit's write transaction) is a write transaction of its own, and with
``synchronous full`` its COMMIT synced the log (the allocation's median 1.9 ms in
``scripts/add_budget.py`` on a slow day, 1.1 without the sync).  The advance needs no
sync of its own.  In WAL mode the log is written in order, so the next synced commit,
of any process, syncs the advance with it; before that no commit that is durable holds
one of the block's oids.  Lost with the power before then, it is lost with every state
that used its oids, and the counter hands them out again to states never stored.  So
it commits with ``synchronous normal`` (``SQLiteConnection.unsynced_commits``).
"""
from __future__ import annotations

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.oidalloc import BLOCK, OidAllocator
from zodbsql.backends.sqlite.connections import SQLiteConnection


class SQLiteOidAllocator(OidAllocator):
    def allocate(self, conn: ConnectionRole, count: int = BLOCK) -> list[int]:
        """As the portable allocation; in a transaction of its own, committed unsynced."""
        if conn.in_transaction or not isinstance(conn, SQLiteConnection):
            return super().allocate(conn, count)    # a commit's: synced with it
        with conn.unsynced_commits():
            return super().allocate(conn, count)
