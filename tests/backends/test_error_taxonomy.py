"""One retry taxonomy on every backend: each driver error maps to one zodbsql class.

The table is data: (driver error code, class it must become, whether retryable).
Errors are built by the real drivers' own classes and classified by the connection of
a real storage; MySQL's table is in tests/backends/mysql/test_mysql.py.
"""
from __future__ import annotations

import pathlib
import sqlite3
from typing import Any, Callable, cast

import pytest
from transaction.interfaces import TransientError
from ZODB.POSException import ConflictError

from zodbsql.errors import (CommitLockTimeout, ConnectionLost, DatabaseConflict,
                            DatabaseError, DeadlockError, SchemaError)
from tests.databases import FACTORIES, Param, StorageFactory

# SQLSTATE -> (class, retryable)
POSTGRESQL = [
    ("40P01", DeadlockError, True),
    ("40001", DatabaseConflict, True),
    ("55P03", CommitLockTimeout, True),
    ("57014", CommitLockTimeout, True),
    ("57P01", ConnectionLost, True),
    ("08006", ConnectionLost, True),
    ("23505", DatabaseError, False),
    ("42P01", DatabaseError, False),
]
# SQLite extended result code -> (class, retryable)
SQLITE = [
    (5, CommitLockTimeout, True),       # SQLITE_BUSY
    (517, CommitLockTimeout, True),     # SQLITE_BUSY_SNAPSHOT
    (6, CommitLockTimeout, True),       # SQLITE_LOCKED
    (26, SchemaError, False),           # SQLITE_NOTADB
    (8, DatabaseError, False),          # SQLITE_READONLY
    (13, DatabaseError, False),         # SQLITE_FULL
    (1, DatabaseError, False),          # SQLITE_ERROR
]


def _classified(backend: str, tmp_path: Any, make: Any) -> Exception:
    # Every factory takes these (StorageFactory, FACTORIES' declared type, has no __init__).
    new_factory = cast(Callable[[Param, pathlib.Path], StorageFactory], FACTORIES[backend])
    factory = new_factory(Param(backend, True), tmp_path)
    try:
        storage = factory.open()
        conn = storage.shared.pool.acquire()
        try:
            return getattr(conn, "translate_error")(make(), "SELECT 1")
        finally:
            storage.shared.pool.release(conn)
    finally:
        factory.cleanup()


def _check(error: Exception, kind: type, retryable: bool) -> None:
    assert type(error) is kind, repr(error)
    assert isinstance(error, TransientError) is retryable, repr(error)
    if kind in (DeadlockError, DatabaseConflict):
        assert isinstance(error, ConflictError)  # what ZODB and Zope retry on


@pytest.mark.parametrize("state,kind,retryable", POSTGRESQL)
def test_postgresql_sqlstates(tmp_path: Any, state: str, kind: type, retryable: bool) -> None:
    import psycopg
    error = _classified("postgresql", tmp_path,
                        lambda: psycopg.errors.lookup(state)("the server says no"))
    _check(error, kind, retryable)


@pytest.mark.parametrize("code,kind,retryable", SQLITE)
def test_sqlite_result_codes(tmp_path: Any, code: int, kind: type, retryable: bool) -> None:
    def make() -> Exception:
        exc = sqlite3.OperationalError("the library says no")
        exc.sqlite_errorcode = code  # type: ignore[attr-defined]
        return exc
    _check(_classified("sqlite", tmp_path, make), kind, retryable)


def test_sqlite_messages_alone_classify_nothing(tmp_path: Any) -> None:
    """A message that reads like a lock error but carries no such code is not one."""
    error = _classified("sqlite", tmp_path,
                        lambda: sqlite3.OperationalError("database is locked"))
    assert type(error) is DatabaseError
