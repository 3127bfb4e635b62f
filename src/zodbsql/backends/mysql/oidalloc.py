"""Oids from the counter row in one autocommitted statement.

``LAST_INSERT_ID(expr)`` makes the UPDATE return the new counter in its OK packet, so a
block costs one round trip and the row lock is held only for that statement.

On Galera two nodes may advance the counter at once; certification lets one of them
through and rolls the other back (error 1213, nothing applied), so the statement, a
causal one there, is sent again (unless it ran inside a commit's transaction, which
the rollback ended: the commit is retried as a whole).
"""
from __future__ import annotations

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.oidalloc import BLOCK, OidAllocator
from zodbsql.backends.mysql.connections import MySQLConnection
from zodbsql.errors import DatabaseConflict

ADVANCE = "UPDATE oid_counter SET last_oid = LAST_INSERT_ID(last_oid + %s) WHERE id = 0"
#: Attempts at advancing the counter on Galera before the conflict is raised.
ATTEMPTS = 10


class MySQLOidAllocator(OidAllocator):
    def allocate(self, conn: ConnectionRole, count: int = BLOCK) -> list[int]:
        assert isinstance(conn, MySQLConnection)
        for attempt in range(ATTEMPTS):
            try:
                last = conn.execute_insert_id(conn.causal + ADVANCE, (count,))
                break
            except DatabaseConflict:
                # Inside a commit's transaction the whole transaction was rolled back.
                if attempt + 1 == ATTEMPTS or conn.in_transaction:
                    raise
        if last < count:
            # No row matched: LAST_INSERT_ID was not set, the packet says 0.
            raise self.missing_counter()
        return list(range(last - count + 1, last + 1))
