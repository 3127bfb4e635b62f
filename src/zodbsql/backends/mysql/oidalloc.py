"""Oids from the counter row in one autocommitted statement.

``LAST_INSERT_ID(expr)`` makes the UPDATE return the new counter in its OK packet, so a
block costs one round trip and the row lock is held only for that statement.
"""
from __future__ import annotations

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.oidalloc import OidAllocator
from zodbsql.backends.mysql.connections import MySQLConnection

ADVANCE = "UPDATE oid_counter SET last_oid = LAST_INSERT_ID(last_oid + %s) WHERE id = 0"


class MySQLOidAllocator(OidAllocator):
    def allocate(self, conn: ConnectionRole, count: int = 16) -> list[int]:
        assert isinstance(conn, MySQLConnection)
        last = conn.execute_insert_id(ADVANCE, (count,))
        return list(range(last - count + 1, last + 1))
