"""MySQL packs with permanent work tables, one pack per database at a time.

The walk inserts into ``pack_reach`` what ``pack_reach`` doesn't hold yet; MySQL can't
open a TEMPORARY table twice in one statement, so the work tables are ordinary InnoDB
tables, created on first pack and dropped with the schema.  A named lock (released when
the pack's session ends) keeps two processes from sharing them.  The pack session runs
at READ COMMITTED, so its INSERT ... SELECTs take no shared locks on the rows they read.
"""
from __future__ import annotations

from zodbsql.backends.base.connections import DBConnection
from zodbsql.backends.base.packer import Packer
from zodbsql.backends.mysql.connections import prepare_for_writing
from zodbsql.errors import DatabaseError

CREATE_WORK_TABLES = (
    "CREATE TABLE IF NOT EXISTS pack_object (zoid BIGINT NOT NULL PRIMARY KEY,"
    " keep_tid BIGINT NOT NULL, old_count BIGINT NOT NULL) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS pack_reach (zoid BIGINT NOT NULL PRIMARY KEY,"
    " gen BIGINT NOT NULL, KEY pack_reach_gen (gen)) ENGINE=InnoDB",
)
PACK_LOCK = "SELECT GET_LOCK(CONCAT('zodbsql.pack.', DATABASE()), 0)"


class MySQLPacker(Packer):
    CREATE_WORK_TABLES = CREATE_WORK_TABLES

    def prepare(self, conn: DBConnection, pack_tid: int, gc: bool) -> None:
        prepare_for_writing(conn, getattr(self.backend, "lock_timeout", 30))
        row = conn.fetchone(PACK_LOCK)
        if not row or row[0] != 1:
            raise DatabaseError(
                f"another process is packing {self.backend.describe()}; one pack at a time")
        super().prepare(conn, pack_tid, gc)
