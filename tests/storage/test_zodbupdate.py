"""zodbupdate (the real tool) rewrites class paths in a zodbsql database, in both modes.

zodbupdate walks the current records with ``record_iternext`` when the storage declares
``IStorageCurrentRecordIteration``; without it, it refuses an undoable (history-
preserving) storage with "Don't know how to iterate through this storage type".
"""
from __future__ import annotations

from typing import Any

import transaction
import ZODB
import zodbupdate.update  # type: ignore[import-untyped]
from persistent import Persistent
from ZODB.interfaces import IStorageCurrentRecordIteration


class Before(Persistent):
    """The class the records name before the update."""

    def __init__(self, value: int) -> None:
        self.value = value


class After(Persistent):
    """The class they name after it."""


# As zodbupdate reads them from its entry points: (module, class) pairs.
RENAMES = {(__name__, "Before"): (__name__, "After")}


class TestZodbupdate:
    def test_renames_every_record(self, storage_factory: Any) -> None:
        storage = storage_factory.open()
        assert IStorageCurrentRecordIteration.providedBy(storage)
        db = ZODB.DB(storage)
        with db.transaction() as conn:
            conn.root()["items"] = [Before(i) for i in range(25)]
            conn.root()["one"] = Before(-1)
        tid_before = storage.lastTransaction()
        db.close()

        storage = storage_factory.open()
        zodbupdate.update.Updater(storage, renames=RENAMES)()
        assert storage.lastTransaction() > tid_before       # one new transaction
        storage.close()

        db = ZODB.DB(storage_factory.open())
        try:
            conn = db.open()
            root = conn.root()
            assert [type(item) for item in root["items"]] == [After] * 25
            assert [item.value for item in root["items"]] == list(range(25))
            assert type(root["one"]) is After and root["one"].value == -1
            conn.close()
        finally:
            transaction.abort()
            db.close()

    def test_dry_run_changes_nothing(self, storage_factory: Any) -> None:
        db = ZODB.DB(storage_factory.open())
        with db.transaction() as conn:
            conn.root()["one"] = Before(7)
        db.close()
        storage = storage_factory.open()
        last = storage.lastTransaction()
        zodbupdate.update.Updater(storage, dry=True, renames=RENAMES)()
        assert storage.lastTransaction() == last
        storage.close()
