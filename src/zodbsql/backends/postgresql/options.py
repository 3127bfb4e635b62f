"""The PostgreSQL backend's settings: the ``<postgresql>`` section, ``postgresql://`` URLs."""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar
from urllib.parse import SplitResult, urlencode, urlunsplit

from zodbsql.backends.postgresql.connections import DRIVERS
from zodbsql.errors import ConfigurationError
from zodbsql.masking import mask_secrets
from zodbsql.options import BackendOptions, setting


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

    #: sslmode, connect_timeout, ... in a URL stay in the DSN, for libpq.
    keeps_other_query: ClassVar[bool] = True

    def __repr__(self) -> str:
        return (f"PostgreSQLOptions(dsn={mask_secrets(self.dsn)!r}, schema={self.schema!r},"
                f" driver={self.driver!r})")

    def __post_init__(self) -> None:
        if not self.dsn or not self.dsn.strip():
            raise ConfigurationError(
                "postgresql needs a dsn, e.g. 'host=localhost dbname=zodb' or"
                " 'postgresql://user@host/dbname'")
        if self.schema is not None and not self.schema:
            raise ConfigurationError("postgresql schema must not be empty")
        if self.driver not in DRIVERS:
            raise ConfigurationError(
                f"postgresql driver must be one of {', '.join(DRIVERS)}, got {self.driver!r}")

    @classmethod
    def from_url(cls, url: SplitResult, query: dict[str, Any],
                 other: list[tuple[str, str]]) -> "PostgreSQLOptions":
        """The DSN is the URL without zodbsql's settings."""
        dsn = urlunsplit(("postgresql", url.netloc, url.path, urlencode(other), ""))
        return cls(dsn=dsn, **query)
