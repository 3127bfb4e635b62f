"""Oids from a PostgreSQL sequence.

``nextval`` is atomic, takes no lock other sessions wait for and is not rolled back, so
allocating oids never joins a commit's transaction nor leaves one open.
"""
from __future__ import annotations

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.oidalloc import BLOCK, OidAllocator


ALLOCATE = "SELECT nextval('zoid_seq') FROM generate_series(1, %s)"
# Raise the sequence when a copied/restored oid is above it.  Not atomic with a
# concurrent nextval, but it only ever moves the sequence up past oids already in use.
RAISE_TO = "SELECT setval('zoid_seq', %s) FROM zoid_seq WHERE last_value < %s"


class PostgreSQLOidAllocator(OidAllocator):
    def allocate(self, conn: ConnectionRole, count: int = BLOCK) -> list[int]:
        return sorted(int(row[0]) for row in conn.fetchall(ALLOCATE, (count,)))

    def ensure_above(self, conn: ConnectionRole, oid: int) -> None:
        conn.fetchall(RAISE_TO, (oid, oid))
