"""How a tool opens STORAGE: a zodburi URI, a plain database URL, the path of an
SQLite file, or a ZConfig file (``FILE`` or ``FILE#NAME``).

A tool that only reads opens read-only, and one that must not create a database
(``must_exist``) opens with schema creation off: either way a mistyped path or an
empty schema is an error naming it, and nothing is created.
"""
from __future__ import annotations

import io
import os
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import ZConfig
import ZODB.config
import zodburi

from zodbsql.api import open_storage as open_zodbsql_storage
from zodbsql.backends import registry
from zodbsql.backends.sqlite.options import SQLiteOptions
from zodbsql.cli import zopeconf
from zodbsql.config import StorageFactory
from zodbsql.errors import ConfigurationError, ZodbsqlError
from zodbsql.masking import mask_secrets
from zodbsql.uri import resolve_uri

STORAGE_HELP = ("a zodburi URI (zodbsql+sqlite:///path, file:///Data.fs, zeo://host:port,"
                " ...), a plain " + ", ".join(f"{s}://" for s in registry.schemes())
                + " URL, the path of an SQLite file, or a ZConfig file with <zodb NAME>"
                " sections, as FILE or FILE#NAME")
#: zodburi schemes whose storages take a ``read_only`` query parameter.
READ_ONLY_SCHEMES = ("file", "zeo")
SQLITE_SUFFIXES = (".sqlite", ".sqlite3")
SQLITE_HEADER = b"SQLite format 3\0"


def open_storage(spec: str, read_only: bool = False, must_exist: bool = False,
                 zodbsql_for: str | None = None) -> Any:
    """Open the storage ``spec`` names.

    ``read_only`` opens it read-only (so it must exist); ``must_exist`` refuses to
    create a zodbsql database.  With ``zodbsql_for`` (the tool's name) anything but a
    zodbsql storage is refused before it is opened.  Errors are one line, without
    passwords.
    """
    try:
        return _open(spec, read_only, must_exist or read_only, zodbsql_for)
    except ZodbsqlError:
        raise
    except Exception as exc:  # another storage's own error (FileStorage, ZEO, ...)
        raise ConfigurationError(f"cannot open {mask_secrets(spec)}: {type(exc).__name__}:"
                                 f" {mask_secrets(str(exc))}") from exc


def _open(spec: str, read_only: bool, must_exist: bool, zodbsql_for: str | None) -> Any:
    if "://" in spec and not os.path.exists(spec):
        return _open_url(spec, read_only, must_exist, zodbsql_for)
    if _is_sqlite_file(spec):
        return open_zodbsql_storage(SQLiteOptions(path=spec), read_only=read_only,
                                    create_schema=not must_exist)
    path, _, name = spec.partition("#")
    return _open_zconfig(path, name, read_only, must_exist, zodbsql_for)


def _is_sqlite_file(path: str) -> bool:
    """A path ending in .sqlite/.sqlite3, or an existing file with SQLite's header."""
    if path.lower().endswith(SQLITE_SUFFIXES):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def _with_query(url: str, settings: dict[str, str]) -> str:
    """``url`` with ``settings`` in its query, replacing the same keys (``-`` or ``_``)."""
    if not settings:
        return url
    base, _, query = url.partition("?")
    pairs = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True)
             if k.replace("-", "_") not in settings]
    return f"{base}?{urlencode(pairs + list(settings.items()))}"


def _open_url(url: str, read_only: bool, must_exist: bool, zodbsql_for: str | None) -> Any:
    scheme = url.partition("://")[0].lower()
    if scheme == "zconfig":
        parts = urlsplit(url)
        return _open_zconfig(unquote(parts.path), parts.fragment, read_only, must_exist,
                             zodbsql_for)
    if registry.by_scheme(scheme) is not None:
        access = {}
        if read_only:
            access["read_only"] = "true"
        if must_exist:
            access["create_schema"] = "false"
        factory, _ = resolve_uri(_with_query(url, access))
        return factory()
    if zodbsql_for:
        raise ConfigurationError(
            f"{zodbsql_for} needs a zodbsql storage, got {mask_secrets(url)!r}")
    if read_only and scheme in READ_ONLY_SCHEMES:
        url = _with_query(url, {"read_only": "1"})
    try:
        factory, _ = zodburi.resolve_uri(url)
    except KeyError as exc:
        raise ConfigurationError(
            f"no storage knows the URI {mask_secrets(url)!r} ({mask_secrets(str(exc))})"
        ) from None
    return factory()


def _load_zconfig(path: str, name: str) -> Any:
    """The file read with ZODB's database schema; a Zope instance's configuration
    (zope.conf: ``<zodb_db>`` sections among Zope's own settings) by its databases."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    url = "file://" + os.path.abspath(path)     # relative %include paths, and messages
    if zopeconf.is_zope_config(text):
        names = zopeconf.database_names(text)
        if name and name not in names:
            raise ConfigurationError(f"{path} has no <zodb_db {name}> section (it has:"
                                     f" {', '.join(names) or 'none'})")
        text = zopeconf.as_database_config(text, name)
    config, _ = ZConfig.loadConfigFile(ZODB.config.getDbSchema(), io.StringIO(text), url)
    return config


def _open_zconfig(path: str, name: str, read_only: bool, must_exist: bool,
                  zodbsql_for: str | None) -> Any:
    if not os.path.isfile(path):
        problem = "is a directory" if os.path.isdir(path) else "does not exist"
        raise ConfigurationError(f"{path} {problem} (expected {STORAGE_HELP})")
    try:
        config = _load_zconfig(path, name)
    except ZConfig.ConfigurationError as exc:
        detail = " ".join(str(exc).split())  # ZConfig puts the line number on a line of its own
        raise ConfigurationError(f"{path}: {mask_secrets(detail)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(
            f"{path} is neither a ZConfig file nor an SQLite database ({exc}); a"
            f" FileStorage is named file://{os.path.abspath(path)}") from None
    sections = config.database or []
    names = ", ".join(str(s.name) for s in sections)
    if name:
        chosen = [s for s in sections if s.name == name]
        if not chosen:
            raise ConfigurationError(f"{path} has no <zodb {name}> or <zodb_db {name}>"
                                     f" section (it has: {names or 'none'})")
    elif len(sections) != 1:
        raise ConfigurationError(f"{path} has {len(sections)} <zodb> sections ({names});"
                                 " pick one with FILE#NAME")
    else:
        chosen = sections
    factory = chosen[0].config.storage
    settings = factory.config
    is_zodbsql = isinstance(factory, StorageFactory)
    if zodbsql_for and not is_zodbsql:
        raise ConfigurationError(
            f"{zodbsql_for} needs a zodbsql storage; <zodb {chosen[0].name}> in {path}"
            f" is a {type(factory).__name__}")
    if read_only and hasattr(settings, "read_only"):
        settings.read_only = True
    if must_exist and is_zodbsql:
        settings.create_schema = False
    return factory.open()
