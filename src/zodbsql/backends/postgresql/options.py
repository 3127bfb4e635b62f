"""The PostgreSQL backend's settings: the ``<postgresql>`` section, ``postgresql://`` URLs."""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar
from urllib.parse import SplitResult, urlencode, urlunsplit

from zodbsql.backends.postgresql.connections import DRIVERS
from zodbsql.errors import ConfigurationError
from zodbsql.masking import mask_secrets
from zodbsql.options import BackendOptions, setting


#: Values of ``toast-compression``: a method, or the server's own default.
TOAST_COMPRESSIONS = ("lz4", "pglz", "server")


@dataclasses.dataclass(frozen=True)
class PostgreSQLOptions(BackendOptions):
    """Which server, database and schema; which driver implementation."""

    dsn: str = setting(
        in_query=False,
        doc='libpq connection string or URL, e.g. "host=db dbname=zodb user=zodb" or'
            ' "postgresql://zodb@db/zodb".')
    schema: str | None = setting(
        None, doc="The schema that holds the tables (default: the server's search_path,"
                  " usually public).  It must exist.")
    driver: str = setting(
        "auto", doc="auto (psycopg picks its C, binary or pure-Python implementation), or"
                    " psycopg-c, psycopg-binary, psycopg-python to require one.")
    replica_dsns: str | None = setting(
        None, doc="Hot standbys that serve polls and loads: one or more libpq connection"
                  " strings or URLs separated by ';'.  A snapshot is read from one server"
                  " only, never older than this process's last commit (else from the"
                  " primary).")
    replica_max_lag: float = setting(
        5.0, doc="Seconds of replay lag above which a standby is skipped and its reads go"
                 " to the primary.")
    listen_for_commits: bool = setting(
        True, doc="One session per storage LISTENs for the commits of its schema, so a"
                  " transaction start sends no statement while nothing was committed"
                  " (history-free: the start after ZODB's poll at the end of the last"
                  " transaction, whose read transaction is still open; false: poll at"
                  " every start).  Another process's commit is seen once its"
                  " notification has arrived, normally within a millisecond.")
    failover_dsns: str | None = setting(
        None, doc="More primaries, tried in order when the one dsn names is down or in"
                  " recovery (a promoted standby takes over): connection strings or URLs"
                  " separated by ';'.")

    toast_compression: str = setting(
        "lz4", doc="How the server compresses a state too large to keep in its row (over"
                   " ~2 KB: a BTree's inner node, a large container): lz4 (where the server"
                   " has it; PostgreSQL 14 and newer), pglz, or server (its"
                   " default_toast_compression).  lz4 compresses several times faster,"
                   " into 5 to 10% more room.")

    #: sslmode, connect_timeout, ... in a URL stay in the DSN, for libpq.
    keeps_other_query: ClassVar[bool] = True

    def __repr__(self) -> str:
        return (f"PostgreSQLOptions(dsn={mask_secrets(self.dsn)!r}, schema={self.schema!r},"
                f" driver={self.driver!r},"
                f" replica_dsns={[mask_secrets(d) for d in self.replicas]!r},"
                f" replica_max_lag={self.replica_max_lag!r},"
                f" listen_for_commits={self.listen_for_commits!r},"
                f" failover_dsns={[mask_secrets(d) for d in self.failovers]!r},"
                f" toast_compression={self.toast_compression!r})")

    @property
    def replicas(self) -> tuple[str, ...]:
        """The standbys' DSNs, in order."""
        return dsn_list(self.replica_dsns)

    @property
    def failovers(self) -> tuple[str, ...]:
        """The primaries after ``dsn``, in order."""
        return dsn_list(self.failover_dsns)

    def __post_init__(self) -> None:
        if not self.dsn or not self.dsn.strip():
            raise ConfigurationError(
                "postgresql needs a dsn, e.g. 'host=localhost dbname=zodb' or"
                " 'postgresql://user@host/dbname'")
        if self.schema is not None and not self.schema:
            raise ConfigurationError("postgresql schema must not be empty")
        for key, value in (("replica-dsns", self.replica_dsns),
                           ("failover-dsns", self.failover_dsns)):
            if value is not None and not dsn_list(value):
                raise ConfigurationError(f"postgresql {key} names no server: {value!r}")
        if self.toast_compression not in TOAST_COMPRESSIONS:
            raise ConfigurationError(
                f"postgresql toast-compression must be one of {', '.join(TOAST_COMPRESSIONS)},"
                f" got {self.toast_compression!r}")
        if self.replica_max_lag <= 0:
            raise ConfigurationError(
                f"replica-max-lag must be a positive number of seconds, got {self.replica_max_lag}")
        if self.driver not in DRIVERS:
            raise ConfigurationError(
                f"postgresql driver must be one of {', '.join(DRIVERS)}, got {self.driver!r}")

    @classmethod
    def from_url(cls, url: SplitResult, query: dict[str, Any],
                 other: list[tuple[str, str]]) -> "PostgreSQLOptions":
        """The DSN is the URL without zodbsql's settings."""
        dsn = urlunsplit(("postgresql", url.netloc, url.path, urlencode(other), ""))
        return cls(dsn=dsn, **query)


def dsn_list(value: str | None) -> tuple[str, ...]:
    """DSNs separated by ';' (empty items dropped)."""
    return tuple(part.strip() for part in (value or "").split(";") if part.strip())
