"""SQLite's capabilities: the portable answers (TEMP tables keep their rows)."""
from zodbsql.backends.base.features import Features


class SQLiteFeatures(Features):
    pass
