"""Blobs beyond ZODB's suite: deduplication, pack, verify, the content check at
finish, a cache shared by processes while it is pruned, a large blob's memory use."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
import transaction
import ZODB
from ZODB.blob import Blob
from ZODB.Connection import TransactionMetaData
from ZODB.interfaces import IBlobStorage, IBlobStorageRestoreable
from ZODB.POSException import ConflictError, POSKeyError, Unsupported
from ZODB.utils import p64, z64
from zope.interface.verify import verifyObject

from zodbsql.backends.base.txncontrol import blob_vanished
from zodbsql.errors import BlobContentVanished
from zodbsql.storage.verify import verify

CHUNK = 4096


def count(storage: Any, table: str) -> int:
    conn = storage.backend.connect()
    try:
        return int(conn.fetchone(f"SELECT COUNT(*) FROM {table}")[0])
    finally:
        conn.close()


def read(blob: Blob) -> bytes:
    with blob.open() as f:
        return f.read()


def test_interfaces_only_with_a_blob_dir(storage_factory, tmp_path) -> None:
    plain = storage_factory.open()
    assert not IBlobStorage.providedBy(plain)
    with pytest.raises(Unsupported, match="no blob-dir"):
        plain.temporaryDirectory()
    for shared in (False, True):
        storage = storage_factory.open_other(blob_dir=str(tmp_path / f"b{shared}"),
                                             shared_blob_dir=shared)
        assert verifyObject(IBlobStorage, storage)
        assert verifyObject(IBlobStorageRestoreable, storage)
        assert IBlobStorage.providedBy(storage.new_instance())


def test_same_content_is_stored_once_and_freed_with_its_last_revision(
        storage_factory, tmp_path) -> None:
    storage = storage_factory.open(blob_dir=str(tmp_path / "cache"), blob_chunk_size=CHUNK)
    db = ZODB.DB(storage)
    try:
        conn = db.open()
        root = conn.root()
        same, other = os.urandom(3 * CHUNK + 100), os.urandom(CHUNK + 1)
        root["a"] = Blob(same)
        transaction.commit()
        assert (count(storage, "blob_chunk"), count(storage, "blob_content")) == (4, 1)
        root["b"] = Blob(same)
        transaction.commit()
        # Dedup: the second object added a reference, no chunk, no content.
        assert (count(storage, "blob_chunk"), count(storage, "blob_content")) == (4, 1)
        assert count(storage, "blob_ref") == 2
        root["c"], root["d"] = Blob(same), Blob(same)  # twice in one commit
        transaction.commit()
        assert (count(storage, "blob_chunk"), count(storage, "blob_content")) == (4, 1)
        assert not os.listdir(storage.temporaryDirectory())  # nothing left behind
        del root["c"], root["d"]
        transaction.commit()
        with root["a"].open("w") as f:
            f.write(other)
        transaction.commit()
        assert count(storage, "blob_content") == 2
        db.pack()
        # b still uses the first content: nothing freed although a's old revision went.
        assert count(storage, "blob_content") == 2
        assert count(storage, "blob_ref") == 2
        assert read(root["a"]) == other and read(root["b"]) == same
        del root["b"]
        transaction.commit()
        db.pack()
        # The last revision using it is gone: its content and chunks are freed.
        assert (count(storage, "blob_chunk"), count(storage, "blob_content")) == (2, 1)
        assert count(storage, "blob_ref") == 1
        db.pack()  # run again: nothing still referenced goes
        assert count(storage, "blob_content") == 1
        conn2 = db.open(transaction_manager=transaction.TransactionManager())
        storage.shared.blob_files.cache.evict(hashlib.sha256(other).digest())
        assert read(conn2.root()["a"]) == other  # downloaded again from the chunks
        report = verify(storage)
        assert report.clean and report.blobs == 1
    finally:
        db.close()


def test_shared_directory_links_identical_content(storage_factory, tmp_path) -> None:
    storage = storage_factory.open(blob_dir=str(tmp_path / "shared"), shared_blob_dir=True)
    db = ZODB.DB(storage)
    try:
        conn = db.open()
        root = conn.root()
        data = os.urandom(5000)
        root["a"], root["b"] = Blob(data), Blob(data)
        transaction.commit()
        root["c"] = Blob(data)
        transaction.commit()
        paths = [root[k].committed() for k in "abc"]
        assert len({os.stat(p).st_ino for p in paths}) == 1  # one file, linked
        assert count(storage, "blob_chunk") == 0  # no data in the database
        del root["c"]
        transaction.commit()
        db.pack()
        assert not os.path.exists(paths[2]) and read(root["a"]) == data
        assert verify(storage).clean
        os.remove(paths[0])
        problems = verify(storage).problems
        assert [p.kind for p in problems] == ["blob-missing"]
    finally:
        db.close()


def test_verify_reports_corrupt_and_missing_contents(storage_factory, tmp_path) -> None:
    storage = storage_factory.open(blob_dir=str(tmp_path / "cache"), blob_chunk_size=CHUNK)
    db = ZODB.DB(storage)
    try:
        conn = db.open()
        conn.root()["a"] = Blob(os.urandom(2 * CHUNK))
        conn.root()["b"] = Blob(os.urandom(10))
        transaction.commit()
        assert verify(storage).clean
        raw = storage.backend.connect()
        raw.begin_write()
        raw.execute("UPDATE blob_chunk SET data = %s WHERE chunk_num = 1", (b"x" * CHUNK,))
        raw.execute("DELETE FROM blob_chunk WHERE content_hash = %s",
                    (hashlib.sha256(read(conn.root()["b"])).digest(),))
        raw.execute("DELETE FROM blob_content WHERE content_hash = %s",
                    (hashlib.sha256(read(conn.root()["b"])).digest(),))
        raw.commit()
        raw.close()
        kinds = sorted(p.kind for p in verify(storage).problems)
        assert kinds == ["blob-corrupt", "blob-missing"]
    finally:
        db.close()


def _store_blob(storage: Any, tmp_path: Any, data: bytes, record: bytes) -> Any:
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    path = tmp_path / f"upload-{time.monotonic_ns()}"
    path.write_bytes(data)
    storage.storeBlob(storage.new_oid(), z64, record, str(path), "", txn)
    storage.tpc_vote(txn)
    return txn


def test_content_freed_between_vote_and_finish_is_a_retryable_conflict(
        storage_factory, tmp_path) -> None:
    storage = storage_factory.open(blob_dir=str(tmp_path / "cache"), blob_chunk_size=CHUNK)
    db = ZODB.DB(storage)
    data = os.urandom(3 * CHUNK)
    try:
        conn = db.open()
        conn.root()["a"] = Blob(data)
        transaction.commit()
        record = storage.load(conn.root()["a"]._p_oid)[0]
        txn = _store_blob(storage, tmp_path, data, record)  # dedup: nothing uploaded
        # What a concurrent pack would do (on the commit's own connection: SQLite's
        # single writer holds the lock from vote on).
        storage._pending.conn.execute("DELETE FROM blob_chunk WHERE chunk_num = 2")
        (staged,) = storage._pending.blob_files
        with pytest.raises(BlobContentVanished) as caught:
            storage.tpc_finish(txn)
        storage.tpc_abort(txn)
        # The message and the error name the object whose blob it was.
        assert str(caught.value).startswith(
            f"the blob content of oid 0x{staged:016x} was freed by a pack while this"
            " transaction committed; the transaction can be retried")
        assert caught.value.oid == p64(staged)
        assert isinstance(caught.value, ConflictError)
        assert isinstance(caught.value, transaction.interfaces.TransientError)
        txn = _store_blob(storage, tmp_path, data, record)  # the retry works
        storage.tpc_finish(txn)
    finally:
        db.close()


def test_load_blob_of_a_revision_without_one(storage_factory, tmp_path) -> None:
    storage = storage_factory.open(blob_dir=str(tmp_path / "cache"))
    db = ZODB.DB(storage)
    try:
        conn = db.open()
        transaction.commit()
        root_oid, tid = conn.root()._p_oid, storage.lastTransaction()
        with pytest.raises(POSKeyError) as missing:
            storage.loadBlob(root_oid, tid)
        assert missing.value.args == ("no blob for this revision", root_oid, tid)
    finally:
        db.close()


# -- several processes, one cache, pruned all the time ------------------------------------
READER = textwrap.dedent("""
    import hashlib, json, pickle, random, sys, time
    from zodbsql.api import open_storage
    from ZODB.utils import p64
    spec = json.loads(sys.argv[1])
    backend = pickle.loads(bytes.fromhex(spec["backend_options"]))  # any backend's options
    storage = open_storage(backend, keep_history=spec["keep_history"],
                           blob_dir=spec["blob_dir"], blob_cache_size=spec["cache_size"])
    cache = storage.shared.blob_files.cache
    cache.keep_recent = 0.05   # prune nearly everything, all the time
    errors, reads = [], 0
    while reads < spec["reads"]:   # a count, not a time: the same work on a slow machine
        oid, tid, want = random.choice(spec["blobs"])
        try:
            # The call that promises an open file, whatever the pruning does.
            with storage.openCommittedBlobFile(p64(oid), p64(tid)) as f:
                got = hashlib.sha256(f.read()).hexdigest()
            if got != want:
                errors.append(f"oid {oid}: partial or wrong content")
        except Exception as exc:
            errors.append(f"oid {oid}: {exc!r}")
        reads += 1
        time.sleep(0.005)  # let some files go unused for longer than keep_recent
    cache.wait()
    print(json.dumps({"reads": reads, "errors": errors[:5], "pruned": cache.pruned_files}))
    storage.close()
