"""What ``verify`` reports, exactly: every stored revision counted and checked whatever
the batches, a damaged one found after a revision without state or one that does not
decode, the progress, each problem's oid, tid and words, and the blobs counted and
checked in the database and in a shared blob directory.  An operator runs verify to
learn whether data was lost: a check that stops early or names the wrong revision
hides it."""
from __future__ import annotations

import hashlib
import os
import pathlib
from typing import Any

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.blob import Blob
from ZODB.utils import u64

from tests.storage.test_atrest import key_file, new_key
from tests.storage.test_blob_rows import rows
from tests.storage.test_verify import run_sql
from zodbsql.errors import CorruptRecordError
from zodbsql.storage.verify import Problem, verify

#: More revisions than one of the checker's batches (500) holds, twice over.
OBJECTS = 1100


def stored_rows(storage: Any) -> list[tuple[int, int, bytes | None]]:
    return [(int(oid), int(tid), bytes(state) if state is not None else None)
            for oid, tid, state in rows(
                storage, "SELECT zoid, tid, state FROM object_state ORDER BY zoid, tid")]


def revision(obj: Any) -> tuple[int, int]:
    """``obj``'s oid and the tid of its revision loaded (a ghost's serial is z64)."""
    obj._p_activate()
    return u64(obj._p_oid), u64(obj._p_serial)


def fill(storage: Any, count: int = OBJECTS) -> ZODB.DB:
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        conn.root()["items"] = items = PersistentMapping()
        for key in range(count):
            items[key] = PersistentMapping(n=key)
    return db


def damage(storage: Any, oid: int, state: bytes) -> None:
    run_sql(storage, "UPDATE object_state SET state = %s WHERE zoid = %s", (state, oid))


def test_every_revision_is_counted_with_its_bytes_and_progress(storage_factory: Any) -> None:
    storage = storage_factory.open()
    db = fill(storage)
    try:
        rows = stored_rows(storage)
        calls: list[tuple[int, int]] = []
        report = verify(storage, lambda done, total: calls.append((done, total)))
        assert report.clean
        assert report.states == len(rows) > 1000
        assert report.bytes == sum(len(state) for _, _, state in rows if state is not None)
        assert calls == [(500, len(rows)), (1000, len(rows)), (len(rows), len(rows))]
        assert (report.blobs, report.blob_bytes) == (0, 0)
    finally:
        db.close()


def test_damage_after_a_revision_without_state_and_in_a_later_batch_is_found(
        storage_factory: Any) -> None:
    storage = storage_factory.open()
    db = fill(storage)
    try:
        rows = [row for row in stored_rows(storage) if row[0] > 1]
        # A revision without a state (as a deletion's), then a damaged one right after
        # it in the same batch, and one in the last batch.
        (empty, _, _), (near, near_tid, near_state), (far, far_tid, _) = (
            rows[0], rows[1], rows[-1])
        assert near_state is not None
        run_sql(storage, "UPDATE object_state SET state = NULL, checksum = NULL"
                " WHERE zoid = %s", (empty,))
        damage(storage, near, b"x" * len(near_state))
        damage(storage, far, b"y" * 3)
        report = verify(storage)
        checksums = [p for p in report.problems if p.kind == "checksum"]
        assert checksums == [
            Problem("checksum", near, near_tid,
                    f"state of {len(near_state)} bytes does not match its checksum"),
            Problem("checksum", far, far_tid, "state of 3 bytes does not match its checksum")]
        assert str(checksums[1]) == (f"checksum: oid 0x{far:016x} tid 0x{far_tid:016x}:"
                                     " state of 3 bytes does not match its checksum")
        assert report.states == len(stored_rows(storage))
    finally:
        db.close()


def test_a_record_that_does_not_decode_is_named_and_the_rest_still_checked(
        storage_factory: Any, tmp_path: pathlib.Path) -> None:
    storage = storage_factory.open(compress="zstd", compress_threshold=0,
                                   key_file=key_file(tmp_path, new_key()))
    db = fill(storage, 10)
    try:
        # Clean under the database's keyed checksums: verify checks with the key.
        assert verify(storage).clean
        rows = [row for row in stored_rows(storage) if row[0] > 1]
        (broken, broken_tid, broken_state), (later, later_tid, _) = rows[0], rows[1]
        assert broken_state is not None
        garbled = broken_state[:-4] + bytes(b ^ 0xFF for b in broken_state[-4:])
        damage(storage, broken, garbled)
        damage(storage, later, storage.shared.codec.encode(later, b"not the state"))
        with pytest.raises(CorruptRecordError) as caught:
            storage.shared.codec.decode(broken, broken_tid, garbled)
        expected = str(caught.value)
        problems = verify(storage).problems
        assert [(p.kind, p.oid, p.tid) for p in problems] == [
            ("checksum", broken, broken_tid), ("checksum", later, later_tid)]
        assert problems[0].detail == expected
        assert f"0x{broken:016x}" in expected or str(broken) in expected
        assert problems[1].detail == "state of 13 bytes does not match its checksum"
    finally:
        db.close()


