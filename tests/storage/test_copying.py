"""Copying FileStorage -> zodbsql -> FileStorage keeps every transaction and record."""
from __future__ import annotations

import pathlib
from typing import Any

import pytest
import transaction
import ZODB
import ZODB.FileStorage
from persistent.mapping import PersistentMapping

from zodbsql import copying


def make_filestorage(path: pathlib.Path) -> None:
    """History with updates, an undo and several transactions."""
    db = ZODB.DB(ZODB.FileStorage.FileStorage(str(path)))
    try:
        with db.transaction("create") as conn:
            for i in range(20):
                conn.root()[i] = PersistentMapping(value=i)
        for i in range(10):
            with db.transaction(f"update {i}") as conn:
                conn.root()[i]["value"] = -i
        db.undo(db.undoLog(0, 1)[0]["id"])
        transaction.commit()
    finally:
        db.close()


def history(storage: Any) -> list[tuple[bytes, str, list[tuple[bytes, bytes | None]]]]:
    return [(txn.tid, txn.status, sorted((r.oid, r.data) for r in txn))
            for txn in storage.iterator()]


def test_round_trip(storage_factory: Any, tmp_path: pathlib.Path) -> None:
    make_filestorage(tmp_path / "Source.fs")
    source = ZODB.FileStorage.FileStorage(str(tmp_path / "Source.fs"), read_only=True)
    middle = storage_factory.open()
    back = ZODB.FileStorage.FileStorage(str(tmp_path / "Back.fs"))
    try:
        counts = copying.copy_transactions(source, middle, copying.resume_point(source, middle))
        assert (counts.transactions, counts.records) == (13, 33)
        if storage_factory.param.keep_history:
            assert history(middle) == history(source)
        copying.copy_transactions(middle, back, copying.resume_point(middle, back))
        if storage_factory.param.keep_history:
            assert history(back) == history(source)
        # Either way the current states are the same everywhere.
        for oid in {r.oid for txn in source.iterator() for r in txn}:
            assert ZODB.utils.load_current(back, oid) == ZODB.utils.load_current(source, oid)
        assert copying.resume_point(source, middle) is None  # up to date
    finally:
        source.close()
        back.close()


def test_interrupted_copy_completes_without_doubles(storage_factory: Any,
                                                    tmp_path: pathlib.Path) -> None:
    make_filestorage(tmp_path / "Source.fs")
    source = ZODB.FileStorage.FileStorage(str(tmp_path / "Source.fs"), read_only=True)
    dest = storage_factory.open()

    def stop_after_five(counts: copying.CopyCounts, tid: bytes) -> None:
        if counts.transactions == 5:
            raise KeyboardInterrupt
    try:
        with pytest.raises(KeyboardInterrupt):
            copying.copy_transactions(source, dest, copying.resume_point(source, dest),
                                      stop_after_five)
        rest = copying.copy_transactions(source, dest, copying.resume_point(source, dest))
        assert rest.transactions == 8
        if storage_factory.param.keep_history:
            assert history(dest) == history(source)
    finally:
        source.close()


def test_refuses_a_destination_with_other_data(storage_factory: Any,
                                               tmp_path: pathlib.Path) -> None:
    make_filestorage(tmp_path / "Source.fs")
    dest = storage_factory.open()
    db = ZODB.DB(dest)
    with db.transaction() as conn:
        conn.root()["unrelated"] = 1
    source = ZODB.FileStorage.FileStorage(str(tmp_path / "Source.fs"), read_only=True)
    try:
        with pytest.raises(copying.ConfigurationError, match="not in the source"):
            copying.resume_point(source, dest)
    finally:
        source.close()
        db.close()
