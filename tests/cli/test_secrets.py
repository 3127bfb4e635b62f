"""No password in anything the tools print or write.

Each tool runs with a password in its URL: on PostgreSQL one that trust
authentication ignores, on MariaDB/MySQL the password of a scratch user made for the
test.  Their output and every file under the test's directory are searched for it.
"""
from __future__ import annotations

import pathlib
import secrets
from typing import Any, Iterator

import psycopg
import pytest
import ZODB
from persistent.mapping import PersistentMapping

from tests.cli.urls import url_for
from tests.databases import (BACKENDS, MYSQL_SERVER, POSTGRESQL_DSN, MySQLFactory, Param,
                             PostgreSQLFactory)
from tests.relay import free_port
from zodbsql.bench import contenders
from zodbsql.cli.main import main

SECRET = f"zodbsql-secret-{secrets.token_hex(6)}"
TINY_BENCH = ["--tests", "add,update", "-n", "10", "-c", "1", "-r", "1", "--warmup", "0",
              "--no-charts"]


def url_errors(tmp_path: pathlib.Path) -> list[str]:
    """URLs that every tool refuses, each with the password in it."""
    port = free_port()
    pg = f"postgresql://postgres:{SECRET}@127.0.0.1"
    my = f"mysql://root:{SECRET}@127.0.0.1"
    return [
        f"{pg}:{port}/test?connect_timeout=3", f"{pg}:5/test?bogus=1",
        f"zodbsql+{pg}:5/test?keep_history=maybe", f"postgres://postgres:{SECRET}@127.0.0.1:x/t",
        f"{pg}:{port}/test?driver=odbc", f"host=127.0.0.1 port={port} password={SECRET}",
        f"postgresql://postgres@127.0.0.1:{port}/test?password={SECRET}&connect_timeout=3",
        f"{my}:{port}/test", f"{my}:x/test", f"{my}:{port}/test?bogus=1",
        f"zodbsql+{my}:{port}/", f"mariadb://root:{SECRET}@127.0.0.1:{port}/test?driver=odbc",
        f"oracle://scott:{SECRET}@db/orcl", f"zodbsql+oracle://scott:{SECRET}@db/orcl",
        f"zeo://user:{SECRET}@127.0.0.1:{port}?wait=0",
        f"sqlite://user:{SECRET}@{tmp_path}/no/dir.sqlite",
    ]


@pytest.mark.parametrize("tool", ["verify", "pack", "doctor", "convert"])
def test_url_errors_print_no_password(tool: str, tmp_path: pathlib.Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    for url in url_errors(tmp_path):
        argv = [tool, url] + ([f"sqlite://{tmp_path}/dest.sqlite"] if tool == "convert" else [])
        code = main(argv)
        captured = capsys.readouterr()
        assert code != 0, url
        assert SECRET not in captured.out + captured.err, (url, captured)


@pytest.fixture(params=["postgresql", "mysql"])
def server(request: pytest.FixtureRequest, tmp_path: pathlib.Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    """A scratch schema or database and a URL logging in to it with SECRET; the
    bench's server shortcuts log in with SECRET too."""
    backend = request.param
    if backend not in BACKENDS:
        pytest.skip(f"{backend} is not in ZODBSQL_TEST_BACKENDS")
    if backend == "postgresql":
        factory: Any = PostgreSQLFactory(Param(backend, True))
        monkeypatch.setattr(contenders, "POSTGRESQL_DSN",
                            psycopg.conninfo.make_conninfo(POSTGRESQL_DSN, password=SECRET))
        try:
            yield factory, url_for(backend, factory.path, password=SECRET)
        finally:
            factory.cleanup()
        return
    factory = MySQLFactory(Param(backend, True), tmp_path)
    user = f"zodbsql_test_{secrets.token_hex(4)}"
    cursor = factory.admin.cursor()
    cursor.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{SECRET}'")
    try:
        # Its own databases: the test's, and the scratch ones bench and doctor make.
        cursor.execute(f"GRANT ALL PRIVILEGES ON `zodbsql\\_%`.* TO '{user}'@'%'")
        host = MYSQL_SERVER["host"]
        monkeypatch.setattr(contenders, "MYSQL_URL", f"mysql://{user}:{SECRET}@{host}"
                            f":{MYSQL_SERVER['port']}/{factory.path}")
        yield factory, url_for(backend, factory.path, password=SECRET, user=user)
    finally:
        cursor.execute(f"DROP USER IF EXISTS '{user}'@'%'")
        factory.cleanup()


def files_holding_the_secret(directory: pathlib.Path) -> list[str]:
    return [str(p) for p in directory.rglob("*")
            if p.is_file() and SECRET.encode() in p.read_bytes()]


def test_tools_print_and_write_no_password(server: tuple[Any, str], tmp_path: pathlib.Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    factory, url = server
    backend = factory.param.backend
    printed = []

    def run(*argv: str) -> int:
        code = main(list(argv))
        captured = capsys.readouterr()
        printed.append(captured.out + captured.err)
        return code

    assert run("verify", url) == 2      # empty: refused read-only, names the database
    assert run("doctor", url) == 0      # creates the schema and checks it
    db = ZODB.DB(factory.open())
    with db.transaction() as conn:
        conn.root()["a"] = PersistentMapping(v=1)
    db.close()
    assert run("verify", url) == 0
    assert run("pack", url, "--dry-run") == 0
    assert run("pack", url) == 0
    assert run("convert", url, f"sqlite://{tmp_path}/copy.sqlite") == 0
    assert run("convert", f"{url}&bogus=1", f"sqlite://{tmp_path}/copy.sqlite") == 2
    assert run("bench", "--contender", backend, *TINY_BENCH,
               "--output", str(tmp_path / "bench")) == 0
    assert (tmp_path / "bench" / "results.json").exists()
    assert all(SECRET not in text for text in printed), printed
    assert files_holding_the_secret(tmp_path) == []
