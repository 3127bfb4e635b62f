"""PostgreSQL's capabilities."""
from zodbsql.backends.base.features import Features


class PostgreSQLFeatures(Features):
    # The staging tables are ON COMMIT DELETE ROWS (mover.py).
    staging_emptied_by_transaction_end = True
