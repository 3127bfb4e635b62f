"""PostgreSQL stages commits in TEMPORARY tables: private to the session, never WAL-logged."""
from zodbsql.backends.base.mover import Mover

# ON COMMIT DELETE ROWS: every commit or rollback empties them, so a commit never
# spends statements clearing what the previous one staged.
CREATE_TEMP_TABLES = (
    "CREATE TEMPORARY TABLE IF NOT EXISTS temp_store (zoid BIGINT PRIMARY KEY,"
    " prev_tid BIGINT NOT NULL, data_tid BIGINT, checksum BIGINT,"
    " state_size BIGINT NOT NULL, state BYTEA) ON COMMIT DELETE ROWS",
    "CREATE TEMPORARY TABLE IF NOT EXISTS temp_ref (zoid BIGINT NOT NULL,"
    " to_zoid BIGINT NOT NULL) ON COMMIT DELETE ROWS",
    "CREATE TEMPORARY TABLE IF NOT EXISTS temp_blob (zoid BIGINT PRIMARY KEY,"
    " content_hash BYTEA NOT NULL) ON COMMIT DELETE ROWS",
)


class PostgreSQLMover(Mover):
    CREATE_TEMP_TABLES = CREATE_TEMP_TABLES
