"""SQLite stages commits in TEMP tables, which take no lock on the database file."""
from zodbsql.backends.base.mover import Mover

CREATE_TEMP_TABLES = (
    "CREATE TEMP TABLE IF NOT EXISTS temp_store (zoid INTEGER PRIMARY KEY,"
    " prev_tid INTEGER NOT NULL, data_tid INTEGER, checksum INTEGER,"
    " state_size INTEGER NOT NULL, state BLOB, refs TEXT)",
    "CREATE TEMP TABLE IF NOT EXISTS temp_blob (zoid INTEGER PRIMARY KEY, content_hash BLOB NOT NULL)",
)


class SQLiteMover(Mover):
    CREATE_TEMP_TABLES = CREATE_TEMP_TABLES
    # Under the oldest default limit on a statement's variables (999), with room for
    # the other parameters of a prefetch.
    MAX_LISTED_OIDS = 990
