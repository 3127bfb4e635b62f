"""The SQLite backend's settings: the ``<sqlite3>`` section, ``sqlite:///path`` URLs."""
from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import SplitResult, unquote, urlunsplit

from zodbsql.errors import ConfigurationError
from zodbsql.masking import mask_secrets
from zodbsql.options import BackendOptions, setting

SYNCHRONOUS_MODES = ("off", "normal", "full", "extra")


@dataclasses.dataclass(frozen=True)
class SQLiteOptions(BackendOptions):
    """Where the database file is and how it syncs."""

    path: str = setting(
        in_query=False, doc="The database file; its directory must exist.")
    synchronous: str = setting(
        "full", doc="SQLite's synchronous setting: full (default, survives power loss),"
                    " normal (survives a process crash), off.")
    wal_autocheckpoint: int = setting(
        4000, doc="The pages the write-ahead log may hold before a commit copies them into"
                  " the database file (SQLite's wal_autocheckpoint; its own default is"
                  " 1000): a page changed by many commits is copied once per checkpoint.")
    checkpoint_in_background: bool = setting(
        True, doc="Copy the write-ahead log into the database file in a thread of the"
                  " storage's own, each time half of wal-autocheckpoint's pages were"
                  " written, so that no commit waits for the copy and its sync (the"
                  " commits still do it past wal-autocheckpoint if the thread falls"
                  " behind); false: the commits do it all, as SQLite does by itself.")

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigurationError("sqlite3 needs a path to the database file")
        if self.synchronous.lower() not in SYNCHRONOUS_MODES:
            raise ConfigurationError(
                f"sqlite3 synchronous must be one of {', '.join(SYNCHRONOUS_MODES)},"
                f" got {self.synchronous!r}")
        if self.wal_autocheckpoint < 1:
            raise ConfigurationError(
                f"sqlite3 wal-autocheckpoint must be 1 page or more (without checkpoints"
                f" the write-ahead log would grow without end), got {self.wal_autocheckpoint}")

    @classmethod
    def from_url(cls, url: SplitResult, query: dict[str, Any],
                 other: list[tuple[str, str]]) -> "SQLiteOptions":
        """``sqlite:///abs/path`` and ``sqlite://rel/path`` name the file, and so does
        ``sqlite:////abs/path`` (SQLAlchemy's form of an absolute path)."""
        if "@" in url.netloc:
            raise ConfigurationError(f"an sqlite:// URL names a file and takes no login:"
                                     f" {mask_secrets(urlunsplit(url))!r}")
        path = unquote(url.netloc + url.path)
        if path.startswith("//"):
            path = "/" + path.lstrip("/")
        return cls(path=path, **query)
