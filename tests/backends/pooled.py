"""A session of a storage's pool, for the tests of one backend's session class."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator


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
