"""SQLite's capabilities: TEMP tables keep their rows, and a commit holds the only
write lock from vote on (BEGIN IMMEDIATE)."""
from zodbsql.backends.base.features import Features


class SQLiteFeatures(Features):
    writes_at_vote = True
