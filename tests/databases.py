"""The databases the tests run against, one factory per backend.

Each factory makes storages on a database the test created and removes it afterwards.
SQLite needs nothing; with CI=true a server that can't be reached fails the run instead
of skipping it.  The matrix is every backend of ``zodbsql.backends.registry`` (or those
``ZODBSQL_TEST_BACKENDS`` names), each through its factory in ``FACTORIES``.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import secrets
import time
import uuid
import warnings
from typing import Any

import pytest

from zodbsql.api import open_storage
from zodbsql.backends import registry
from zodbsql.backends.mysql.connections import load_driver
from zodbsql.backends.mysql.options import MySQLOptions
from zodbsql.backends.sqlite.options import SQLiteOptions
from zodbsql.storage import SQLStorage


@dataclasses.dataclass(frozen=True)
class Param:
    """One cell of the matrix: a backend and a history mode."""

    backend: str
    keep_history: bool

    @property
    def id(self) -> str:
        return f"{self.backend}-{'hp' if self.keep_history else 'hf'}"


class StorageFactory:
    """What every backend's factory shares: storages opened on its databases, and
    closed again.  A subclass makes databases (``new_path``), names them
    (``backend_options``) and removes them (``cleanup``, after ``close_storages``)."""

    param: Param
    opened: list[SQLStorage]

    def new_path(self) -> str:
        raise NotImplementedError

    def backend_options(self, path: str | None = None) -> Any:
        raise NotImplementedError

    def open(self, path: str | None = None, **options: Any) -> SQLStorage:
        """A storage on the test's database (or on ``path``), in the cell's mode."""
        options.setdefault("keep_history", self.param.keep_history)
        storage = open_storage(self.backend_options(path), **options)
        self.opened.append(storage)
        return storage

    def open_other(self, **options: Any) -> SQLStorage:
        """A storage on a second, empty database of the same kind."""
        return self.open(self.new_path(), **options)

    def backend(self, path: str | None = None) -> Any:
        """The backend of the test's database (or of ``path``) in the cell's mode, made
        without a storage: it prepares no schema, so the database is seen as it is."""
        return self.backend_options(path).create_backend(self.param.keep_history, 10.0)

    def close_storages(self) -> None:
        for storage in self.opened:
            storage.close()
        # pytest keeps each test's class instance, and with it this factory, to the end
        # of the session: hold no closed storage (a race test opens hundreds).
        self.opened.clear()

    def cleanup(self) -> None:
        self.close_storages()


class SQLiteFactory(StorageFactory):
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



#: The PostgreSQL server the tests use (trust auth); each test gets its own schema.
POSTGRESQL_DSN = os.environ.get(
    "ZODBSQL_TEST_POSTGRESQL_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test")


def server_unavailable(what: str, exc: Exception) -> None:
    """Fail under CI=true, skip (with the reason) otherwise."""
    message = f"{what} is not reachable: {exc}"
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError(f"{message} (CI=true: a missing server fails the run)") from exc
    pytest.skip(message)


class PostgreSQLFactory(StorageFactory):
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
        from zodbsql.backends.postgresql.options import PostgreSQLOptions
        return PostgreSQLOptions(dsn=self.dsn, schema=path or self.path)

    def cleanup(self) -> None:
        self.close_storages()
        try:
            for schema in self.schemas:
                drop_postgresql_schema(self.admin, schema)
        finally:
            self.admin.close()


#: Sessions that hold locks in a test's schema: a storage or a connection the test
#: left open (its read transaction, a thread still running).
LOCKING_SESSIONS = (
    "SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = %s AND l.pid <> pg_backend_pid()")


def locking_sessions(admin: Any, schema: str) -> list[int]:
    """The sessions holding locks in ``schema`` a moment after they were first seen:
    one whose connection the test had just closed (a collected instance's) still holds
    them while its backend exits, and is gone then; it needs no ending, nor a warning."""
    pids = [pid for (pid,) in admin.execute(LOCKING_SESSIONS, (schema,)).fetchall()]
    if pids:
        time.sleep(0.2)
        still = {pid for (pid,) in admin.execute(LOCKING_SESSIONS, (schema,)).fetchall()}
        pids = [pid for pid in pids if pid in still]
    return pids


def drop_postgresql_schema(admin: Any, schema: str) -> None:
    """Drop ``schema``, first ending the sessions that hold locks in it, which would
    stall DROP SCHEMA for ever (as ``drop_mysql_database`` does on MySQL); a session
    that takes one meanwhile makes the DROP give up after a while, and it is tried
    again.  Sessions ended say so in a warning: each is a test that did not close what
    it opened."""
    import psycopg
    for attempt in range(3):
        pids = locking_sessions(admin, schema)
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        if pids:
            warnings.warn(f"{len(pids)} session(s) still holding locks in schema {schema}"
                          " were ended so that it could be dropped", stacklevel=2)
        admin.execute("SET lock_timeout = '10s'" if attempt < 2 else "RESET lock_timeout")
        try:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            break
        except psycopg.errors.LockNotAvailable:
            continue
    admin.execute("RESET lock_timeout")


class PostgreSQLDatabaseFactory(PostgreSQLFactory):
    """PostgreSQLFactory in a database ``zodbsql_test_<random>`` of its own, created on
    the test server and dropped after: figures PostgreSQL keeps per database
    (``pg_stat_database``) then count this test's sessions only."""

    def __init__(self, param: Param, tmp_path: pathlib.Path | None = None,
                 dsn: str = POSTGRESQL_DSN) -> None:
        try:
            import psycopg
            self.server = psycopg.connect(dsn, autocommit=True, connect_timeout=5)
        except Exception as exc:
            server_unavailable(f"PostgreSQL ({dsn})", exc)
        self.database = f"zodbsql_test_{secrets.token_hex(6)}"
        self.server.execute(f'CREATE DATABASE "{self.database}"')
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        params["dbname"] = self.database
        super().__init__(param, tmp_path, psycopg.conninfo.make_conninfo("", **params))

    def cleanup(self) -> None:
        try:
            super().cleanup()
        finally:
            # Sessions a failed test left behind would block DROP DATABASE: end them.
            self.server.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                " WHERE datname = %s", (self.database,))
            self.server.execute(f'DROP DATABASE IF EXISTS "{self.database}"')
            self.server.close()


