"""Oid allocation: blocks of oids handed out safely across processes.

The base implementation keeps a one-row counter table and advances it by a whole block
in one short write transaction; the storage asks for bigger blocks while a process is
allocating many oids at once, so a 10,000-object commit costs a handful of allocations.
"""
from __future__ import annotations

from zodbsql.backends.base.contract import BackendContract, ConnectionRole
from zodbsql.errors import SchemaError

BLOCK = 16
#: The largest block from the counter, whose advance is one statement whatever the
#: count.  Each allocation outside a commit is a write transaction of its own, on SQLite
#: an fsync: at 4,096, a run of 1,000-object commits paid one every fourth commit
#: (0.27 ms a commit of the 24 its whole took).
MAX_BLOCK = 16384
#: How much the next block grows while oids run out quickly: 16, 1024, then the
#: allocator's largest, so a 1,000-object commit after a pause costs two allocations,
#: and big commits one per largest block; after a pause the storage starts from what
#: the last commit that ran out took, so the next such commit costs one.  (Oids left
#: in a block when a process ends are never used: with 64-bit oids that costs nothing.)
GROWTH = 64
ADVANCE = "UPDATE oid_counter SET last_oid = last_oid + %s"
READ = "SELECT last_oid FROM oid_counter"
RAISE_TO = "UPDATE oid_counter SET last_oid = %s WHERE last_oid < %s"


class OidAllocator:
    """Oid blocks from a one-row counter table (an ``OidAllocatorRole``)."""

    largest_block = MAX_BLOCK

    def __init__(self, backend: BackendContract) -> None:
        self.backend = backend

    def allocate(self, conn: ConnectionRole, count: int = BLOCK) -> list[int]:
        """Reserve ``count`` new oids; runs in (and commits) its own transaction.

        When ``conn`` is already in a write transaction, the block is reserved inside it.
        """
        own = not conn.in_transaction
        if own:
            conn.begin_write()
        try:
            conn.execute(ADVANCE, (count,))
            row = conn.fetchone(READ)
            if row is None:
                raise self.missing_counter()
            if own:
                conn.commit()
        except BaseException:
            if own:
                conn.rollback()
            raise
        last = int(row[0])
        return list(range(last - count + 1, last + 1))

    def missing_counter(self) -> SchemaError:
        """The counter's row is gone: handing out oids from 1 again (as an UPDATE of no
        row and a default would) writes new objects over existing ones."""
        return SchemaError(f"{self.backend.describe()}: the schema is damaged: the oid"
                           " counter (table oid_counter) has no row, so no new oid can"
                           " be handed out without the risk of reusing one in use")

    def ensure_above(self, conn: ConnectionRole, oid: int) -> None:
        """Make sure no oid up to ``oid`` is handed out again (copies bring their own)."""
        conn.execute(RAISE_TO, (oid, oid))
