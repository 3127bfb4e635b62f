"""ZODB's record-level suites with records compressed, and with records encrypted, on
every backend and history mode.

Twice the record-level suites (basic, history, undo, pack, iterator, recovery, conflict
resolution, MVCC), not all of them: the rest never sees a stored byte differently.
ZODB's test states are small, so compression is tried on every state
(``compress-threshold 0``); it keeps those it makes smaller.
"""
from __future__ import annotations

import base64
import os
from typing import Any

import pytest

from ZODB.tests import (BasicStorage, ConflictResolution, HistoryStorage, IteratorStorage,
                        PackableStorage, RecoveryStorage, TransactionalUndoStorage)
from ZODB.tests.testMVCCMappingStorage import MVCCTests

from tests.conformance.suite import StorageSuite
from tests.conformance.test_blob_suite import blob_suite, not_applying, run_suite

HP_ONLY = (True,)
NEEDS_HISTORY = "needs old revisions or undo, which a history-free storage does not keep"


class Compressed(StorageSuite):
    def storage_options(self, tmp_path: Any) -> dict[str, Any]:
        return {"compress": "zstd", "compress_threshold": 0}


class Encrypted(StorageSuite):
    def storage_options(self, tmp_path: Any) -> dict[str, Any]:
        path = tmp_path / "keys"
        if not path.exists():
            path.write_text("suite:" + base64.b64encode(os.urandom(32)).decode() + "\n")
        return {"key_file": str(path)}


class IntoSameBackend:
    """RecoveryStorage's destination: a second database of the same backend, sealed the
    same way (first in a class's bases, so its ``setUp`` is the one that runs)."""

    factory: Any
    cache_options: dict[str, Any]
    _dst: Any

    history_modes = HP_ONLY
    history_modes_reason = "the suite undoes transactions before copying"

    def setUp(self) -> None:
        self._dst = self.factory.open_other(**self.cache_options)

    def tearDown(self) -> None:
        self._dst.close()

    def new_dest(self) -> Any:
        return self._dst


class TestBasicCompressed(Compressed, BasicStorage.BasicStorage):
    pass


class TestBasicEncrypted(Encrypted, BasicStorage.BasicStorage):
    pass


class TestHistoryCompressed(Compressed, HistoryStorage.HistoryStorage):
    history_modes = HP_ONLY
    history_modes_reason = NEEDS_HISTORY


class TestHistoryEncrypted(Encrypted, HistoryStorage.HistoryStorage):
    history_modes = HP_ONLY
    history_modes_reason = NEEDS_HISTORY


class TestUndoCompressed(Compressed, TransactionalUndoStorage.TransactionalUndoStorage):
    history_modes = HP_ONLY
    history_modes_reason = NEEDS_HISTORY


class TestUndoEncrypted(Encrypted, TransactionalUndoStorage.TransactionalUndoStorage):
    history_modes = HP_ONLY
    history_modes_reason = NEEDS_HISTORY


class TestPackableCompressed(Compressed, PackableStorage.PackableStorageWithOptionalGC):
    pass


class TestPackableEncrypted(Encrypted, PackableStorage.PackableStorageWithOptionalGC):
    pass


class TestIteratorCompressed(Compressed, IteratorStorage.IteratorStorage):
    history_modes = HP_ONLY
    history_modes_reason = "iterates every revision and undo records"
    use_extension_bytes = True


class TestIteratorEncrypted(Encrypted, IteratorStorage.IteratorStorage):
    history_modes = HP_ONLY
    history_modes_reason = "iterates every revision and undo records"
    use_extension_bytes = True


class TestRecoveryCompressed(IntoSameBackend, Compressed, RecoveryStorage.RecoveryStorage):
    pass


class TestRecoveryEncrypted(IntoSameBackend, Encrypted, RecoveryStorage.RecoveryStorage):
    pass


class TestConflictResolutionCompressed(Compressed,
                                       ConflictResolution.ConflictResolvingStorage):
    pass


class TestConflictResolutionEncrypted(Encrypted,
                                      ConflictResolution.ConflictResolvingStorage):
    pass


class TestMVCCCompressed(Compressed, MVCCTests):
    pass


class TestMVCCEncrypted(Encrypted, MVCCTests):
    pass


@pytest.mark.parametrize("part", ["rest", "undo"])
def test_zodb_blob_suite_encrypted(storage_factory: Any, part: str, tmp_path: Any,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """ZODB's blob suite in the database layout, blob chunks and states encrypted (the
    shared-directory layout keeps blob files in clear: out of scope)."""
    reason = not_applying(part, "database", storage_factory.param.keep_history)
    if reason:
        pytest.skip(reason)
    monkeypatch.chdir(tmp_path)
    keys = tmp_path / "keys"
    keys.write_text("blobs:" + base64.b64encode(os.urandom(32)).decode() + "\n")
    result, names, _ = run_suite(blob_suite(storage_factory, "database",
                                            key_file=str(keys), blob_chunk_size=4096), part)
    problems = result.failures + result.errors
    assert not problems, "\n".join(f"{test.id()}\n{text}" for test, text in problems)
    assert result.testsRun > 0 and result.testsRun == len(names)