#: The test server, from ZODBSQL_MYSQL_* (defaults: the local server, root, no password).
MYSQL_SERVER: dict[str, Any] = {
    "host": os.environ.get("ZODBSQL_MYSQL_HOST", "127.0.0.1"),
    "port": int(os.environ.get("ZODBSQL_MYSQL_PORT", "3306")),
    "unix_socket": os.environ.get("ZODBSQL_MYSQL_SOCKET") or None,
    "user": os.environ.get("ZODBSQL_MYSQL_USER", "root"),
    "passwd": os.environ.get("ZODBSQL_MYSQL_PASSWORD", ""),
    "driver": os.environ.get("ZODBSQL_MYSQL_DRIVER", "auto"),
}


def mysql_admin(driver: str | None = None, server: dict[str, Any] | None = None) -> Any:
    """A raw driver connection to the test server (or ``server``, settings as
    MYSQL_SERVER's), outside any database."""
    settings = dict(server or MYSQL_SERVER)
    name, module = load_driver(driver or settings["driver"])
    args: dict[str, Any] = {"user": settings["user"], "port": settings["port"],
                            "autocommit": True, "connect_timeout": 5}
    if name == "mysqlclient":
        args.update(passwd=settings["passwd"],
                    host="localhost" if settings["unix_socket"] else settings["host"])
    else:
        args.update(password=settings["passwd"], host=settings["host"])
    if settings["unix_socket"]:
        args["unix_socket"] = settings["unix_socket"]
    return module.connect(**args)


