"""zodbsql: a ZODB storage in SQLite, PostgreSQL or MySQL/MariaDB.

Open a storage from Python::

    import zodbsql
    db = zodbsql.open_db("sqlite:///var/Data.sqlite")
    storage = zodbsql.open_storage("sqlite:///var/Data.sqlite", keep_history=False)

or configure it with ZConfig (``%import zodbsql`` and a ``<zodbsql>`` section) or with a
zodburi URI (``zodbsql+sqlite:///var/Data.sqlite``,
``zodbsql+postgresql://user@host/dbname?schema=zodb``).
"""
from zodbsql.api import open_db, open_storage
from zodbsql.backends.mysql.options import MySQLOptions
from zodbsql.backends.postgresql.options import PostgreSQLOptions
from zodbsql.backends.sqlite.options import SQLiteOptions
from zodbsql.errors import (CommitLockTimeout, ConfigurationError, CorruptRecordError,
                            DatabaseError, RowLockTimeout, SchemaError, ZodbsqlError)
from zodbsql.options import Options
from zodbsql.storage import SQLStorage

__all__ = ["open_db", "open_storage", "Options", "SQLiteOptions",
           "PostgreSQLOptions", "MySQLOptions", "SQLStorage", "ZodbsqlError",
           "ConfigurationError", "SchemaError", "DatabaseError", "CommitLockTimeout",
           "RowLockTimeout", "CorruptRecordError"]
