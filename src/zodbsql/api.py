"""The Python API: a storage or a DB from a URL and keyword options."""
from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit

import ZODB

from zodbsql.backends import registry
from zodbsql.errors import ConfigurationError
from zodbsql.masking import mask_secrets
from zodbsql.options import Options, from_query, query_names
from zodbsql.storage import SQLStorage


def parse_url(url: str, **options: Any) -> tuple[Any, Options]:
    """Split ``scheme://...?opts`` into backend options and storage options.

    The scheme picks the backend (``zodbsql.backends.registry``), which reads the rest:
    ``sqlite:///abs/path`` and ``sqlite://rel/path`` name an SQLite file;
    ``postgresql://user@host:port/dbname?schema=s`` a PostgreSQL database (the DSN is the
    URL without zodbsql's own options), ``mysql://user:password@host:port/db?unix_socket=
    /path&driver=pymysql`` a MySQL or MariaDB database.  The scheme may carry a
    ``zodbsql+`` prefix (the zodburi form).  Query parameters are the backend's settings
    and the storage's (:class:`Options`, ``-`` or ``_``); keyword ``options`` win over
    the URL's.
    """
    parts = urlsplit(url)
    entry = registry.by_scheme(parts.scheme)
    if entry is None:
        known = ", ".join(f"{scheme}://" for scheme in registry.schemes())
        raise ConfigurationError(f"unknown database in {mask_secrets(url)!r}: expected a"
                                 f" URL of {known}")
    options_class = entry.options_class()
    backend_keys = query_names(options_class)
    storage_keys = query_names(Options)
    backend_query: dict[str, str] = {}
    storage_query: dict[str, str] = {}
    other: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        name = key.replace("-", "_")
        if name in backend_keys:
            backend_query[name] = value
        elif name in storage_keys:
            storage_query.setdefault(name, value)
        elif options_class.keeps_other_query:
            other.append((key, value))
        else:
            raise ConfigurationError(f"unknown option {name!r} in {mask_secrets(url)!r}")
    for name, value in from_query(Options, storage_query).items():
        options.setdefault(name, value)
    backend = options_class.from_url(parts, from_query(options_class, backend_query), other)
    return backend, Options(**options)


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
