"""ZODB's basic and MVCC suites on the replicated cluster, two ways:

* ``standby``: every poll and load served by the standby when it can (``replica-dsns``),
  the primary otherwise;
* ``pgbouncer``: every session through pgbouncer in session mode, in front of the
  primary (temporary tables, prepared statements and SET search_path survive there).
"""
from __future__ import annotations

from typing import Iterator

import pytest
from ZODB.tests import BasicStorage
from ZODB.tests.testMVCCMappingStorage import MVCCTests

from tests.conformance.suite import StorageSuite
from tests.databases import Param, PostgreSQLFactory
from tests.replica.cluster import PrivatePgBouncer, ReplicatedPostgreSQL
from tests.replica.factories import ReplicaFactory

pytestmark = pytest.mark.replica
storage_backends = ("postgresql",)
storage_backends_reason = "streaming standbys and pgbouncer are PostgreSQL's"


@pytest.fixture(params=["standby", "pgbouncer"])
def route(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def storage_factory(request: pytest.FixtureRequest, route: str,
                    replicated: ReplicatedPostgreSQL) -> Iterator[PostgreSQLFactory]:
    param: Param = request.param
    if route == "pgbouncer":
        bouncer: PrivatePgBouncer = request.getfixturevalue("pgbouncer_session")
        factory = PostgreSQLFactory(param, None, bouncer.dsn())
    else:
        factory = ReplicaFactory(param, replicated)
    yield factory
    factory.cleanup()


class TestBasicStorage(StorageSuite, BasicStorage.BasicStorage):
    pass


class TestMVCC(StorageSuite, MVCCTests):
    pass
