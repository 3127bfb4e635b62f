"""PostgreSQL packs with TEMPORARY work tables: pack uses one connection throughout.

A batch's oids travel as one binary array (``= ANY``), and old revisions are deleted
set-wise against arrays of (oid, kept tid): an ``IN`` list of a thousand parameters, or
a statement per object, cost the server a parse and the client a dump per oid.
"""
from typing import Any, Sequence

from zodbsql.backends.base.contract import ConnectionRole, Revision
from zodbsql.backends.base.packer import Packer
from zodbsql.backends.postgresql.mover import any_of

CREATE_WORK_TABLES = (
    "CREATE TEMPORARY TABLE IF NOT EXISTS pack_object (zoid BIGINT PRIMARY KEY,"
    " keep_tid BIGINT NOT NULL, old_count BIGINT NOT NULL)",
    "CREATE TEMPORARY TABLE IF NOT EXISTS pack_reach (zoid BIGINT PRIMARY KEY,"
    " gen INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS pack_reach_gen ON pack_reach (gen)",
)

# Autovacuum never analyzes temporary tables, and a prepared statement's generic plan
# guesses that ``tid > $1`` matches a third of the rows: either can make PostgreSQL scan
# millions of rows, some of it under the commit lock.  So the pack's session plans every
# statement for its parameters, and the work tables get statistics once filled.
# The stored tables get fresh statistics too: a database filled since autovacuum last
# looked (a conversion, a bulk import) is otherwise planned as if it were nearly empty.
CUSTOM_PLANS = "SET plan_cache_mode = force_custom_plan"
ANALYZE_WORK_TABLES = "ANALYZE pack_object, pack_reach"
ANALYZE_STORED = "ANALYZE object_state"
#: Revisions older than the one kept, of each (oid, kept tid) in two arrays.
DELETE_OLD = ("DELETE FROM {table} x USING unnest(%b::BIGINT[], %b::BIGINT[]) AS k (zoid, tid)"
              " WHERE x.zoid = k.zoid AND x.tid < k.tid")
OLD_REVISION_TABLES = ("object_state", "blob_ref")
#: A batch of deletions announced, with its record's number, on the channel commits
#: are announced on (``listener.py``), delivered when the batch commits: a listening
#: process polls at its next start and drops what the pack deleted then.  Unannounced
#: (a pack makes no tid), it kept its snapshot until the next commit and paid for every
#: deletion at that start: in the bench, a writer's commit after a pack of 100,000
#: objects took 100 ms more.
ANNOUNCE_GONE = "SELECT pg_notify(zodbsql_channel(), 'gone:' || last_seq) FROM gone_row"


class PostgreSQLPacker(Packer):
    CREATE_WORK_TABLES = CREATE_WORK_TABLES

    def prepare(self, conn: ConnectionRole, pack_tid: int, gc: bool) -> None:
        conn.execute(CUSTOM_PLANS)
        conn.execute(ANALYZE_STORED)
        super().prepare(conn, pack_tid, gc)
        conn.execute(ANALYZE_WORK_TABLES)

    def count(self, conn: ConnectionRole, gc: bool) -> dict[str, int]:
        conn.execute(ANALYZE_WORK_TABLES)  # the walk filled pack_reach
        return super().count(conn, gc)

    def listed(self, oids: Sequence[int]) -> tuple[str, list[Any]]:
        return any_of(oids)

    def record_gone(self, conn: ConnectionRole, oids: Sequence[int]) -> None:
        super().record_gone(conn, oids)
        conn.execute(ANNOUNCE_GONE)

    def delete_old_revisions(self, conn: ConnectionRole, keep: Sequence[Revision]) -> None:
        columns = [[oid for oid, _ in keep], [tid for _, tid in keep]]
        for table in OLD_REVISION_TABLES:
            conn.execute(DELETE_OLD.format(table=table), columns)
