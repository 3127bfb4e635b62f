"""How the storage serves a blob revision (``loadBlob``, ``openCommittedBlobFile``), copies
one (``restoreBlob``) and refuses a blob call or layout it can't serve: what each asks
of the database, and the words of each refusal (a revision without a blob:
test_blobs.py)."""
from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest
import transaction
import ZODB
from ZODB.blob import Blob
from ZODB.POSException import Unsupported
from ZODB.utils import p64

from zodbsql.errors import SchemaError


def _blob_db(storage_factory: Any, tmp_path: pathlib.Path, **options: Any) -> Any:
    return ZODB.DB(storage_factory.open(blob_dir=str(tmp_path / "cache"), **options))


def _commit_blobs(db: Any, contents: dict[str, bytes]) -> dict[str, tuple[bytes, bytes]]:
    """Each content as a new blob under the root's key; its (oid, tid)."""
    blobs = {key: Blob(data) for key, data in contents.items()}
    with db.transaction() as conn:
        conn.root().update(blobs)
    # (A committed blob is a ghost again, its serial unset: the tid is the load's.)
    return {key: (blob._p_oid, db.storage.load(blob._p_oid)[1])
            for key, blob in blobs.items()}


def test_a_storage_without_blob_dir_says_which_setting_turns_blobs_on(
        storage_factory: Any) -> None:
    storage = storage_factory.open()
    wanted = (f"storage {storage.getName()} has no blob-dir, so it does not store blobs"
              " (set blob-dir to store them)",)
    for call in (storage.temporaryDirectory, lambda: storage.loadBlob(p64(1), p64(1))):
        with pytest.raises(Unsupported) as refused:
            call()
        assert refused.value.args == wanted


def test_the_recorded_blob_layout_refuses_the_other_naming_the_setting_to_use(
        storage_factory: Any, tmp_path: pathlib.Path) -> None:
    """A database that keeps its blobs in one layout refuses a storage configured for the
    other, saying which layout it has and which value of shared-blob-dir opens it; in
    both directions (each layout recorded by the first storage with a blob-dir)."""
    first = storage_factory.open(blob_dir=str(tmp_path / "cache"))
    described = first.shared.backend.describe()
    first.close()
    with pytest.raises(SchemaError) as refused:
        storage_factory.open(blob_dir=str(tmp_path / "shared"), shared_blob_dir=True)
    assert str(refused.value) == (
        f"{described} keeps its blobs in the database layout, but the storage was"
        " configured for the shared-directory layout (shared-blob-dir true); set"
        " shared-blob-dir false to open it")
    other_database = storage_factory.new_path()
    shared = storage_factory.open(other_database, blob_dir=str(tmp_path / "shared"),
                                  shared_blob_dir=True)
    other = shared.shared.backend.describe()
    shared.close()
    with pytest.raises(SchemaError) as refused:
        storage_factory.open(other_database, blob_dir=str(tmp_path / "cache2"))
    assert str(refused.value) == (
        f"{other} keeps its blobs in the shared-directory layout, but the storage was"
        " configured for the database layout (shared-blob-dir false); set"
        " shared-blob-dir true to open it")


def test_what_a_blob_load_asks_of_the_database(storage_factory: Any,
                                                tmp_path: pathlib.Path) -> None:
    """A reader with a cache of its own: the first load of a revision asks for its
    content's hash, then downloads it inside a read transaction of its own (the content
    row and its chunks from one snapshot), ended after; the same revision again asks
    nothing (the hash is remembered, the file cached); another object's revision of the
    same content asks only for the hash and is served the cached file."""
    db = _blob_db(storage_factory, tmp_path)
    try:
        data = os.urandom(5000)
        blobs = _commit_blobs(db, {"a": data, "b": data})
        reader = storage_factory.open(blob_dir=str(tmp_path / "reader"))
        conn = reader._conn()
        backend_blobs = reader.shared.backend.blobs
        download = backend_blobs.download
        seen: list[bool] = []

        def recorded(*args: Any, **kw: Any) -> Any:
            seen.append(conn.in_transaction)
            return download(*args, **kw)
        backend_blobs.download = recorded
        assert not conn.in_transaction
        before = reader.statement_count()
        path = reader.loadBlob(*blobs["a"])
        assert pathlib.Path(path).read_bytes() == data
        assert seen == [True] and not conn.in_transaction
        assert reader.statement_count() > before
        before = reader.statement_count()
        assert reader.loadBlob(*blobs["a"]) == path
        assert reader.statement_count() == before
        assert reader.loadBlob(*blobs["b"]) == path
        assert reader.statement_count() == before + 1
        assert seen == [True]
    finally:
        db.close()


def test_a_cached_file_pruned_before_it_is_opened_is_loaded_again(
        storage_factory: Any, tmp_path: pathlib.Path) -> None:
    """``openCommittedBlobFile``: a file another process's prune removed between the load
    and the open is loaded again, up to five times; then the error is the caller's."""
    db = _blob_db(storage_factory, tmp_path)
    try:
        oid, tid = _commit_blobs(db, {"a": b"the content"})["a"]
        storage = db.storage
        load = storage.loadBlob
        calls: list[int] = []

        def pruned_first(times: int) -> Any:
            def loaded(*args: Any) -> str:
                calls.append(1)
                if len(calls) <= times:
                    return str(tmp_path / "pruned-meanwhile")
                return load(*args)
            return loaded
        storage.loadBlob = pruned_first(4)
        with storage.openCommittedBlobFile(oid, tid) as opened:
            assert opened.read() == b"the content"
        assert len(calls) == 5
        calls.clear()
        storage.loadBlob = pruned_first(5)
        with pytest.raises(FileNotFoundError):
            storage.openCommittedBlobFile(oid, tid)
        assert len(calls) == 5
    finally:
        db.close()


def test_a_copied_undo_of_a_blob_keeps_the_revision_it_came_from(
        storage_factory: Any, tmp_path: pathlib.Path) -> None:
    """An undo records the blob revision it brings back as a copy (``data_txn``); a copy
    of the database (``copyTransactionsFrom``, ``restoreBlob`` with that tid) records
    the same, and serves the same content."""
    if not storage_factory.param.keep_history:
        pytest.skip("history-free: no undo")
    db = _blob_db(storage_factory, tmp_path)
    try:
        oid, first = _commit_blobs(db, {"a": b"first"})["a"]
        with db.transaction() as conn:
            with conn.root()["a"].open("w") as file:
                file.write(b"second")
        db.undo(db.undoLog(0, 1)[0]["id"])
        transaction.commit()
        source = db.storage
        copy = storage_factory.open_other(blob_dir=str(tmp_path / "copy"))
        copy.copyTransactionsFrom(source)
        undone = list(copy.iterator())[-1]
        (record,) = [each for each in undone if each.oid == oid]
        assert record.data_txn == first
        with copy.openCommittedBlobFile(oid, undone.tid) as opened:
            assert opened.read() == b"first"
    finally:
        db.close()