""")


def test_processes_sharing_a_cache_never_see_missing_or_partial_files(
        storage_factory, tmp_path) -> None:
    cache_dir = tmp_path / "shared-cache"
    storage = storage_factory.open(blob_dir=str(tmp_path / "writer-cache"))
    db = ZODB.DB(storage)
    blobs = []
    try:
        conn = db.open()
        for i in range(30):
            data = os.urandom(20_000 + i * 1000)
            conn.root()[i] = Blob(data)
            transaction.commit()
            conn.root()[i]._p_activate()
            blobs.append((int.from_bytes(conn.root()[i]._p_oid, "big"),
                          int.from_bytes(conn.root()[i]._p_serial, "big"),
                          hashlib.sha256(data).hexdigest()))
    finally:
        db.close()
    spec = {"backend_options": pickle.dumps(storage_factory.backend_options()).hex(),
            "keep_history": storage_factory.param.keep_history,
            "blob_dir": str(cache_dir), "cache_size": 50_000, "reads": 60,
            "blobs": blobs}
    procs = [subprocess.Popen([sys.executable, "-c", READER, json.dumps(spec)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(not r["errors"] for r in results), results
    assert [r["reads"] for r in results] == [60] * 4
    assert sum(r["pruned"] for r in results) > 0  # the cache really was pruned meanwhile
    assert not [p for p in cache_dir.rglob("*.part")]


# -- one large blob, memory far below its size ------------------------------------------
#: The issue's 1 GiB on SQLite (about 12 s here); the server backends take 256 MiB (a
#: 1 GiB round trip took about 29 s on PostgreSQL), checked against the same bounds.
LARGE_BLOB_MB = {"sqlite": 1024}
DEFAULT_LARGE_BLOB_MB = 256
LARGE = textwrap.dedent("""
    import hashlib, pickle, json, os, sys, time
    import transaction, ZODB
    from ZODB.blob import Blob
    from zodbsql.api import open_storage
    def peak_rss():
        # VmHWM: this process's peak resident set (ru_maxrss would also count the
        # parent's memory copied by fork before exec).
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    spec = json.loads(sys.argv[1])
    backend = pickle.loads(bytes.fromhex(spec["backend_options"]))  # any backend's options
    storage = open_storage(backend, keep_history=spec["keep_history"],
                           blob_dir=spec["blob_dir"])
    db = ZODB.DB(storage)
    conn = db.open()
    path = os.path.join(storage.temporaryDirectory(), "large")
    digest = hashlib.sha256()
    piece = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for i in range(spec["mb"]):
            block = i.to_bytes(8, "big") + piece[8:]
            digest.update(block)
            f.write(block)
    baseline = peak_rss()
    started = time.time()
    blob = Blob()
    blob.consumeFile(path)
    conn.root()["large"] = blob
    transaction.commit()
    blob._p_activate()
    files = storage.shared.blob_files
    files.cache.evict(digest.digest())   # read it back from the database
    check = hashlib.sha256()
    with storage.openCommittedBlobFile(blob._p_oid, blob._p_serial) as f:
        while data := f.read(1 << 20):
            check.update(data)
    peak = peak_rss()
    print(json.dumps({"ok": check.digest() == digest.digest(), "baseline": baseline,
                      "peak": peak, "seconds": time.time() - started}))
    db.close()
