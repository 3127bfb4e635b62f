"""SQLite stages commits in TEMP tables, which take no lock on the database file."""
import dataclasses

from zodbsql.backends.base.mover import Mover

CREATE_TEMP_TABLES = (
    "CREATE TEMP TABLE IF NOT EXISTS temp_store (zoid INTEGER PRIMARY KEY,"
    " prev_tid INTEGER NOT NULL, data_tid INTEGER, checksum INTEGER, state_size INTEGER NOT NULL, state BLOB)",
    "CREATE TEMP TABLE IF NOT EXISTS temp_ref (zoid INTEGER NOT NULL, to_zoid INTEGER NOT NULL)",
    "CREATE TEMP TABLE IF NOT EXISTS temp_blob (zoid INTEGER PRIMARY KEY, content_hash BLOB NOT NULL)",
)

# History-free, a commit replaces only the references that changed: a BTree node's new
# revision keeps nearly all its children, and deleting them all to insert them again
# rewrote every page of them in each commit.  (WHERE true: an INSERT ... SELECT
# followed by ON CONFLICT needs it to parse.)
HF_DELETE_OLD_REFS = (
    "DELETE FROM object_ref WHERE zoid IN (SELECT zoid FROM temp_store)"
    " AND (zoid, to_zoid) NOT IN (SELECT zoid, to_zoid FROM temp_ref)")
HF_MOVE_REFS = ("INSERT INTO object_ref (zoid, to_zoid) SELECT zoid, to_zoid FROM temp_ref"
                " WHERE true ON CONFLICT (zoid, to_zoid) DO NOTHING")


class SQLiteMover(Mover):
    CREATE_TEMP_TABLES = CREATE_TEMP_TABLES
    HISTORY_FREE = dataclasses.replace(
        Mover.HISTORY_FREE, delete_old_refs=HF_DELETE_OLD_REFS, move_refs=HF_MOVE_REFS)
    # Under the oldest default limit on a statement's variables (999), with room for
    # the other parameters of a prefetch.
    MAX_LISTED_OIDS = 990
