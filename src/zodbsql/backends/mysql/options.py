"""The MySQL/MariaDB backend's settings: the ``<mysql>`` section, ``mysql://`` URLs."""
from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from zodbsql.errors import ConfigurationError
from zodbsql.masking import mask_secrets
from zodbsql.options import BackendOptions, setting

DRIVER_CHOICES = ("auto", "mysqlclient", "pymysql")


@dataclasses.dataclass(frozen=True)
class MySQLOptions(BackendOptions):
    """Where the server is, which database, who logs in, and which driver talks to it."""

    host: str = setting("localhost", in_query=False, doc="The server's host name.")
    port: int = setting(3306, zconfig="port-number", in_query=False,
                        doc="The server's TCP port.")
    unix_socket: str | None = setting(
        None, zconfig="existing-path", doc="Connect through this socket instead of TCP.")
    db: str = setting("", in_query=False, required=True,
                      doc="The database (required); it must exist, zodbsql creates its tables.")
    user: str = setting("root", in_query=False, doc="The login.")
    passwd: str = setting("", in_query=False, repr=False, doc="The login's password.")
    driver: str = setting(
        "auto", doc="auto (mysqlclient if installed, else PyMySQL), mysqlclient or pymysql.")
    replica_dsns: str | None = setting(
        None, repr=False,
        doc="Binlog replicas that serve polls and loads, separated by ';': each host,"
            " host:port or mysql:// URL (user, passwd and db default to the primary's)."
            "  A snapshot is read from one server only, never older than this process's"
            " last commit (else from the primary).")
    replica_max_lag: float = setting(
        5.0, doc="Seconds a replica may be behind (Seconds_Behind_Master) before it is"
                 " skipped and its reads go to the primary.")

    def __post_init__(self) -> None:
        if not self.db:
            raise ConfigurationError("mysql needs a database name (db)")
        if self.driver not in DRIVER_CHOICES:
            raise ConfigurationError(
                f"mysql driver must be one of {', '.join(DRIVER_CHOICES)}, got {self.driver!r}")
        if not 0 < int(self.port) < 65536:
            raise ConfigurationError(f"mysql port must be 1-65535, got {self.port}")
        if self.replica_dsns is not None and not self.replicas:
            raise ConfigurationError(
                f"mysql replica-dsns names no server: {mask_secrets(self.replica_dsns)!r}")
        if self.replica_max_lag <= 0:
            raise ConfigurationError(
                f"replica-max-lag must be a positive number of seconds, got {self.replica_max_lag}")

    @property
    def replicas(self) -> tuple["MySQLOptions", ...]:
        """One options object per replica: the primary's, with the replica's address
        (and whatever its URL names) instead."""
        entries = [part.strip() for part in (self.replica_dsns or "").split(";")]
        return tuple(self._replica(entry) for entry in entries if entry)

    def _replica(self, entry: str) -> "MySQLOptions":
        base = dataclasses.replace(self, replica_dsns=None, unix_socket=None)
        if "://" in entry:
            url = urlsplit(entry)
            if url.scheme != "mysql":
                raise ConfigurationError(
                    f"a mysql replica is host, host:port or a mysql:// URL, got"
                    f" {mask_secrets(entry)!r}")
            overrides = {name: value for name, value in vars(MySQLOptions.from_url(
                url._replace(path=url.path or "/" + self.db), {}, [])).items()
                if name in ("host", "port", "user", "passwd", "db")}
            if url.username is None:
                overrides.update(user=self.user, passwd=self.passwd)
            if url.port is None:
                overrides["port"] = self.port
            if not url.path.strip("/"):
                overrides["db"] = self.db
            return dataclasses.replace(base, **overrides)
        host, _, port = entry.rpartition(":") if ":" in entry else (entry, "", "")
        try:
            return dataclasses.replace(base, host=host, port=int(port) if port else self.port)
        except ValueError:
            raise ConfigurationError(
                f"a mysql replica is host, host:port or a mysql:// URL, got {entry!r}") from None

    @classmethod
    def from_url(cls, url: SplitResult, query: dict[str, Any],
                 other: list[tuple[str, str]]) -> "MySQLOptions":
        """``mysql://user:password@host:port/db?unix_socket=/path&driver=pymysql``."""
        try:
            port = url.port
        except ValueError:
            raise ConfigurationError(
                f"mysql URL has a bad port: {mask_secrets(urlunsplit(url))!r}") from None
        kw: dict[str, Any] = {"db": unquote(url.path.lstrip("/"))}
        if url.hostname:
            kw["host"] = unquote(url.hostname)
        if port:
            kw["port"] = port
        if url.username is not None:
            kw["user"] = unquote(url.username)
        if url.password is not None:
            kw["passwd"] = unquote(url.password)
        kw.update((name, value) for name, value in query.items() if value)
        return cls(**kw)
