"""Copying FileStorage -> zodbsql -> FileStorage keeps every transaction and record."""
from __future__ import annotations

import dataclasses
import os
import pathlib
import tempfile
import time
from typing import Any

import pytest
import transaction
import ZODB
import ZODB.blob
import ZODB.FileStorage
from persistent.mapping import PersistentMapping
from ZODB.utils import p64, u64, z64

from tests.storage.restoring import restore_consecutive
from zodbsql import copying


def make_filestorage(path: pathlib.Path) -> None:
    """History with updates, an undo and several transactions."""
    db = ZODB.DB(ZODB.FileStorage.FileStorage(str(path)))
    try:
        with db.transaction("create") as conn:
            # Who and from where, as Zope records them: a copy keeps them.
            created = conn.transaction_manager.get()
            created.setUser("operator", "/site")
            created.setExtendedInfo("request", "/site/@@create")
            for i in range(20):
                conn.root()[i] = PersistentMapping(value=i)
        for i in range(10):
            with db.transaction(f"update {i}") as conn:
                conn.root()[i]["value"] = -i
        db.undo(db.undoLog(0, 1)[0]["id"])
        transaction.commit()
    finally:
        db.close()


def resume_at(source: Any, dest: Any) -> bytes:
    """``copying.resume_point`` of a destination that is behind: a tid, not None."""
    start = copying.resume_point(source, dest)
    assert start is not None
    return start


def blob_filestorage(tmp_path: pathlib.Path, name: str) -> Any:
    return ZODB.blob.BlobStorage(str(tmp_path / f"{name}.blobs"),
                                 ZODB.FileStorage.FileStorage(str(tmp_path / f"{name}.fs")))


def history(storage: Any) -> list[tuple[Any, ...]]:
    """Every transaction's tid, status, user, description and extension, and its
    records (oid, data, the tid whose data an undo copied)."""
    return [(txn.tid, txn.status, txn.user, txn.description, txn.extension,
             sorted((r.oid, r.data, r.data_txn) for r in txn))
            for txn in storage.iterator()]


def test_round_trip(storage_factory: Any, tmp_path: pathlib.Path) -> None:
    make_filestorage(tmp_path / "Source.fs")
    source = ZODB.FileStorage.FileStorage(str(tmp_path / "Source.fs"), read_only=True)
    middle = storage_factory.open()
    back = ZODB.FileStorage.FileStorage(str(tmp_path / "Back.fs"))
    try:
        counts = copying.copy_transactions(source, middle, resume_at(source, middle))
        assert (counts.transactions, counts.records) == (13, 33)
        if storage_factory.param.keep_history:
            assert history(middle) == history(source)
        copying.copy_transactions(middle, back, resume_at(middle, back))
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
            copying.copy_transactions(source, dest, resume_at(source, dest),
                                      stop_after_five)
        rest = copying.copy_transactions(source, dest, resume_at(source, dest))
        assert rest.transactions == 8
        if storage_factory.param.keep_history:
            assert history(dest) == history(source)
        # Either way every object is there once, in its current state, with its serial.
        oids = {r.oid for txn in source.iterator() for r in txn}
        assert len(dest) == len(oids) == 20 + 1
        for oid in oids:
            assert ZODB.utils.load_current(dest, oid) == ZODB.utils.load_current(source, oid)
        assert dest.lastTransaction() == source.lastTransaction()
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
        with pytest.raises(copying.ConfigurationError) as refused:
            copying.resume_point(source, dest)
        assert str(refused.value) == (
            f"the destination's last transaction 0x{u64(dest.lastTransaction()):016x} is not"
            " in the source: it holds other data (empty it first, for zodbsql with --clear)")
    finally:
        source.close()
        db.close()


