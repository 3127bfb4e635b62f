"""MySQL/MariaDB (InnoDB) capabilities."""
from zodbsql.backends.base.features import Features


class MySQLFeatures(Features):
    supports_parallel_commit = True
    supports_row_locks = True
    has_native_upsert = True   # INSERT ... ON DUPLICATE KEY UPDATE
    is_networked = True
    is_single_file = False
    # Set from the server's max_allowed_packet when a connection is opened.
    max_state_size: int | None = None
    supports_multiple_statements = False
    #: The clause of a locking read that share-locks without waiting (set at connect).
    share_lock_nowait = "LOCK IN SHARE MODE NOWAIT"
