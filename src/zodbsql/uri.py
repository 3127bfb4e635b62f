"""zodburi resolver: ``zodbsql+sqlite:///path/to/Data.sqlite?keep_history=false``,
``zodbsql+postgresql://user@host/dbname?schema=zodb``.

Query parameters that zodburi knows as ``ZODB.DB`` arguments (``database_name``,
``connection_cache_size``, ...) go to the DB; the rest are storage options.
"""
from __future__ import annotations

from typing import Any, Callable
from urllib.parse import parse_qsl, urlencode, urlsplit

from zodburi import PARAMETERS

from zodbsql.api import open_storage, parse_url
from zodbsql.storage import SQLStorage


def resolve_uri(uri: str) -> tuple[Callable[[], SQLStorage], dict[str, Any]]:
    parts = urlsplit(uri)
    query = parse_qsl(parts.query, keep_blank_values=True)
    dbkw = {k: v for k, v in query if k in PARAMETERS}
    storage_query = urlencode([(k, v) for k, v in query if k not in PARAMETERS])
    # The URI's own text up to its query: urlunsplit would turn sqlite:////abs/path
    # (an empty host and an absolute path) into sqlite://abs/path, a relative one.
    base = uri.partition("#")[0].partition("?")[0]
    url = f"{base}?{storage_query}" if storage_query else base
    # Parse now, so a bad URI fails when it is resolved, not when the DB opens.
    parse_url(url)

    def factory() -> SQLStorage:
        return open_storage(url)
    return factory, dbkw
