"""PostgreSQL packs with TEMPORARY work tables: pack uses one connection throughout."""
from zodbsql.backends.base.packer import Packer

CREATE_WORK_TABLES = (
    "CREATE TEMPORARY TABLE IF NOT EXISTS pack_object (zoid BIGINT PRIMARY KEY,"
    " keep_tid BIGINT NOT NULL, old_count BIGINT NOT NULL)",
    "CREATE TEMPORARY TABLE IF NOT EXISTS pack_reach (zoid BIGINT PRIMARY KEY,"
    " gen INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS pack_reach_gen ON pack_reach (gen)",
)


class PostgreSQLPacker(Packer):
    CREATE_WORK_TABLES = CREATE_WORK_TABLES
