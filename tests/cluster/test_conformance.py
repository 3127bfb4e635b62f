"""ZODB's conformance suites against a Galera node, both history modes.

The storage under test talks to node 1; ``_new_storage_client`` (the second client of
ZODB's race and MVCC tests) goes to the next node each time, so those tests also run
with clients on different nodes.  The suites: basic (with its race tests), MVCC,
conflict resolution, history, packing, undo, and recovery (copying to a second database
of the cluster).  Left out, to keep the cluster suite within
its time budget on a 2-core machine (each test creates its schema, and every DDL
statement is replicated in total order): synchronization, revisions, iteration,
persistence and read-only, which add no replication path these miss; with them the ten
suites passed against a node once (104 passed, 22 skipped in both modes, 6 min 20 s on
the loaded machine).
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Iterator

import pytest
from ZODB.tests import (BasicStorage, ConflictResolution, HistoryStorage, PackableStorage,
                        RecoveryStorage, TransactionalUndoStorage)
from ZODB.tests.testMVCCMappingStorage import MVCCTests

from tests.cluster.conftest import GaleraFactory
from tests.conformance.differences import HISTORY_FREE_SKIPS, SERVER_SESSIONS_NEEDED
from tests.conformance.suite import StorageSuite

#: The nodes' max_connections (tests/cluster/galera.py).
NODE_SESSIONS = 60
NEEDS_HISTORY = "needs old revisions, which a history-free storage does not keep"


class GaleraSuite(StorageSuite):
    """StorageSuite on a scratch database of the cluster instead of ``storage_factory``."""

    history_modes: tuple[bool, ...] = (True, False)
    history_modes_reason = ""

    @pytest.fixture(autouse=True)
    def _storage_under_test(self, galera_factory: GaleraFactory, tmp_path: Any,
                            monkeypatch: pytest.MonkeyPatch,
                            request: pytest.FixtureRequest) -> Iterator[None]:
        keep_history = galera_factory.param.keep_history
        key = f"{type(self).__name__}::{request.node.originalname}"
        if keep_history not in self.history_modes:
            pytest.skip(f"history-free: {self.history_modes_reason}")
        if not keep_history and key in HISTORY_FREE_SKIPS:
            pytest.skip(f"history-free: {HISTORY_FREE_SKIPS[key]}")
        needed = SERVER_SESSIONS_NEEDED.get(key)
        if needed and needed[0] > NODE_SESSIONS:
            pytest.skip(f"the Galera nodes allow {NODE_SESSIONS} sessions, this test needs"
                        f" about {needed[0]}: {needed[1]}")
        self._nodes = itertools.cycle(range(1, len(galera_factory.cluster.nodes)))
        yield from self._storage_from(galera_factory, tmp_path, monkeypatch)

    def _new_storage_client(self) -> Any:
        factory = self.factory
        assert isinstance(factory, GaleraFactory)
        return factory.open_on(next(self._nodes))


class TestBasicStorage(GaleraSuite, BasicStorage.BasicStorage):
    pass


class TestMVCC(GaleraSuite, MVCCTests):
    pass


class TestConflictResolution(GaleraSuite, ConflictResolution.ConflictResolvingStorage):
    pass


class TestHistoryStorage(GaleraSuite, HistoryStorage.HistoryStorage):
    history_modes = (True,)
    history_modes_reason = NEEDS_HISTORY


class TestPackable(GaleraSuite, PackableStorage.PackableStorageWithOptionalGC):
    pass


class TestTransactionalUndo(GaleraSuite, TransactionalUndoStorage.TransactionalUndoStorage):
    history_modes = (True,)
    history_modes_reason = NEEDS_HISTORY


class TestRecovery(GaleraSuite, RecoveryStorage.RecoveryStorage):
    """Copy between two databases of the cluster (the copy written through node 2)."""

    history_modes = (True,)
    history_modes_reason = "the suite undoes transactions before copying"

    def setUp(self) -> None:
        factory = self.factory
        assert isinstance(factory, GaleraFactory)
        name = factory.new_path()
        # CREATE DATABASE returns once node 1 has run it; node 2 runs it at the same
        # point of the total order, but maybe a moment later.
        admin = factory.cluster.admin(1)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                cursor = admin.cursor()
                cursor.execute("SHOW DATABASES LIKE %s", (name,))
                if cursor.fetchall():
                    break
                time.sleep(0.05)
        finally:
            admin.close()
        factory.node = 1
        try:
            self._dst = factory.open(name)
        finally:
            factory.node = 0

    def tearDown(self) -> None:
        self._dst.close()

    def new_dest(self) -> Any:
        return self._dst
