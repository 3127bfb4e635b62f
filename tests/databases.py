"""The databases the tests run against, one factory per backend.

Each factory makes storages on a database the test created and removes it afterwards.
SQLite needs nothing; server backends join ``BACKENDS`` as they land, and with CI=true a
server that can't be reached fails the run instead of skipping it.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import uuid
from typing import Any

import pytest

from zodbsql.api import open_storage
from zodbsql.backends.mysql.adapter import MySQLOptions
from zodbsql.backends.mysql.connections import load_driver
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


def server_unavailable(what: str, exc: BaseException) -> None:
    """Skip, or with CI=true fail: CI must not pass by skipping the server backends."""
    message = f"{what} is not reachable: {exc}"
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"{message} (CI=true: a server backend must be tested, not skipped)")
    pytest.skip(message)


#: The test server, from ZODBSQL_MYSQL_* (defaults: the local server, root, no password).
MYSQL_SERVER = {
    "host": os.environ.get("ZODBSQL_MYSQL_HOST", "127.0.0.1"),
    "port": int(os.environ.get("ZODBSQL_MYSQL_PORT", "3306")),
    "unix_socket": os.environ.get("ZODBSQL_MYSQL_SOCKET") or None,
    "user": os.environ.get("ZODBSQL_MYSQL_USER", "root"),
    "passwd": os.environ.get("ZODBSQL_MYSQL_PASSWORD", ""),
    "driver": os.environ.get("ZODBSQL_MYSQL_DRIVER", "auto"),
}


def mysql_admin(driver: str | None = None) -> Any:
    """A raw driver connection to the test server, outside any database."""
    settings = dict(MYSQL_SERVER)
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


class MySQLFactory:
    """Storages on databases ``zodbsql_test_<random>`` the factory creates and drops."""

    def __init__(self, param: Param, tmp_path: pathlib.Path, driver: str | None = None) -> None:
        self.param = param
        self.driver = driver or MYSQL_SERVER["driver"]
        self.opened: list[SQLStorage] = []
        self.databases: list[str] = []
        try:
            self.admin = mysql_admin(self.driver)
        except Exception as exc:
            server = MYSQL_SERVER["unix_socket"] or f"{MYSQL_SERVER['host']}:{MYSQL_SERVER['port']}"
            server_unavailable(f"the MySQL server at {server}", exc)
        self.db = self.new_database()

    def new_database(self) -> str:
        name = f"zodbsql_test_{uuid.uuid4().hex[:16]}"
        self.admin.cursor().execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        self.databases.append(name)
        return name

    @property
    def path(self) -> str:
        """The test's database (SQLiteFactory's ``path`` counterpart)."""
        return self.db

    def backend_options(self, db: str | None = None) -> Any:
        settings = {k: v for k, v in MYSQL_SERVER.items()}
        settings["driver"] = self.driver
        return MySQLOptions(db=db or self.db, **settings)

    def open(self, db: str | None = None, **options: Any) -> SQLStorage:
        options.setdefault("keep_history", self.param.keep_history)
        storage = open_storage(self.backend_options(db), **options)
        self.opened.append(storage)
        return storage

    def open_other(self, **options: Any) -> SQLStorage:
        """A storage on a second, empty database on the same server."""
        return self.open(self.new_database(), **options)

    def cleanup(self) -> None:
        for storage in self.opened:
            storage.close()
        try:
            cursor = self.admin.cursor()
            for name in self.databases:
                # Sessions a test left open (an instance never released, a thread still
                # running) would hold metadata locks and stall DROP DATABASE: end them.
                cursor.execute("SELECT id FROM information_schema.processlist WHERE db = %s",
                               (name,))
                for (session,) in cursor.fetchall():
                    try:
                        cursor.execute(f"KILL {int(session)}")
                    except Exception:
                        pass  # already gone
                cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        finally:
            self.admin.close()


FACTORIES = {
    "sqlite": SQLiteFactory,
    "mysql": MySQLFactory,
}
#: The backends tested by default, one per line so branches adding one merge cleanly.
DEFAULT_BACKENDS = ",".join([
    "sqlite",
    "mysql",
])
BACKENDS = [b for b in os.environ.get("ZODBSQL_TEST_BACKENDS", DEFAULT_BACKENDS).split(",") if b]
PARAMS = [Param(backend, keep_history) for backend in BACKENDS for keep_history in (True, False)]
