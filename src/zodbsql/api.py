"""The Python API: a storage or a DB from a URL and keyword options."""
from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import ZODB

from zodbsql.backends.mysql.adapter import MySQLOptions
from zodbsql.backends.sqlite.adapter import SQLiteOptions
from zodbsql.errors import ConfigurationError
from zodbsql.masking import mask_secrets
from zodbsql.options import Options
from zodbsql.storage import SQLStorage

_BOOLEANS = {"true": True, "yes": True, "on": True, "1": True,
             "false": False, "no": False, "off": False, "0": False}
#: Query parameters of a URL that are storage options, with their types.
_OPTION_TYPES = {"keep_history": bool, "read_only": bool, "create_schema": bool,
                 "cache_size_mb": float, "prefetch_count": int, "prefetch_bytes": int,
                 "commit_lock_timeout": float,
                 "row_lock_timeout": float, "pack_gc": bool,
                 "pack_batch_size": int, "pack_duty_cycle": float, "name": str,
                 "blob_dir": str, "shared_blob_dir": bool, "blob_cache_size": int,
                 "blob_chunk_size": int}
#: Query parameters that belong to the SQLite backend.
_SQLITE_KEYS = {"synchronous"}
#: Query parameters that belong to the PostgreSQL backend (the rest of an unknown
#: query stays in the DSN, for libpq: sslmode, connect_timeout, ...).
_POSTGRESQL_KEYS = {"schema", "driver"}
_POSTGRESQL_SCHEMES = ("postgresql", "postgres")
#: Query parameters that belong to the MySQL backend.
_MYSQL_KEYS = {"unix_socket", "driver"}


def _convert(key: str, value: str) -> Any:
    kind = _OPTION_TYPES[key]
    if kind is bool:
        try:
            return _BOOLEANS[value.lower()]
        except KeyError:
            raise ConfigurationError(f"{key} must be true or false, got {value!r}") from None
    try:
        return kind(value)
    except ValueError:
        raise ConfigurationError(f"{key} must be a {kind.__name__}, got {value!r}") from None


def parse_url(url: str, **options: Any) -> tuple[Any, Options]:
    """Split ``scheme://...?opts`` into backend options and storage options.

    ``sqlite:///abs/path`` and ``sqlite://rel/path`` name an SQLite file;
    ``postgresql://user@host:port/dbname?schema=s`` a PostgreSQL database (the DSN is the
    URL without zodbsql's own options), ``mysql://user:password@host:port/db?unix_socket=
    /path&driver=pymysql`` a MySQL or MariaDB database.  The scheme may carry a
    ``zodbsql+`` prefix (the zodburi form).
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower().removeprefix("zodbsql+")
    postgresql = scheme in _POSTGRESQL_SCHEMES
    mysql = scheme in ("mysql", "mariadb")
    backend_keys = _POSTGRESQL_KEYS if postgresql else _MYSQL_KEYS if mysql else _SQLITE_KEYS
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    backend_kw: dict[str, str] = {}
    dsn_query: list[tuple[str, str]] = []
    for key, value in pairs:
        name = key.replace("-", "_")
        if key in backend_keys:
            backend_kw[key] = value
        elif name in _OPTION_TYPES:
            options.setdefault(name, _convert(name, value))
        elif postgresql:
            dsn_query.append((key, value))
        else:
            raise ConfigurationError(f"unknown option {name!r} in {mask_secrets(url)!r}")
    if scheme in ("sqlite", "sqlite3"):
        if "@" in parts.netloc:
            raise ConfigurationError(f"an sqlite:// URL names a file and takes no login:"
                                     f" {mask_secrets(url)!r}")
        path = unquote(parts.netloc + parts.path)
        return SQLiteOptions(path=path, **backend_kw), Options(**options)
    if postgresql:
        from zodbsql.backends.postgresql.adapter import PostgreSQLOptions
        dsn = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(dsn_query), ""))
        return PostgreSQLOptions(dsn=dsn, **backend_kw), Options(**options)
    if mysql:
        return _mysql_options(url, parts, backend_kw), Options(**options)
    raise ConfigurationError(f"unknown database in {mask_secrets(url)!r}: expected a"
                             " sqlite://, postgresql:// or mysql:// URL")


def _mysql_options(url: str, parts: Any, backend_kw: dict[str, str]) -> MySQLOptions:
    try:
        port = parts.port
    except ValueError:
        raise ConfigurationError(f"mysql URL has a bad port: {mask_secrets(url)!r}") from None
    kw: dict[str, Any] = {"db": unquote(parts.path.lstrip("/"))}
    if parts.hostname:
        kw["host"] = unquote(parts.hostname)
    if port:
        kw["port"] = port
    if parts.username is not None:
        kw["user"] = unquote(parts.username)
    if parts.password is not None:
        kw["passwd"] = unquote(parts.password)
    if backend_kw.get("unix_socket"):
        kw["unix_socket"] = backend_kw["unix_socket"]
    if backend_kw.get("driver"):
        kw["driver"] = backend_kw["driver"]
    return MySQLOptions(**kw)


def open_storage(url: str | Any, **options: Any) -> SQLStorage:
    """Open a storage from a URL, or from backend options (such as ``SQLiteOptions``)."""
    if isinstance(url, str):
        backend_options, opts = parse_url(url, **options)
    else:
        backend_options, opts = url, Options(**options)
    backend = backend_options.create_backend(opts.keep_history, opts.commit_lock_timeout,
                                             opts.read_only)
    return SQLStorage(backend, opts)


def open_db(url: str | Any, db_options: dict[str, Any] | None = None,
            **options: Any) -> ZODB.DB:
    """Open a ``ZODB.DB`` on a new storage (see :func:`open_storage`)."""
    return ZODB.DB(open_storage(url, **options), **(db_options or {}))
