"""ZODB's own storage conformance suites, over every backend and history mode.

Each class names the ZODB suites it runs.  ``history_modes`` says which modes a suite
applies to, with the reason; everything else runs in both.
"""
from __future__ import annotations

import ZODB.FileStorage
from ZODB.tests import (BasicStorage, ConflictResolution, HistoryStorage, IteratorStorage,
                        MTStorage, PackableStorage, PersistentStorage, ReadOnlyStorage,
                        RecoveryStorage, RevisionStorage, Synchronization,
                        TransactionalUndoStorage)
from ZODB.tests.testMVCCMappingStorage import MVCCTests

from tests.conformance.suite import StorageSuite

HP_ONLY = (True,)
NEEDS_HISTORY = "needs old revisions or undo, which a history-free storage does not keep"


class TestBasicStorage(StorageSuite, BasicStorage.BasicStorage):
    pass


class TestSynchronization(StorageSuite, Synchronization.SynchronizedStorage):
    pass


class TestMTStorage(StorageSuite, MTStorage.MTStorage):
    pass


class TestPersistentStorage(StorageSuite, PersistentStorage.PersistentStorage):
    pass


class TestReadOnlyStorage(StorageSuite, ReadOnlyStorage.ReadOnlyStorage):
    pass


class TestConflictResolution(StorageSuite, ConflictResolution.ConflictResolvingStorage):
    pass


class TestConflictResolutionUndo(StorageSuite,
                                 ConflictResolution.ConflictResolvingTransUndoStorage):
    history_modes = HP_ONLY
    history_modes_reason = NEEDS_HISTORY


class TestRevisionStorage(StorageSuite, RevisionStorage.RevisionStorage):
    history_modes = HP_ONLY
    history_modes_reason = NEEDS_HISTORY


class TestHistoryStorage(StorageSuite, HistoryStorage.HistoryStorage):
    history_modes = HP_ONLY
    history_modes_reason = NEEDS_HISTORY


class TestIteratorStorage(StorageSuite, IteratorStorage.IteratorStorage,
                          IteratorStorage.ExtendedIteratorStorage):
    history_modes = HP_ONLY
    history_modes_reason = "iterates every revision and undo records"
    # The iterator hands out each transaction's extension as the bytes committed (as
    # FileStorage does), so a copy keeps them exactly.
    use_extension_bytes = True


class TestTransactionalUndo(StorageSuite, TransactionalUndoStorage.TransactionalUndoStorage):
    history_modes = HP_ONLY
    history_modes_reason = NEEDS_HISTORY


class TestPackable(StorageSuite, PackableStorage.PackableStorageWithOptionalGC):
    pass


class TestPackableUndo(StorageSuite, PackableStorage.PackableUndoStorage):
    history_modes = HP_ONLY
    history_modes_reason = NEEDS_HISTORY


class TestMVCC(StorageSuite, MVCCTests):
    pass


class TestRecoveryToFileStorage(StorageSuite, RecoveryStorage.RecoveryStorage):
    """Copy from zodbsql into FileStorage and compare."""

    history_modes = HP_ONLY
    history_modes_reason = "the suite undoes transactions before copying"

    def setUp(self) -> None:
        self._dst = ZODB.FileStorage.FileStorage("Dest.fs", create=True)

    def tearDown(self) -> None:
        self._dst.close()

    def new_dest(self):
        return ZODB.FileStorage.FileStorage("Dest.fs")


class TestRecoveryToSameBackend(StorageSuite, RecoveryStorage.RecoveryStorage):
    """Copy between two zodbsql databases of the same backend and compare."""

    history_modes = HP_ONLY
    history_modes_reason = "the suite undoes transactions before copying"

    def setUp(self) -> None:
        self._dst = self.factory.open_other()
        self._dst_path = self.factory.path if not hasattr(self.factory, "count") else None

    def tearDown(self) -> None:
        self._dst.close()

    def new_dest(self):
        return self._dst