def test_blobs_round_trip_byte_identical(storage_factory: Any, tmp_path: pathlib.Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """FileStorage with blobs -> zodbsql -> FileStorage: every blob revision identical."""
    from ZODB.blob import Blob

    def filestorage(name: str) -> Any:
        return blob_filestorage(tmp_path, name)
    source = filestorage("source")
    db = ZODB.DB(source)
    with db.transaction() as conn:
        conn.root()["a"] = Blob(b"first version of a" * 1000)
        conn.root()["b"] = Blob(b"b" * 70_000)
    with db.transaction() as conn:
        with conn.root()["a"].open("w") as f:
            f.write(b"second version of a")
        conn.root()["c"] = Blob(b"b" * 70_000)  # same content as b
    db.close()

    def blobs(storage: Any) -> dict[tuple[bytes, bytes], bytes]:
        found = {}
        for txn in storage.iterator():
            for record in txn:
                if record.data and ZODB.blob.is_blob_record(record.data):
                    with open(storage.loadBlob(record.oid, record.tid), "rb") as f:
                        found[(record.oid, record.tid)] = f.read()
        return found
    source = filestorage("source")
    middle = storage_factory.open(blob_dir=str(tmp_path / "middle-blobs"))
    back = filestorage("back")
    try:
        scratch = tmp_path / "scratch"   # the temporary directory while copying
        scratch.mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(scratch))
        copied = copying.copy_transactions(source, middle, resume_at(source, middle))
        assert copied.blobs == 4
        assert copying.count_from(source, z64).blobs == 4
        assert os.listdir(scratch) == []   # the blob copies were taken over, then removed
        copying.copy_transactions(middle, back, resume_at(middle, back))
        expected = blobs(source)
        assert len(expected) == 4
        if storage_factory.param.keep_history:
            assert blobs(middle) == expected
            assert blobs(back) == expected
        else:  # only the current revisions survive a history-free storage
            current = {oid: data for (oid, _), data in blobs(back).items()}
            assert sorted(current.values()) == sorted(
                [b"second version of a", b"b" * 70_000, b"b" * 70_000])
    finally:
        source.close()
        back.close()


def test_counts_say_what_was_copied(storage_factory: Any, tmp_path: pathlib.Path) -> None:
    """What ``zodbsql convert`` prints and checks: transactions, records, bytes, the
    first tid copied; counting the source from there gives the same numbers."""
    make_filestorage(tmp_path / "Source.fs")
    source = ZODB.FileStorage.FileStorage(str(tmp_path / "Source.fs"), read_only=True)
    dest = storage_factory.open()
    try:
        records = [r for txn in source.iterator() for r in txn]
        seen: list[tuple[int, bytes]] = []
        counts = copying.copy_transactions(
            source, dest, resume_at(source, dest),
            lambda so_far, tid: seen.append((so_far.transactions, tid)))
        tids = [txn.tid for txn in source.iterator()]
        assert counts == copying.CopyCounts(
            transactions=len(tids), records=len(records), blobs=0,
            data_bytes=sum(len(r.data or b"") for r in records), first_tid=tids[0])
        assert seen == list(enumerate(tids, 1))
        assert copying.count_from(source, tids[0]) == dataclasses.replace(counts,
                                                                          first_tid=None)
        assert copying.count_from(source, tids[3]).transactions == len(tids) - 3
    finally:
        source.close()


def test_resumes_right_after_the_last_copied_tid(storage_factory: Any) -> None:
    """Consecutive tids (nothing between two transactions): the copy goes on at the
    next one, neither repeating the last one copied nor skipping one."""
    source = storage_factory.open()
    tids = restore_consecutive(source, 4)
    dest = storage_factory.open_other()
    copied = copying.copy_transactions(source, dest, resume_at(source, dest))
    assert copied.transactions == 4 and copying.resume_point(source, dest) is None
    partial = storage_factory.open_other()
    restore_consecutive(partial, 1)    # the same first transaction as the source's
    assert copying.resume_point(source, partial) == tids[1]
    rest = copying.copy_transactions(source, partial, tids[1])
    assert rest.transactions == 3 and partial.lastTransaction() == tids[-1]
    assert [t.tid for t in partial.iterator()] == tids


def test_refuses_blobs_for_a_destination_without_blob_support(
        storage_factory: Any, tmp_path: pathlib.Path) -> None:
    source = storage_factory.open(blob_dir=str(tmp_path / "blobs"))
    db = ZODB.DB(source)
    with db.transaction() as conn:
        conn.root()["plain"] = PersistentMapping()
    with db.transaction() as conn:
        conn.root()["blob"] = ZODB.blob.Blob(b"content")
    dest = ZODB.FileStorage.FileStorage(str(tmp_path / "NoBlobs.fs"))
    try:
        with pytest.raises(copying.ConfigurationError) as refused:
            copying.copy_transactions(source, dest, resume_at(source, dest))
        assert str(refused.value) == "the source has blobs but the destination stores none"
        assert dest.tpc_transaction() is None   # the refused transaction was aborted
        # The transaction with the blob was aborted; those before it were copied.
        assert dest.lastTransaction() < source.lastTransaction()
        assert copying.resume_point(source, dest) == p64(u64(dest.lastTransaction()) + 1)
    finally:
        dest.close()
        db.close()


