"""SQLite packs with TEMP work tables, so the reachability walk never blocks a writer."""
from zodbsql.backends.base.packer import Packer

CREATE_WORK_TABLES = (
    "CREATE TEMP TABLE IF NOT EXISTS pack_object (zoid INTEGER PRIMARY KEY,"
    " keep_tid INTEGER NOT NULL, old_count INTEGER NOT NULL)",
    "CREATE TEMP TABLE IF NOT EXISTS pack_reach (zoid INTEGER PRIMARY KEY, gen INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS temp.pack_reach_gen ON pack_reach (gen)",
)


class SQLitePacker(Packer):
    CREATE_WORK_TABLES = CREATE_WORK_TABLES