class MySQLFactory(StorageFactory):
    """Storages on databases ``zodbsql_test_<random>`` the factory creates and drops."""

    def __init__(self, param: Param, tmp_path: pathlib.Path, driver: str | None = None,
                 server: dict[str, Any] | None = None) -> None:
        """``server``: settings as MYSQL_SERVER's, of another server (a private one)."""
        self.param = param
        self.server = server or MYSQL_SERVER
        self.driver = driver or self.server["driver"]
        self.opened: list[SQLStorage] = []
        self.databases: list[str] = []
        try:
            self.admin = mysql_admin(self.driver, self.server)
        except Exception as exc:
            where = self.server["unix_socket"] or f"{self.server['host']}:{self.server['port']}"
            server_unavailable(f"the MySQL server at {where}", exc)
        self.db = self.new_path()

    def new_path(self) -> str:
        """Create a new, empty database and return its name."""
        name = f"zodbsql_test_{uuid.uuid4().hex[:16]}"
        self.admin.cursor().execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        self.databases.append(name)
        return name

    @property
    def path(self) -> str:
        """The test's database (SQLiteFactory's ``path`` counterpart)."""
        return self.db

    def backend_options(self, path: str | None = None) -> Any:
        settings = dict(self.server)
        settings["driver"] = self.driver
        return MySQLOptions(db=path or self.db, **settings)

    def cleanup(self) -> None:
        self.close_storages()
        try:
            for name in self.databases:
                drop_mysql_database(self.admin, name)
        finally:
            self.admin.close()


def drop_mysql_database(admin: Any, name: str) -> None:
    """Drop database ``name``, first ending the sessions still using it.

    Sessions a test left open (an instance never released, a thread still running, a
    killed process the server has not noticed yet) would hold metadata locks and stall
    DROP DATABASE.
    """
    cursor = admin.cursor()
    cursor.execute("SELECT id FROM information_schema.processlist WHERE db = %s", (name,))
    for (session,) in cursor.fetchall():
        try:
            cursor.execute(f"KILL {int(session)}")
        except Exception:
            pass  # already gone
    cursor.execute(f"DROP DATABASE IF EXISTS {name}")


_SESSION_LIMITS: dict[str, int | None] = {}


def server_session_limit(backend: str) -> int | None:
    """The shared test server's ``max_connections`` minus reserved ones (None: no such
    server, or unknown)."""
    if backend not in ("postgresql", "mysql"):
        return None
    if backend not in _SESSION_LIMITS:
        limit = None
        try:
            if backend == "postgresql":
                import psycopg
                with psycopg.connect(POSTGRESQL_DSN, autocommit=True,
                                     connect_timeout=5) as conn:
                    row = conn.execute(
                        "SELECT current_setting('max_connections')::int"
                        " - current_setting('superuser_reserved_connections')::int"
                    ).fetchone()
            else:
                admin = mysql_admin()
                try:
                    cursor = admin.cursor()
                    cursor.execute("SELECT @@max_connections")   # plus one for SUPER
                    row = cursor.fetchone()
                finally:
                    admin.close()
            limit = int(row[0]) if row else None
        except Exception:
            pass  # unreachable: the factory reports it (fails under CI=true)
        _SESSION_LIMITS[backend] = limit
    return _SESSION_LIMITS[backend]


#: The factory of each registered backend, by its registry name (tests/test_registry.py
#: checks that every backend has one).
FACTORIES: dict[str, type[StorageFactory]] = {
    "sqlite": SQLiteFactory,
    "postgresql": PostgreSQLFactory,
    "mysql": MySQLFactory,
}
#: The backends tested by default: every registered one.
DEFAULT_BACKENDS = ",".join(registry.names())
BACKENDS = [b for b in os.environ.get("ZODBSQL_TEST_BACKENDS", DEFAULT_BACKENDS).split(",") if b]
if set(BACKENDS) - set(FACTORIES):
    raise RuntimeError(f"ZODBSQL_TEST_BACKENDS names {sorted(set(BACKENDS) - set(FACTORIES))};"
                       f" the backends with a test factory are {', '.join(FACTORIES)}")
PARAMS = [Param(backend, keep_history) for backend in BACKENDS for keep_history in (True, False)]