class TestCopyKeepsHistory:
    history_modes = (True,)
    history_modes_reason = "a history-free storage keeps neither packed transactions nor undos"

    def test_packed_transactions_stay_marked_packed(self, storage_factory: Any,
                                                    tmp_path: pathlib.Path) -> None:
        source = storage_factory.open()
        db = ZODB.DB(source)
        for i in range(3):
            with db.transaction() as conn:
                conn.root()["v"] = i
        pack_time = time.time()
        with db.transaction() as conn:
            conn.root()["v"] = "after the pack"
        source.pack(pack_time)
        back = ZODB.FileStorage.FileStorage(str(tmp_path / "Back.fs"))
        try:
            copying.copy_transactions(source, back, resume_at(source, back))
            statuses = [(txn.tid, txn.status) for txn in source.iterator()]
            assert [status for _, status in statuses] == ["p", " "]
            assert [(txn.tid, txn.status) for txn in back.iterator()] == statuses
        finally:
            back.close()
            db.close()

    def test_an_undone_blob_change_copies_as_a_copy_of_the_earlier_revision(
            self, storage_factory: Any, tmp_path: pathlib.Path) -> None:
        source = blob_filestorage(tmp_path, "source")
        db = ZODB.DB(source)
        with db.transaction() as conn:
            conn.root()["a"] = ZODB.blob.Blob(b"first")
        with db.transaction() as conn:
            with conn.root()["a"].open("w") as f:
                f.write(b"second")
        db.undo(db.undoLog(0, 1)[0]["id"])
        transaction.commit()
        db.close()
        source = blob_filestorage(tmp_path, "source")
        middle = storage_factory.open(blob_dir=str(tmp_path / "middle-blobs"))
        try:
            copying.copy_transactions(source, middle, resume_at(source, middle))
            assert history(middle) == history(source)
            undone = [r for r in list(middle.iterator())[-1] if r.data_txn is not None]
            assert len(undone) == 1
            with open(middle.loadBlob(undone[0].oid, middle.lastTransaction()), "rb") as f:
                assert f.read() == b"first"
        finally:
            source.close()


def test_a_source_opened_without_its_blobs_copies_the_records_alone(
        storage_factory: Any, tmp_path: pathlib.Path) -> None:
    """Blob records of a source that does not serve blobs (opened without its blob
    directory) are copied as records, to a destination that stores no blobs either."""
    with_blobs = storage_factory.open(blob_dir=str(tmp_path / "blobs"))
    db = ZODB.DB(with_blobs)
    with db.transaction() as conn:
        conn.root()["b"] = ZODB.blob.Blob(b"content")
    db.close()
    source = storage_factory.open()
    dest = ZODB.FileStorage.FileStorage(str(tmp_path / "NoBlobs.fs"))
    try:
        counts = copying.copy_transactions(source, dest, resume_at(source, dest))
        assert counts.blobs == 0 and counts.records >= 2   # the root and the blob's
        assert dest.lastTransaction() == source.lastTransaction()
    finally:
        dest.close()


def test_temporary_files_stay_in_one_named_directory_removed_at_the_end(
        storage_factory: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While copying, the temporary directory holds one directory, zodbsql-copy-*, that
    a copy killed halfway leaves behind recognisably; a finished copy removes it."""
    source = blob_filestorage(tmp_path, "source")
    db = ZODB.DB(source)
    with db.transaction() as conn:
        conn.root()["b"] = ZODB.blob.Blob(b"content")
    db.close()
    source = blob_filestorage(tmp_path, "source")
    dest = storage_factory.open(blob_dir=str(tmp_path / "dest-blobs"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    during: list[list[str]] = []
    try:
        copying.copy_transactions(source, dest, resume_at(source, dest),
                                  lambda counts, tid: during.append(os.listdir(scratch)))
        assert len(during) == 2
        assert all(len(names) == 1 and names[0].startswith("zodbsql-copy-")
                   for names in during)
        assert os.listdir(scratch) == []
    finally:
        source.close()
