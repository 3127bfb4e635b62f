"""Inherited ZODB tests that need more server sessions than the shared servers allow,
run on a private PostgreSQL or MariaDB server started with room for them
(``roomy_postgresql``, ``roomy_mariadb``).

On the shared servers these cells are skipped with both numbers (conftest); here they
run, in both history modes.
"""
from __future__ import annotations

import pathlib
from typing import Iterator

import pytest
from ZODB.tests import BasicStorage
from ZODB.tests.racetest import RaceTests

from tests.conformance.differences import SERVER_SESSIONS_NEEDED
from tests.conformance.roomy_mariadb import roomy_mariadb  # noqa: F401
from tests.conformance.roomy_postgresql import MAX_CONNECTIONS, roomy_postgresql  # noqa: F401
from tests.conformance.suite import StorageSuite
from tests.databases import MySQLFactory, Param, PostgreSQLFactory, StorageFactory

storage_backends = ("postgresql", "mysql")
storage_backends_reason = (
    "the tests of SERVER_SESSIONS_NEEDED on a private server with room for them;"
    " on SQLite they run in tests/conformance/test_zodb_suites.py")


@pytest.fixture
def storage_factory(request: pytest.FixtureRequest,
                    tmp_path: pathlib.Path) -> Iterator[StorageFactory]:
    param: Param = request.param
    factory: StorageFactory
    if param.backend == "postgresql":
        factory = PostgreSQLFactory(param, dsn=request.getfixturevalue("roomy_postgresql"))
        limit = factory.admin.execute("SHOW max_connections").fetchone()
    else:
        factory = MySQLFactory(param, tmp_path, server=request.getfixturevalue("roomy_mariadb"))
        cursor = factory.admin.cursor()
        cursor.execute("SELECT @@max_connections")
        limit = tuple(str(value) for value in cursor.fetchone())
    assert limit == (str(MAX_CONNECTIONS),)         # the roomy server, not a shared one
    yield factory
    factory.cleanup()


class TestBasicStorageManySessions(StorageSuite):
    """The BasicStorage tests of SERVER_SESSIONS_NEEDED, on the roomy server."""

    # The test and the helpers it calls, taken over unchanged.
    test_race_external_invalidate_vs_disconnect = (
        BasicStorage.BasicStorage.test_race_external_invalidate_vs_disconnect)
    _check_race_external_invalidate_vs_disconnect = (
        RaceTests._check_race_external_invalidate_vs_disconnect)
    dbopen = RaceTests.dbopen


def test_every_test_needing_many_sessions_runs_here() -> None:
    names = {f"TestBasicStorage::{name}" for name in dir(TestBasicStorageManySessions)
             if name.startswith("test_")}
    # The cache levels' cells of the race test (test_cache_levels.py) and those of the
    # records at rest run on SQLite; on the servers they are skipped with their reason:
    # here each took about 1.5 minutes on PostgreSQL (9 minutes for six), too long for CI.
    assert {key for key in SERVER_SESSIONS_NEEDED if key.startswith("TestBasicStorage::")} == names
    assert all(needed <= MAX_CONNECTIONS - 10 for needed, _ in SERVER_SESSIONS_NEEDED.values())
