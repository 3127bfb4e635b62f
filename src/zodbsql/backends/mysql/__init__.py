"""MySQL and MariaDB (InnoDB): a server shared by processes on many machines.

Design note (EXPLAIN output below is pasted from MariaDB 10.11; see the end).
"""
from zodbsql.backends.mysql.adapter import MySQLBackend, MySQLOptions

__all__ = ["MySQLBackend", "MySQLOptions"]
