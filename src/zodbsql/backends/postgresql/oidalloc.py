"""Oids from a PostgreSQL sequence.

``nextval`` is atomic, takes no lock other sessions wait for and is not rolled back, so
allocating oids never joins a commit's transaction nor leaves one open.
"""
from __future__ import annotations

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.oidalloc import BLOCK, OidAllocator


ALLOCATE = "SELECT nextval('zoid_seq') FROM generate_series(1, %s)"
# Raise the sequence when a copied/restored oid is at or above the next it gives.  Not
# atomic with a concurrent nextval, but it only ever moves the sequence up past oids
# already in use.  A sequence never called (a new or zapped database) gives last_value
# itself next, so its highest given is one less (``is_called`` false).
RAISE_TO = ("SELECT setval('zoid_seq', %s) FROM zoid_seq"
            " WHERE last_value - (NOT is_called)::int < %s")


class PostgreSQLOidAllocator(OidAllocator):
    # A row of ``nextval`` per oid: a block's cost grows with it, and allocating takes
    # no write transaction to make durable.
    largest_block = 4096

    def allocate(self, conn: ConnectionRole, count: int = BLOCK) -> list[int]:
        return sorted(int(row[0]) for row in conn.fetchall(ALLOCATE, (count,)))

    def ensure_above(self, conn: ConnectionRole, oid: int) -> None:
        conn.fetchall(RAISE_TO, (oid, oid))
