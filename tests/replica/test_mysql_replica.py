"""A MariaDB primary with a binlog replica (``replica-dsns`` on MySQL): which server
serves a snapshot, seen from what a storage reads, and ZODB's basic and MVCC suites
read through the replica.

The replica is held behind on purpose with its global read lock (its applier waits,
its threads keep running): a storage that reads from it sees the older state; its own
commits are never hidden from it (that snapshot comes from the primary); once the lag
passes ``replica-max-lag``, or replication stops, the replica is skipped.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

import pytest
import ZODB
from ZODB.tests import BasicStorage
from ZODB.tests.testMVCCMappingStorage import MVCCTests

import zodbsql
from tests.conformance.suite import StorageSuite
from tests.databases import MySQLFactory, Param, server_unavailable
from tests.replica.conftest import set_up
from tests.replica.factories import read, write
from tests.replica.mariadb_pair import ReplicatedMariaDB
from zodbsql.backends.mysql.options import MySQLOptions
from zodbsql.cli.main import main as zodbsql_main
from zodbsql.errors import ConfigurationError

pytestmark = pytest.mark.replica
storage_backends = ("mysql",)
storage_backends_reason = "binlog replicas are MySQL's and MariaDB's"


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicatedMariaDB]:
    try:
        made = ReplicatedMariaDB()
    except FileNotFoundError as exc:
        server_unavailable("a private MariaDB primary and replica", exc)
        raise
    yield set_up(made)
    made.cleanup()


class PairFactory(MySQLFactory):
    """Scratch databases on the pair's primary; storages read through its replica."""

    def __init__(self, param: Param, pair: ReplicatedMariaDB, **replica: Any) -> None:
        self.param = param
        self.pair = pair
        self.driver = "auto"
        self.replica = {"replica_dsns": f"127.0.0.1:{pair.replica.port}", **replica}
        self.opened = []
        self.databases: list[str] = []
        self.admin = pair.primary.admin()
        self.db = self.new_path()

    def new_path(self) -> str:
        name = f"zodbsql_r_{uuid.uuid4().hex[:12]}"
        self.admin.cursor().execute(f"CREATE DATABASE {name}")
        self.databases.append(name)
        self.pair.wait_caught_up()       # the replica has the database too
        return name

    def backend_options(self, path: str | None = None) -> Any:
        return MySQLOptions(db=path or self.db, host="127.0.0.1",
                            port=self.pair.primary.port, user="root", **self.replica)

    def open(self, path: str | None = None, **options: Any) -> Any:
        storage = super().open(path, **options)
        # The storage made its tables on the primary: a read transaction the replica
        # starts before that DDL arrives fails (1146, or 1412 "Table definition has
        # changed") as the tables appear under it. A test that holds or stops the
        # replica on purpose has its tables there already, and waiting would never end.
        if self.pair.applying:
            self.pair.wait_caught_up()
        return storage

    def cleanup(self) -> None:
        self.pair.hold(False)
        self.pair.stop_replication(False)
        self.close_storages()
        for name in self.databases:
            self.admin.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
        self.admin.close()


@pytest.fixture(params=[True, False], ids=["hp", "hf"])
def factory(request: pytest.FixtureRequest, pair: ReplicatedMariaDB) -> Iterator[PairFactory]:
    made = PairFactory(Param("mysql", request.param), pair)
    yield made
    made.cleanup()


def test_reads_come_from_the_replica(factory: PairFactory) -> None:
    pair = factory.pair
    write(factory.open(), 1)
    pair.wait_caught_up()
    reader = ZODB.DB(factory.open(read_only=True))
    assert read(reader) == 1
    pair.hold()
    write(factory.open(), 2)          # another process, as far as the reader knows
    assert read(reader) == 1          # what the replica has applied
    pair.hold(False)
    pair.wait_caught_up()
    assert read(reader) == 2
    reader.close()


