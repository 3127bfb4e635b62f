"""SQLite's capabilities."""
from zodbsql.backends.base.features import Features


class SQLiteFeatures(Features):
    supports_parallel_commit = False
    supports_row_locks = False
    has_native_upsert = True
    is_networked = False
    is_single_file = True
    # SQLite's default SQLITE_MAX_LENGTH.
    max_state_size = 1_000_000_000
