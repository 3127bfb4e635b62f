"""Helpers for the tests of a backend's session class: a session of a storage's pool,
and the SQL trace's lines."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest

#: The SQL trace's logger (backends/base/trace.py).
TRACE_LOGGER = "zodbsql.sql"


@contextlib.contextmanager
def pooled_session(factory: Any) -> Iterator[Any]:
    """A commit session of a new storage on ``factory``'s database, given back
    afterwards (closed instead when broken), then the database dropped."""
    try:
        storage = factory.open()
        pool = storage.shared.pool
        conn = pool.acquire()
        try:
            yield conn
        finally:
            conn.tracer = None
            if conn.broken:
                conn.close()
            else:
                pool.release(conn)
    finally:
        factory.cleanup()


def trace_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The SQL trace's lines ``caplog`` captured, in order."""
    return [r.getMessage() for r in caplog.records if r.name == TRACE_LOGGER]