def test_own_commits_are_never_hidden(factory: PairFactory) -> None:
    pair = factory.pair
    db = ZODB.DB(factory.open())
    with db.transaction() as conn:
        conn.root()["value"] = 1
    pair.wait_caught_up()
    assert read(db) == 1
    pair.hold()
    for value in (2, 3):
        with db.transaction() as conn:
            conn.root()["value"] = value
        assert read(db) == value      # the replica lags: this snapshot is the primary's
    db.close()


def test_a_replica_past_the_lag_bound_is_skipped(factory: PairFactory) -> None:
    pair = factory.pair
    factory.replica["replica_max_lag"] = 0.5
    write(factory.open(), 1)
    pair.wait_caught_up()
    pair.hold()
    writer = zodbsql.open_storage(MySQLOptions(db=factory.db, host="127.0.0.1",
                                               port=pair.primary.port, user="root"),
                                  keep_history=factory.param.keep_history)
    write(writer, 2)
    time.sleep(2.5)                   # the event the replica waits on is older now
    reader = ZODB.DB(factory.open(read_only=True))
    assert read(reader) == 2          # from the primary
    reader.close()


def test_a_stopped_replica_is_skipped(factory: PairFactory) -> None:
    pair = factory.pair
    write(factory.open(), 1)
    pair.wait_caught_up()
    pair.stop_replication()
    write(factory.open(), 2)
    reader = ZODB.DB(factory.open(read_only=True))
    assert read(reader) == 2          # the replica has 1 but replicates nothing: primary
    reader.close()


def test_an_unreachable_replica_is_skipped(factory: PairFactory) -> None:
    from tests.fault.servers import free_port
    factory.replica["replica_dsns"] = f"127.0.0.1:{free_port()}"
    write(factory.open(), 7)
    reader = ZODB.DB(factory.open(read_only=True))
    assert read(reader) == 7
    reader.close()


def test_doctor_reports_the_replica(factory: PairFactory,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    pair = factory.pair
    write(factory.open(), 1)
    url = pair.url(factory.db, factory.param.keep_history)
    zodbsql_main(["doctor", url])
    out = capsys.readouterr().out
    assert f"replica 127.0.0.1:{pair.replica.port}" in out
    assert f"from 127.0.0.1:{pair.primary.port}, IO thread Yes, SQL thread Yes" in out
    pair.stop_replication()
    zodbsql_main(["doctor", url])
    out = capsys.readouterr().out
    assert "IO thread No, SQL thread No" in out and "START REPLICA" in out
    assert "repl-secret" not in out


@pytest.mark.parametrize("entry, where", [
    ("db2", ("db2", 3306, "u", "zodb")),
    ("db2:3307", ("db2", 3307, "u", "zodb")),
    ("mysql://r:pw@db3:3308/other", ("db3", 3308, "r", "other")),
    ("mysql://db4", ("db4", 3306, "u", "zodb")),
])
def test_replica_entries(entry: str, where: tuple[Any, ...]) -> None:
    options = MySQLOptions(db="zodb", user="u", passwd="pw0", replica_dsns=entry)
    (replica,) = options.replicas
    assert (replica.host, replica.port, replica.user, replica.db) == where
    assert "pw" not in repr(options)


@pytest.mark.parametrize("value, words", [
    (" ; ", "names no server"),
    ("db:port", "host, host:port or a mysql:// URL"),
    ("postgresql://db", "host, host:port or a mysql:// URL"),
])
def test_bad_replica_entries_are_refused(value: str, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        MySQLOptions(db="zodb", replica_dsns=value).replicas


@pytest.fixture
def storage_factory(request: pytest.FixtureRequest,
                    pair: ReplicatedMariaDB) -> Iterator[PairFactory]:
    made = PairFactory(request.param, pair)
    yield made
    made.cleanup()


class TestBasicStorage(StorageSuite, BasicStorage.BasicStorage):
    pass


class TestMVCC(StorageSuite, MVCCTests):
    pass