def blob_db(storage: Any, contents: dict[str, bytes]
            ) -> tuple[ZODB.DB, dict[str, tuple[int, int]]]:
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        for name, data in contents.items():
            conn.root()[name] = Blob(data)
    with db.transaction() as conn:
        return db, {name: revision(conn.root()[name]) for name in contents}


def test_blobs_in_the_database_counted_and_each_damage_named(
        storage_factory: Any, tmp_path: pathlib.Path) -> None:
    storage = storage_factory.open(blob_dir=str(tmp_path / "cache"), blob_chunk_size=1024)
    contents = {"short": os.urandom(700), "swapped": os.urandom(2500),
                "kept": os.urandom(3000)}
    db, revisions = blob_db(storage, contents)
    try:
        report = verify(storage)
        assert report.clean
        assert report.blobs == 3
        assert report.blob_bytes == sum(map(len, contents.values()))
        short = hashlib.sha256(contents["short"]).digest()
        swapped = hashlib.sha256(contents["swapped"]).digest()
        orphan = hashlib.sha256(b"orphan").digest()
        run_sql(storage, "UPDATE blob_content SET size = %s WHERE content_hash = %s",
                (800, short))
        run_sql(storage, "UPDATE blob_chunk SET data = %s WHERE content_hash = %s"
                " AND chunk_num = 2", (os.urandom(2500 - 2048), swapped))
        # A content no revision refers to, damaged: named without an object.
        run_sql(storage, "INSERT INTO blob_content (content_hash, size, chunks)"
                " VALUES (%s, %s, %s)", (orphan, 6, 1))
        run_sql(storage, "INSERT INTO blob_chunk (content_hash, chunk_num, data)"
                " VALUES (%s, %s, %s)", (orphan, 0, b"orphaN"))
        report = verify(storage)
        assert report.blobs == 4
        assert report.blob_bytes == sum(map(len, contents.values())) + 6
        assert sorted(report.problems, key=lambda p: p.detail) == sorted([
            Problem("blob-corrupt", *revisions["short"],
                    f"blob content {short.hex()}: its chunks hold 700 bytes, 800 recorded"),
            Problem("blob-corrupt", *revisions["swapped"],
                    f"blob content {swapped.hex()}: its chunks do not have the recorded"
                    " SHA-256"),
            Problem("blob-corrupt", 0, 0,
                    f"blob content {orphan.hex()}: its chunks do not have the recorded"
                    " SHA-256")], key=lambda p: p.detail)
    finally:
        db.close()


def test_blob_files_of_a_shared_directory_counted_and_each_damage_named(
        storage_factory: Any, tmp_path: pathlib.Path) -> None:
    storage = storage_factory.open(blob_dir=str(tmp_path / "shared"), shared_blob_dir=True)
    contents = {"gone": b"g" * 100, "changed": b"c" * 200, "kept": b"k" * 300}
    db, revisions = blob_db(storage, contents)
    try:
        report = verify(storage)
        assert report.clean and (report.blobs, report.blob_bytes) == (3, 600)
        files = storage.shared.blob_files
        gone = files.revision_path(*revisions["gone"])
        changed = files.revision_path(*revisions["changed"])
        os.remove(gone)
        os.chmod(changed, 0o600)
        pathlib.Path(changed).write_bytes(b"C" * 250)
        report = verify(storage)
        assert (report.blobs, report.blob_bytes) == (3, 550)
        assert sorted(report.problems, key=lambda p: p.kind) == [
            Problem("blob-corrupt", *revisions["changed"],
                    f"the blob file {changed} (250 bytes) does not have the recorded"
                    " SHA-256"),
            Problem("blob-missing", *revisions["gone"],
                    f"the blob file {gone} does not exist")]
    finally:
        transaction.abort()
        db.close()


def test_references_are_checked_from_current_revisions_only(storage_factory: Any) -> None:
    """A revision before the current one may name an object a pack has since removed
    (history-preserving): not a problem.  A current revision naming an object whose
    current revision is a deletion is one."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["holder"] = PersistentMapping(child=PersistentMapping(x=1))
        with db.transaction() as conn:
            holder = conn.root()["holder"]
            child = u64(holder["child"]._p_oid)
            del holder["child"]
            holder["other"] = PersistentMapping(y=2)
        with db.transaction() as conn:
            holder = conn.root()["holder"]
            holder_oid, holder_tid = revision(holder)
            other_oid = u64(holder["other"]._p_oid)
        gone(storage_factory, storage, child)
        assert verify(storage).clean
        named = [Problem("dangling-reference", holder_oid, holder_tid,
                         f"refers to oid 0x{other_oid:016x}, which does not exist")]
        if storage_factory.param.keep_history:
            run_sql(storage, "UPDATE object_state SET state = NULL, checksum = NULL"
                    " WHERE zoid = %s", (other_oid,))
            assert verify(storage).problems == named
        gone(storage_factory, storage, other_oid)
        assert verify(storage).problems == named
    finally:
        db.close()


def gone(storage_factory: Any, storage: Any, oid: int) -> None:
    """Every row of ``oid`` deleted, as a pack's garbage collection does."""
    run_sql(storage, "DELETE FROM object_state WHERE zoid = %s", (oid,))
    if storage_factory.param.keep_history:
        run_sql(storage, "DELETE FROM current_object WHERE zoid = %s", (oid,))
