"""Scratch databases for the fault tests, named by URL so child processes and the
``zodbsql verify`` command line can open them too.

A server is an address (host, port, login); a scratch database on it is a schema
(PostgreSQL) or a database (MySQL) the test creates and drops, or an SQLite file.  The
shared servers come from the settings ``tests/databases.py`` reads; private ones from
``tests.fault.servers``.  ``url(..., port=...)`` points a client at a proxy instead.
"""
from __future__ import annotations

import dataclasses
import pathlib
import secrets
from typing import Any
from urllib.parse import quote, urlencode

from tests.databases import (MYSQL_SERVER, POSTGRESQL_DSN, drop_mysql_database,
                             server_unavailable)
from tests.fault.servers import PrivateMariaDB, PrivatePostgreSQL, PrivateServer

BACKENDS = ("sqlite", "postgresql", "mysql")


@dataclasses.dataclass(frozen=True)
class ServerAddress:
    backend: str          # "postgresql" or "mysql"
    host: str
    port: int
    user: str
    password: str = ""
    dbname: str = "test"  # PostgreSQL: the database the scratch schemas go in

    def admin(self) -> Any:
        """An autocommit driver connection as this login."""
        if self.backend == "postgresql":
            import psycopg
            return psycopg.connect(host=self.host, port=self.port, user=self.user,
                                   password=self.password or None, dbname=self.dbname,
                                   autocommit=True, connect_timeout=5, sslmode="disable")
        from zodbsql.backends.mysql.connections import load_driver
        name, module = load_driver(MYSQL_SERVER["driver"])
        password = {"passwd" if name == "mysqlclient" else "password": self.password}
        return module.connect(host=self.host, port=self.port, user=self.user,
                              autocommit=True, connect_timeout=5, **password)


def shared_server(backend: str) -> ServerAddress:
    """The shared test server of ``backend`` (skips, or fails under CI=true, if down)."""
    if backend == "postgresql":
        from psycopg.conninfo import conninfo_to_dict
        info = conninfo_to_dict(POSTGRESQL_DSN)
        address = ServerAddress("postgresql", str(info.get("host", "127.0.0.1")),
                                int(str(info.get("port", 5432))),
                                str(info.get("user", "postgres")),
                                str(info.get("password", "")), str(info.get("dbname", "test")))
    else:
        address = ServerAddress("mysql", str(MYSQL_SERVER["host"]), int(str(MYSQL_SERVER["port"])),
                                str(MYSQL_SERVER["user"]), str(MYSQL_SERVER["passwd"]))
    try:
        conn = address.admin()
    except Exception as exc:
        server_unavailable(f"the shared {backend} server {address.host}:{address.port}", exc)
    conn.close()
    return address


def private_address(server: PrivateServer) -> ServerAddress:
    if isinstance(server, PrivatePostgreSQL):
        return ServerAddress("postgresql", "127.0.0.1", server.port, "postgres")
    assert isinstance(server, PrivateMariaDB)
    return ServerAddress("mysql", "127.0.0.1", server.port, "root")


class ScratchDatabase:
    """One empty zodbsql database: an SQLite file, a PostgreSQL schema or a MySQL
    database, removed by ``drop``."""

    def __init__(self, backend: str, directory: pathlib.Path,
                 server: ServerAddress | None = None) -> None:
        self.backend = backend
        self.server = server
        self.name = f"zodbsql_fault_{secrets.token_hex(6)}"
        self.path = directory / f"{self.name}.sqlite"
        # PostgreSQL sessions on this database say so, so that drop ends only them.
        self.application_name = f"zodbsql-fault-{self.name}"
        if backend == "postgresql":
            assert server is not None
            with server.admin() as conn:
                conn.execute(f'CREATE SCHEMA "{self.name}"')
        elif backend == "mysql":
            assert server is not None
            conn = server.admin()
            try:
                conn.cursor().execute(f"CREATE DATABASE {self.name} CHARACTER SET utf8mb4")
            finally:
                conn.close()

    def url(self, keep_history: bool, port: int | None = None, **options: Any) -> str:
        """The database's URL with storage ``options``; ``port`` replaces the server's
        (a proxy in front of it)."""
        query: dict[str, Any] = {"keep_history": str(keep_history).lower()}
        query.update({key: str(value).lower() if isinstance(value, bool) else value
                      for key, value in options.items()})
        if self.backend == "sqlite":
            return f"sqlite://{self.path}?{urlencode(query)}"
        server = self.server
        assert server is not None
        login = quote(server.user) + (f":{quote(server.password)}" if server.password else "")
        where = f"{login}@{server.host}:{port or server.port}"
        if self.backend == "postgresql":
            # No TLS (a proxy must see the statements); libpq's default is to try it.
            query = {"schema": self.name, "sslmode": "disable", "gssencmode": "disable",
                     "application_name": self.application_name, **query}
            return f"postgresql://{where}/{server.dbname}?{urlencode(query)}"
        query.setdefault("driver", MYSQL_SERVER["driver"])
        return f"mysql://{where}/{self.name}?{urlencode(query)}"

    def drop(self) -> None:
        if self.backend == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                pathlib.Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            return
        server = self.server
        assert server is not None
        try:
            conn = server.admin()
        except Exception:
            return  # a private server already gone: its directory goes with it
        try:
            if self.backend == "postgresql":
                # Sessions of killed writers may linger a moment, holding locks.  Only
                # this scratch database's own: other suites may share the server.
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                             " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                             " AND application_name = %s", (self.application_name,))
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')
            else:
                drop_mysql_database(conn, self.name)
        finally:
            conn.close()
