"""The database server's own deadlock counter, read before and after a workload.

PostgreSQL counts deadlocks per database (``pg_stat_database.deadlocks``), MySQL and
MariaDB for the whole server (``Innodb_deadlocks``).  A storage without a server (SQLite,
FileStorage, ZEO) has no such counter: ``counter_for`` returns None.

PostgreSQL's figure lags: a session adds its deadlocks to the shared statistics when
it goes idle (at most once a second, otherwise within ``PGSTAT_IDLE_INTERVAL``, 10 s)
or when it ends.  ``settled`` therefore polls until the figure stops moving; callers
end the sessions of the workload first where they can, so nothing is left pending.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

PG_DEADLOCKS = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
MYSQL_DEADLOCKS = "SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'"
#: How long PostgreSQL's figure must stay the same before it counts as settled, and
#: how long ``settled`` waits at most (a session's idle flush comes within 10 s).
STABLE_SECONDS = 1.0
SETTLE_LIMIT = 12.0


@dataclass(frozen=True)
class DeadlockCounter:
    """How to read one server's counter: zodbsql backend options of that database
    (PostgreSQLOptions or MySQLOptions); picklable, so it travels with a contender."""

    options: Any

    @property
    def server(self) -> str:
        return "postgresql" if hasattr(self.options, "dsn") else "mysql"

    @property
    def scope(self) -> str:
        return "database" if self.server == "postgresql" else "server"

    def read(self) -> int:
        # A new session every time: PostgreSQL keeps statistics read inside one
        # transaction as they were (stats_fetch_consistency = cache).
        conn = self.options.create_backend(True, 30.0).connect()
        try:
            if self.server == "postgresql":
                row = conn.fetchone(PG_DEADLOCKS)
                return int(row[0]) if row and row[0] is not None else 0
            row = conn.fetchone(MYSQL_DEADLOCKS)
            return int(row[1]) if row else 0
        finally:
            conn.close()

    def settled(self, poll: float = 0.25) -> int:
        """The counter once it stopped moving (MySQL's is current at once)."""
        value = self.read()
        if self.server != "postgresql":
            return value
        deadline = time.monotonic() + SETTLE_LIMIT
        stable_since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(poll)
            now = self.read()
            if now != value:
                value, stable_since = now, time.monotonic()
            elif time.monotonic() - stable_since >= STABLE_SECONDS:
                break
        return value


def counter_for_options(options: Any) -> DeadlockCounter | None:
    """The counter of a zodbsql database given by its backend options (None: SQLite)."""
    from zodbsql.backends.mysql.options import MySQLOptions
    from zodbsql.backends.postgresql.options import PostgreSQLOptions
    if isinstance(options, (PostgreSQLOptions, MySQLOptions)):
        return DeadlockCounter(options)
    return None


def counter_for(storage: Any) -> DeadlockCounter | None:
    """The counter of an open storage's server: zodbsql on PostgreSQL or MySQL, or
    RelStorage on PostgreSQL; None for anything else."""
    backend = getattr(storage, "backend", None)
    if backend is not None and type(backend).__module__.startswith("zodbsql."):
        return counter_for_options(backend.options)
    adapter = getattr(storage, "_adapter", None)
    dsn = getattr(adapter, "_dsn", None)
    if type(adapter).__module__.startswith("relstorage.adapters.postgresql") \
            and isinstance(dsn, str):
        from zodbsql.backends.postgresql.options import PostgreSQLOptions
        return DeadlockCounter(PostgreSQLOptions(dsn=dsn))
    return None
