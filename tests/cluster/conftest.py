"""Fixtures of the cluster suite: a private three-node Galera cluster, started once for
this package's tests and stopped after them (``galera``: its nodes' heartbeats cost
CPU for as long as they run), and storages on scratch databases of it
(``galera_factory``).

Every test here is marked ``cluster``: ``python -m pytest -m cluster`` runs them alone.
"""
from __future__ import annotations

import pathlib
from typing import Any, Iterator

import pytest

from tests.cluster.galera import GaleraCluster, ensure_galera
from tests.databases import MySQLFactory, Param, server_unavailable
from zodbsql.backends.mysql.options import MySQLOptions
from zodbsql.storage import SQLStorage


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="package")
def galera() -> Iterator[GaleraCluster]:
    """Three synced Galera nodes on loopback ports; tests may kill and restart one, and
    must leave all three synced."""
    ensure_galera()
    try:
        cluster = GaleraCluster(3)
    except (FileNotFoundError, ImportError) as exc:
        server_unavailable("a private MariaDB Galera cluster", exc)
        raise  # not reached
    try:
        cluster.setup()
        yield cluster
    finally:
        cluster.cleanup()


class GaleraFactory(MySQLFactory):
    """Scratch databases ``zodbsql_test_<random>`` on the cluster (created through node
    1, dropped afterwards); ``open_on(i)`` opens a storage through node ``i``."""

    def __init__(self, cluster: GaleraCluster, param: Param) -> None:
        self.cluster = cluster
        self.param = param
        self.driver = "auto"
        self.opened: list[SQLStorage] = []
        self.databases: list[str] = []
        self.admin = cluster.admin(0)
        #: The node ``open`` connects through.
        self.node = 0
        self.db = self.new_path()

    def backend_options(self, path: str | None = None) -> Any:
        return MySQLOptions(db=path or self.db, host="127.0.0.1",
                            port=self.cluster.nodes[self.node].port, user="root")

    def open_on(self, node: int, **options: Any) -> SQLStorage:
        self.node = node
        try:
            return self.open(**options)
        finally:
            self.node = 0

    def url(self, node: int) -> str:
        """The storage's URL through node ``node`` (for child processes and tools)."""
        mode = "" if self.param.keep_history else "?keep_history=false"
        return f"mysql://root@127.0.0.1:{self.cluster.nodes[node].port}/{self.db}{mode}"


@pytest.fixture(params=[True, False], ids=["galera-hp", "galera-hf"])
def galera_factory(request: pytest.FixtureRequest,
                   galera: GaleraCluster) -> Iterator[GaleraFactory]:
    factory = GaleraFactory(galera, Param("mysql", request.param))
    yield factory
    factory.cleanup()