""")


class TestLargeBlob:
    history_modes = (True,)
    history_modes_reason = "the history mode does not change how blob data moves"

    def test_large_blob_round_trip_in_bounded_memory(self, storage_factory, tmp_path,
                                                     capsys) -> None:
        storage_factory.open().close()  # create the schema
        megabytes = LARGE_BLOB_MB.get(storage_factory.param.backend, DEFAULT_LARGE_BLOB_MB)
        spec = {"backend_options": pickle.dumps(storage_factory.backend_options()).hex(),
                "keep_history": True,
                "blob_dir": str(tmp_path / "cache"), "mb": megabytes}
        proc = subprocess.run([sys.executable, "-c", LARGE, json.dumps(spec)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["ok"]
        grown = result["peak"] - result["baseline"]
        size = megabytes << 20
        with capsys.disabled():
            print(f"\n  large blob {storage_factory.param.backend}: {megabytes} MiB in"
                  f" {result['seconds']:.1f} s, peak RSS {result['peak'] / 2**20:.0f} MiB"
                  f" (+{grown / 2**20:.0f} MiB during the round trip)")
        # The whole process (interpreter, ZODB, driver) stays far below the blob's size,
        # and the round trip itself adds far less than one eighth of it.
        assert result["peak"] < size / 3, result
        assert grown < size / 8, result


def test_blob_tables_are_added_to_a_database_made_before_blobs(storage_factory,
                                                               tmp_path) -> None:
    storage_factory.open().close()
    raw = storage_factory.open().backend.connect()
    raw.begin_write()
    for table in ("blob_ref", "blob_chunk", "blob_content"):
        raw.execute(f"DROP TABLE {table}")
    raw.commit()
    raw.close()
    storage = storage_factory.open(blob_dir=str(tmp_path / "cache"))
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["a"] = Blob(b"after the upgrade")
        with db.transaction() as conn:
            assert read(conn.root()["a"]) == b"after the upgrade"
        assert count(storage, "blob_ref") == 1
    finally:
        db.close()


def test_the_other_blob_layout_is_refused(storage_factory, tmp_path) -> None:
    from zodbsql.errors import SchemaError
    storage_factory.open(blob_dir=str(tmp_path / "cache")).close()
    with pytest.raises(SchemaError, match="shared-blob-dir false"):
        storage_factory.open(blob_dir=str(tmp_path / "shared"), shared_blob_dir=True)
    storage_factory.open().close()  # without blobs it opens
    storage_factory.open(blob_dir=str(tmp_path / "cache")).close()


def test_a_vanished_blob_whose_object_is_not_known_says_so() -> None:
    """PostgreSQL's finish function of before generation 8 reported a freed content
    without its object."""
    unnamed = blob_vanished(None)
    assert str(unnamed) == ("the blob content was freed by a pack while this transaction"
                            " committed; the transaction can be retried")
    assert unnamed.oid is None
    named = blob_vanished(0x2A)
    assert str(named).startswith(f"the blob content of oid 0x{0x2A:016x} was freed")
    assert named.oid == p64(0x2A)


def test_the_oid_postgresqls_finish_names_in_a_vanished_blobs_detail() -> None:
    from zodbsql.backends.postgresql.txncontrol import vanished_oid

    class Diagnostic:
        def __init__(self, detail: str | None) -> None:
            self.message_detail = detail

    class Error(Exception):
        def __init__(self, detail: str | None) -> None:
            self.diag = Diagnostic(detail)

    assert vanished_oid(Error("42")) == 42
    assert vanished_oid(Error("0")) == 0
    assert vanished_oid(Error(None)) is None       # a function of before generation 8
    assert vanished_oid(Error("")) is None
    assert vanished_oid(Error("x42")) is None
    assert vanished_oid(ValueError()) is None      # no diagnostics at all
    assert vanished_oid(None) is None
