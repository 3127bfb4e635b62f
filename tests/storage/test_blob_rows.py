"""The blob rows read back as they are: every reference and every content listed however
the listing is paged, the revision verify names for a reference without content, and a
load that finds a content or a chunk missing naming which."""
from __future__ import annotations

import hashlib
import os
import pickle
import time
from typing import Any

import pytest
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import POSKeyError
from ZODB.utils import p64, u64, z64

from zodbsql.storage.verify import verify

CHUNK = 1024
#: Any record will do: these tests read the blob rows, never the objects' states.
RECORD = pickle.dumps(("ZODB.blob", "Blob"), 3)


def commit_blobs(storage: Any, tmp_path: Any, contents: dict[int, bytes]) -> int:
    """One transaction storing a blob revision of each oid (0 included); its tid."""
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    for oid, data in contents.items():
        try:
            previous = storage.load(p64(oid))[1]
        except POSKeyError:
            previous = z64
        path = tmp_path / f"upload-{oid}-{time.monotonic_ns()}"
        path.write_bytes(data)
        storage.storeBlob(p64(oid), previous, RECORD, str(path), "", txn)
    storage.tpc_vote(txn)
    tid = storage.tpc_finish(txn)
    return u64(tid)


def rows(storage: Any, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    conn = storage.backend.connect()
    try:
        return conn.fetchall(sql, params)
    finally:
        conn.close()


def change(storage: Any, *statements: tuple[str, tuple[Any, ...]]) -> None:
    conn = storage.backend.connect()
    try:
        conn.begin_write()
        for sql, params in statements:
            conn.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


@pytest.fixture
def blob_storage(storage_factory: Any, tmp_path: Any) -> Any:
    return storage_factory.open(blob_dir=str(tmp_path / "cache"), blob_chunk_size=CHUNK)


def test_every_reference_and_content_is_listed_whatever_the_page_size(
        blob_storage: Any, tmp_path: Any) -> None:
    storage = blob_storage
    first = commit_blobs(storage, tmp_path, {0: b"zero", 1: b"one", 2: os.urandom(3000)})
    second = commit_blobs(storage, tmp_path, {1: b"one again", 3: b"zero"})
    blobs = storage.shared.backend.blobs
    # History-free keeps each object's newest revision only.
    expected_refs = [(0, first), (1, first), (1, second), (2, first), (3, second)]
    if not storage.shared.backend.keep_history:
        expected_refs.remove((1, first))
    contents = {hashlib.sha256(data).digest(): len(data)
                for data in (b"zero", b"one", b"one again")}
    conn = storage.backend.connect()
    try:
        for batch in (1, 2, 3, 500):
            refs = list(blobs.iter_refs(conn, batch=batch))
            assert [(ref.oid, ref.tid) for ref in refs] == expected_refs, batch
            hashes = {(ref.oid, ref.tid): ref.content_hash for ref in refs}
            assert hashes[(3, second)] == hashes[(0, first)] == hashlib.sha256(b"zero").digest()
            listed = list(blobs.iter_contents(conn, batch=batch))
            assert [c.content_hash for c in listed] == sorted(c.content_hash for c in listed)
            assert len(listed) == 4   # "one" too: freed by a pack, not by a commit
            sizes = {c.content_hash: c.size for c in listed}
            assert {h: sizes[h] for h in contents} == contents, batch
            assert sizes[hashes[(2, first)]] == 3000
            assert {c.content_hash: c.chunks for c in listed}[hashes[(2, first)]] == 3
        assert blobs.content(conn, hashes[(2, first)]) == (3000, 3)
        assert blobs.content(conn, b"\0" * 32) is None
        assert blobs.content_hash(conn, 9, first) is None
    finally:
        conn.close()


def test_verify_names_the_revisions_whose_content_is_gone(
        blob_storage: Any, tmp_path: Any) -> None:
    storage = blob_storage
    tid = commit_blobs(storage, tmp_path, {0: b"kept", 2: b"lost", 3: b"lost"})
    assert verify(storage).clean
    lost = hashlib.sha256(b"lost").digest()
    change(storage, ("DELETE FROM blob_chunk WHERE content_hash = %s", (lost,)),
           ("DELETE FROM blob_content WHERE content_hash = %s", (lost,)))
    problems = verify(storage).problems
    assert [(p.kind, p.oid, p.tid) for p in problems] == [
        ("blob-missing", 2, tid), ("blob-missing", 3, tid)]
    assert problems[0].detail == f"its blob content {lost.hex()} is not in the database"


def test_verify_names_the_missing_chunk(blob_storage: Any, tmp_path: Any) -> None:
    storage = blob_storage
    data = os.urandom(3 * CHUNK)
    tid = commit_blobs(storage, tmp_path, {2: data})
    content = hashlib.sha256(data).digest()
    change(storage, ("DELETE FROM blob_chunk WHERE content_hash = %s AND chunk_num = 1",
                     (content,)))
    (problem,) = verify(storage).problems
    assert (problem.kind, problem.oid, problem.tid) == ("blob-corrupt", 2, tid)
    assert problem.detail == f"blob content {content.hex()}: chunk 1 of 3 is missing"


def test_a_load_names_the_missing_content_or_chunk(blob_storage: Any, tmp_path: Any) -> None:
    storage = blob_storage
    data = os.urandom(3 * CHUNK)
    tid = commit_blobs(storage, tmp_path, {1: data, 2: b"small"})
    content = hashlib.sha256(data).digest()
    small = hashlib.sha256(b"small").digest()
    # Nothing cached: each load downloads.
    for content_hash in (content, small):
        storage.shared.blob_files.cache.evict(content_hash)
    change(storage, ("DELETE FROM blob_chunk WHERE content_hash = %s AND chunk_num = 2",
                     (content,)),
           ("DELETE FROM blob_chunk WHERE content_hash = %s", (small,)),
           ("DELETE FROM blob_content WHERE content_hash = %s", (small,)))
    with pytest.raises(POSKeyError) as caught:
        storage.loadBlob(p64(1), p64(tid))
    assert caught.value.args == (f"chunk 2 of blob content {content.hex()} is missing",
                                 p64(1), p64(tid))
    with pytest.raises(POSKeyError) as caught:
        storage.loadBlob(p64(2), p64(tid))
    assert caught.value.args == (f"the blob content {small.hex()} is missing",
                                 p64(2), p64(tid))
    # Nothing partial was left in the cache.
    assert storage.shared.blob_files.cache.lookup(content) is None


def test_a_load_refuses_a_content_its_chunks_do_not_make(
        blob_storage: Any, tmp_path: Any) -> None:
    storage = blob_storage
    data = os.urandom(2 * CHUNK)
    tid = commit_blobs(storage, tmp_path, {1: data})
    content = hashlib.sha256(data).digest()
    storage.shared.blob_files.cache.evict(content)
    change(storage, ("UPDATE blob_chunk SET data = %s WHERE content_hash = %s"
                     " AND chunk_num = 1", (b"x" * CHUNK, content)))
    with pytest.raises(POSKeyError) as caught:
        storage.loadBlob(p64(1), p64(tid))
    assert caught.value.args == (
        f"blob content {content.hex()} read from the database has {2 * CHUNK} bytes and"
        f" another hash (expected {2 * CHUNK} bytes)", p64(1), p64(tid))
    assert storage.shared.blob_files.cache.lookup(content) is None
    assert not [name for _, _, names in os.walk(storage.shared.blob_files.directory)
                for name in names if name.endswith(".part")]
