"""The MySQL/MariaDB backend's settings: the ``<mysql>`` section, ``mysql://`` URLs."""
from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import SplitResult, unquote, urlunsplit

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

    def __post_init__(self) -> None:
        if not self.db:
            raise ConfigurationError("mysql needs a database name (db)")
        if self.driver not in DRIVER_CHOICES:
            raise ConfigurationError(
                f"mysql driver must be one of {', '.join(DRIVER_CHOICES)}, got {self.driver!r}")
        if not 0 < int(self.port) < 65536:
            raise ConfigurationError(f"mysql port must be 1-65535, got {self.port}")

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
