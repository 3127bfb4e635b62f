"""PostgreSQL's capabilities."""
from zodbsql.backends.base.features import Features


class PostgreSQLFeatures(Features):
    supports_parallel_commit = True
    supports_row_locks = True
    has_native_upsert = True
    is_networked = True
    is_single_file = False
    # BYTEA values are limited to 1 GB.
    max_state_size = (1 << 30) - 1
    staging_emptied_by_transaction_end = True
