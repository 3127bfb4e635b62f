"""Run ZODB's storage test mixins as plain pytest classes.

ZODB's mixins (BasicStorage, HistoryStorage, ...) expect a ``unittest.TestCase`` with
``self._storage`` and StorageTestBase's helpers.  A unittest class can't take a
parametrized fixture, so ``StorageSuite`` is a plain class instead: it takes the storage
from the ``storage_factory`` fixture, reuses StorageTestBase's helper functions as its
own methods, and answers ``assert*`` calls with a real ``unittest.TestCase``'s.
"""
from __future__ import annotations

import unittest
from typing import Any, Iterator

import pytest
import transaction
from ZODB.tests.StorageTestBase import StorageTestBase
from ZODB.tests.TransactionalUndoStorage import TransactionalUndoStorage


class _Assertions(unittest.TestCase):
    maxDiff = None

    def runTest(self) -> None:  # pragma: no cover - never run, only asserted with
        pass


_ASSERTIONS = _Assertions()


class StorageSuite:
    """Base of every conformance class; mix ZODB's suite classes in after it."""

    _storage: Any = None
    # StorageTestBase's helpers are plain functions; they work on any object with _storage.
    _dostore = StorageTestBase._dostore
    _dostoreNP = StorageTestBase._dostoreNP
    _undo = StorageTestBase._undo
    _begin_undos_vote = TransactionalUndoStorage._begin_undos_vote

    @pytest.fixture(autouse=True)
    def _storage_under_test(self, storage_factory, tmp_path, monkeypatch):
        yield from self._storage_from(storage_factory, tmp_path, monkeypatch)

    def _storage_from(self, storage_factory: Any, tmp_path: Any,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        """Set up ``_storage`` from ``storage_factory``, yield, tear down."""
        monkeypatch.chdir(tmp_path)  # some suites write scratch files to the cwd
        transaction.abort()  # as ZODB's own test setup does: no leftovers between tests
        self.factory = storage_factory
        self.cache_options = self.storage_options(tmp_path)
        self._storage = storage_factory.open(**self.cache_options)
        self.setUp()
        yield
        self.tearDown()
        transaction.abort()
        # Some inherited tests leave a ZODB Connection open; it stays registered with
        # the thread's transaction manager and would poll this test's database at the
        # next test's abort, after the factory removed it (a dropped schema on a server).
        transaction.manager.clearSynchs()
        if self._storage is not None:
            self._storage.close()
        self._storage = None
        self.factory = None

    def storage_options(self, tmp_path: Any) -> dict[str, Any]:
        """Settings every storage of the test is opened with (a subclass's cache levels)."""
        return {}

    def setUp(self) -> None:
        """Hook for subclasses (runs after ``_storage`` is set)."""

    def tearDown(self) -> None:
        """Hook for subclasses."""

    def open(self, **options: Any) -> None:
        """Reopen the storage on the same database (PersistentStorage, ReadOnlyStorage)."""
        if self._storage is not None:
            self._storage.close()
        self._storage = self.factory.open(**{**self.cache_options, **options})

    def _new_storage_client(self) -> Any:
        """Another client of the same database (ZODB's race tests)."""
        return self.factory.open(**self.cache_options)

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("assert", "fail")) or name in ("skipTest", "subTest"):
            return getattr(_ASSERTIONS, name)
        raise AttributeError(name)
