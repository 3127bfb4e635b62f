"""The databases the tests run against, one factory per backend.

Each factory makes storages on a database the test created and removes it afterwards.
SQLite needs nothing; server backends join ``BACKENDS`` as they land, and with CI=true a
server that can't be reached fails the run instead of skipping it.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import secrets
from typing import Any

import pytest

from zodbsql.api import open_storage
from zodbsql.backends.sqlite.adapter import SQLiteOptions
from zodbsql.storage import SQLStorage


@dataclasses.dataclass(frozen=True)
class Param:
    """One cell of the matrix: a backend and a history mode."""

    backend: str
    keep_history: bool

    @property
    def id(self) -> str:
        return f"{self.backend}-{'hp' if self.keep_history else 'hf'}"


class SQLiteFactory:
    """Storages on SQLite files in the test's temporary directory."""

    def __init__(self, param: Param, tmp_path: pathlib.Path) -> None:
        self.param = param
        self.tmp_path = tmp_path
        self.count = 0
        self.opened: list[SQLStorage] = []
        self.path = self.new_path()

    def new_path(self) -> str:
        self.count += 1
        return str(self.tmp_path / f"db{self.count}.sqlite")

    def backend_options(self, path: str | None = None) -> Any:
        return SQLiteOptions(path=path or self.path, synchronous="normal")

    def open(self, path: str | None = None, **options: Any) -> SQLStorage:
        options.setdefault("keep_history", self.param.keep_history)
        storage = open_storage(self.backend_options(path), **options)
        self.opened.append(storage)
        return storage

    def open_other(self, **options: Any) -> SQLStorage:
        """A storage on a second, empty database of the same kind."""
        return self.open(self.new_path(), **options)

    def cleanup(self) -> None:
        for storage in self.opened:
            storage.close()


#: The PostgreSQL server the tests use (trust auth); each test gets its own schema.
POSTGRESQL_DSN = os.environ.get(
    "ZODBSQL_TEST_POSTGRESQL_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test")


def server_unavailable(what: str, exc: Exception) -> None:
    """Fail under CI=true, skip (with the reason) otherwise."""
    message = f"{what} is not reachable: {exc}"
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError(f"{message} (CI=true: a missing server fails the run)") from exc
    pytest.skip(message)


class PostgreSQLFactory:
    """Storages in schemas ``zodbsql_test_<random>`` of the test database, dropped after."""

    def __init__(self, param: Param, tmp_path: pathlib.Path | None = None,
                 dsn: str = POSTGRESQL_DSN) -> None:
        self.param = param
        self.dsn = dsn
        self.count = 0
        self.schemas: list[str] = []
        self.opened: list[SQLStorage] = []
        try:
            import psycopg
            self.admin = psycopg.connect(dsn, autocommit=True, connect_timeout=5)
        except Exception as exc:  # ImportError or any connection failure
            server_unavailable(f"PostgreSQL ({dsn})", exc)
        self.path = self.new_path()

    def new_path(self) -> str:
        """Create a new, empty schema and return its name."""
        self.count += 1
        schema = f"zodbsql_test_{secrets.token_hex(6)}"
        self.admin.execute(f'CREATE SCHEMA "{schema}"')
        self.schemas.append(schema)
        return schema

    def backend_options(self, path: str | None = None) -> Any:
        from zodbsql.backends.postgresql.adapter import PostgreSQLOptions
        return PostgreSQLOptions(dsn=self.dsn, schema=path or self.path)

    def open(self, path: str | None = None, **options: Any) -> SQLStorage:
        options.setdefault("keep_history", self.param.keep_history)
        storage = open_storage(self.backend_options(path), **options)
        self.opened.append(storage)
        return storage

    def open_other(self, **options: Any) -> SQLStorage:
        """A storage on a second, empty schema."""
        return self.open(self.new_path(), **options)

    def cleanup(self) -> None:
        for storage in self.opened:
            storage.close()
        try:
            for schema in self.schemas:
                self.admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            self.admin.close()


_SESSION_LIMITS: dict[str, int | None] = {}


def server_session_limit(backend: str) -> int | None:
    """The server's ``max_connections`` minus reserved ones (None: no server or unknown)."""
    if backend != "postgresql":
        return None
    if backend not in _SESSION_LIMITS:
        limit = None
        try:
            import psycopg
            with psycopg.connect(POSTGRESQL_DSN, autocommit=True, connect_timeout=5) as conn:
                row = conn.execute(
                    "SELECT current_setting('max_connections')::int"
                    " - current_setting('superuser_reserved_connections')::int").fetchone()
                limit = int(row[0]) if row else None
        except Exception:
            pass  # unreachable: the factory reports it (fails under CI=true)
        _SESSION_LIMITS[backend] = limit
    return _SESSION_LIMITS[backend]


FACTORIES = {"sqlite": SQLiteFactory, "postgresql": PostgreSQLFactory}
BACKENDS = [b for b in os.environ.get("ZODBSQL_TEST_BACKENDS", "sqlite,postgresql").split(",")
            if b]
PARAMS = [Param(backend, keep_history) for backend in BACKENDS for keep_history in (True, False)]
