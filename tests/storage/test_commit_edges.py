"""The edges of one commit (storage/commit.py) that ZODB's suites do not reach, found by
mutation testing: what an unresolvable conflict names, a corrupt committed state met
while resolving, the size recorded with each revision, and a restore that replaces
what the same transaction stored before (a blob, a backpointer).
"""
from __future__ import annotations

import os
import pickle
import threading
from typing import Any, Callable

import pytest
import transaction
import ZODB
import ZODB.blob
import ZODB.tests.MinPO
import ZODB.tests.StorageTestBase
from persistent.mapping import PersistentMapping
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import ConflictError, POSKeyError, StorageTransactionError
from ZODB.utils import p64, u64, z64

from tests.storage.test_blobs import count
from tests.storage.test_conflict_resolution import Tally, resolved_conflict
from tests.storage.test_verify import CORRUPT, run_sql
import zodbsql.storage.shared
from zodbsql.errors import CorruptRecordError, DatabaseError


def _commit(storage: Any, *steps: Callable[[TransactionMetaData], None]) -> bytes:
    """One transaction of ``steps`` through the storage API; the tid it committed."""
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    try:
        for step in steps:
            step(txn)
        storage.tpc_vote(txn)
    except BaseException:
        storage.tpc_abort(txn)
        raise
    tid: bytes = storage.tpc_finish(txn)
    return tid


def _pickle(value: int) -> bytes:
    return ZODB.tests.StorageTestBase.zodb_pickle(ZODB.tests.MinPO.MinPO(value))


def _new_object(storage: Any) -> tuple[bytes, bytes]:
    oid = storage.new_oid()
    tid = _commit(storage, lambda t: storage.store(oid, z64, _pickle(1), "", t))
    return oid, tid


def _vote_conflict(storage: Any, step: Callable[[TransactionMetaData], None]) -> ConflictError:
    with pytest.raises(ConflictError) as raised:
        _commit(storage, step)
    return raised.value


def test_a_deletion_over_a_newer_revision_names_the_object_and_both_tids(
        storage_factory: Any) -> None:
    storage = storage_factory.open()
    oid, first = _new_object(storage)
    second = _commit(storage, lambda t: storage.store(oid, first, _pickle(2), "", t))
    error = _vote_conflict(storage, lambda t: storage.deleteObject(oid, first, t))
    assert error.oid == oid
    assert error.serials == (second, first)    # (committed, the one the deletion expected)
    assert storage.load(oid)[1] == second      # nothing of the deletion was written


def test_an_update_over_a_deletion_names_the_object_and_both_tids(
        storage_factory: Any) -> None:
    """History-preserving, the deletion is a revision without a state (nothing to resolve
    against); history-free, the object is gone (tid 0)."""
    storage = storage_factory.open()
    oid, first = _new_object(storage)
    deleted = _commit(storage, lambda t: storage.deleteObject(oid, first, t))
    error = _vote_conflict(storage, lambda t: storage.store(oid, first, _pickle(3), "", t))
    assert error.oid == oid
    committed = deleted if storage_factory.param.keep_history else z64
    assert error.serials == (committed, first)
    with pytest.raises(POSKeyError):
        storage.load(oid)


def test_a_corrupt_committed_state_met_while_resolving_is_reported(
        storage_factory: Any) -> None:
    """Resolution merges with the committed state read from the database: one that does
    not match its checksum stops the commit with an error naming the record."""
    db_a = ZODB.DB(storage_factory.open(cache_size_mb=0))
    db_b = ZODB.DB(storage_factory.open(cache_size_mb=0))
    try:
        with db_a.transaction() as conn:
            conn.root()["t"] = Tally()
        tm_a, tm_b = transaction.TransactionManager(), transaction.TransactionManager()
        conn_a, conn_b = db_a.open(tm_a), db_b.open(tm_b)
        tally_b = conn_b.root()["t"]
        assert tally_b.count == 0          # B's snapshot: before A's commit
        conn_a.root()["t"].count += 1
        tm_a.commit()
        oid, committed = conn_a.root()["t"]._p_oid, conn_a.root()["t"]._p_serial
        run_sql(db_a.storage, CORRUPT, (b"not what was stored", u64(oid)))
        tally_b.count += 1
        with pytest.raises(CorruptRecordError) as raised:
            tm_b.commit()
        tm_b.abort()
        assert (raised.value.oid, raised.value.tid) == (u64(oid), u64(committed))
        assert f"oid 0x{u64(oid):016x} tid 0x{u64(committed):016x}" in str(raised.value)
        conn_a.close()
        conn_b.close()
    finally:
        db_a.close()
        db_b.close()


def test_each_revision_records_the_size_of_its_state(storage_factory: Any) -> None:
    storage = storage_factory.open()
    small, large = _pickle(1), ZODB.tests.StorageTestBase.zodb_pickle(
        ZODB.tests.MinPO.MinPO(b"x" * 5000))
    oid = storage.new_oid()
    first = _commit(storage, lambda t: storage.store(oid, z64, small, "", t))
    second = _commit(storage, lambda t: storage.store(oid, first, large, "", t))
    sizes = {entry["tid"]: entry["size"] for entry in storage.history(oid, size=10)}
    if storage_factory.param.keep_history:
        assert sizes == {second: len(large), first: len(small)}
        deleted = _commit(storage, lambda t: storage.deleteObject(oid, second, t))
        sizes = {entry["tid"]: entry["size"] for entry in storage.history(oid, size=10)}
        assert sizes[deleted] == 0         # a deletion has no state
    else:
        assert sizes == {second: len(large)}


def test_a_restore_without_a_backpointer_replaces_one_with_it(storage_factory: Any) -> None:
    """Restored twice in one transaction, first as a backpointer to an older revision,
    then with its own data: the record is the second, with no backpointer left."""
    storage = storage_factory.open()
    oid, first = _new_object(storage)
    restored = _pickle(7)
    tid = p64(u64(storage.lastTransaction()) + 1)

    def restore_twice(txn: TransactionMetaData) -> None:
        storage.restore(oid, tid, None, "", first, txn)
        storage.restore(oid, tid, restored, "", None, txn)

    txn = TransactionMetaData()
    storage.tpc_begin(txn, tid)
    restore_twice(txn)
    storage.tpc_vote(txn)
    storage.tpc_finish(txn)
    assert storage.load(oid) == (restored, tid)
    if storage_factory.param.keep_history:
        (record,) = [r for t in storage.iterator(tid, tid) for r in t]
        assert (record.oid, record.data, record.data_txn) == (oid, restored, None)


def test_a_restored_backpointer_serves_the_state_it_points_to(storage_factory: Any) -> None:
    """A restore with no data and a backpointer (an undo's record, as copied): the
    object's state at the new tid is the older revision's, read and recorded with it.
    (History-free, the revision pointed to must still be the current one.)"""
    storage = storage_factory.open()
    oid, first = _new_object(storage)
    if storage_factory.param.keep_history:
        _commit(storage, lambda t: storage.store(oid, first, _pickle(2), "", t))
    tid = p64(u64(storage.lastTransaction()) + 1)
    txn = TransactionMetaData()
    storage.tpc_begin(txn, tid)
    storage.restore(oid, tid, None, "", first, txn)
    storage.tpc_vote(txn)
    storage.tpc_finish(txn)
    assert storage.load(oid) == (_pickle(1), tid)
    if storage_factory.param.keep_history:
        assert storage.loadSerial(oid, tid) == _pickle(1)
        (record,) = [r for t in storage.iterator(tid, tid) for r in t]
        assert (record.oid, record.data, record.data_txn) == (oid, _pickle(1), first)


def test_a_restore_drops_a_blob_stored_before_it(storage_factory: Any, tmp_path: Any) -> None:
    """A blob stored and then restored without one in the same transaction: the record
    has no blob, and the staged file is not left in the blob temp directory."""
    storage = storage_factory.open(blob_dir=str(tmp_path / "blobs"))
    oid, first = _new_object(storage)
    staged = os.path.join(storage.temporaryDirectory(), "staged.blob")
    with open(staged, "wb") as f:
        f.write(b"blob contents that the restore replaces")
    tid = p64(u64(storage.lastTransaction()) + 1)
    restored = _pickle(8)
    txn = TransactionMetaData()
    storage.tpc_begin(txn, tid)
    storage.storeBlob(oid, first, _pickle(9), staged, "", txn)
    storage.restore(oid, tid, restored, "", None, txn)
    storage.tpc_vote(txn)
    storage.tpc_finish(txn)
    assert storage.load(oid) == (restored, tid)
    assert not os.listdir(storage.temporaryDirectory())
    with pytest.raises(POSKeyError):
        storage.loadBlob(oid, tid)


def test_two_blobs_of_new_contents_in_one_commit_ask_for_it_once(
        storage_factory: Any, tmp_path: Any) -> None:
    """Within one commit, contents uploaded for one blob are known for the next: a
    commit of two identical new blobs sends the same statements as a commit of one."""
    storage = storage_factory.open(blob_dir=str(tmp_path / "blobs"))
    db = ZODB.DB(storage)
    try:
        conn = db.open()
        root = conn.root()
        root["holder"] = PersistentMapping()
        transaction.commit()
        counts: list[int] = []
        for copies in (1, 2, 1, 2):
            data = os.urandom(2000)
            for n in range(copies):
                root["holder"][f"{len(counts)}-{n}"] = ZODB.blob.Blob(data)
            before = storage.statement_count()
            transaction.commit()
            counts.append(storage.statement_count() - before)
        assert counts[1] == counts[0] and counts[3] == counts[2]
        conn.close()
    finally:
        db.close()


@pytest.mark.parametrize("detail", [None, "the server's max_allowed_packet"])
def test_a_state_over_the_statement_limit_is_refused_before_anything_is_sent(
        storage_factory: Any, detail: str | None) -> None:
    """The limit is the server's (SQLite's is 1,000,000,000 bytes); lowered here on the
    commit connections so that a small state meets it."""
    storage = storage_factory.open()
    backend = storage.shared.backend
    connect = backend.connect_for_commit

    def connect_limited(*args: Any, **kwargs: Any) -> Any:
        conn = connect(*args, **kwargs)
        conn.max_state_size, conn.max_state_size_detail = 200, detail
        return conn
    backend.connect_for_commit = connect_limited
    storage.shared.pool.close()
    oid = storage.new_oid()
    at_limit = _pickle(1) + b"." * (200 - len(_pickle(1)))  # a state of exactly the limit
    first = _commit(storage, lambda t: storage.store(oid, z64, at_limit, "", t))
    over = at_limit + b"."
    with pytest.raises(DatabaseError) as raised:
        _commit(storage, lambda t: storage.store(oid, first, over, "", t))
    expected = (f"the state of oid 0x{u64(oid):016x} is 201 bytes, larger than the 200"
                f" bytes {backend.describe()} accepts in one statement"
                + (f" ({detail})" if detail else "")
                + "; nothing of this transaction was written")
    assert str(raised.value) == expected
    assert storage.load(oid) == (at_limit, first)


@pytest.mark.parametrize("vote", ["never voted", "vote failed"])
def test_finish_without_a_successful_vote_is_refused(storage_factory: Any, vote: str) -> None:
    storage = storage_factory.open()
    oid, first = _new_object(storage)
    second = _commit(storage, lambda t: storage.store(oid, first, _pickle(2), "", t))
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    storage.deleteObject(oid, first, txn)      # a conflict no resolution can merge
    if vote == "vote failed":
        with pytest.raises(ConflictError):
            storage.tpc_vote(txn)
    with pytest.raises(StorageTransactionError, match="^tpc_finish called before tpc_vote$"):
        storage.tpc_finish(txn)
    storage.tpc_abort(txn)
    assert storage.load(oid) == (_pickle(2), second)


class _OldStyleMetaData:
    """Transaction metadata as older callers pass it: text or None instead of bytes, an
    extension dictionary (under ``extension`` or, older still, ``_extension``) and no
    ``extension_bytes``."""

    def __init__(self, user: str | None, description: str | None, attribute: str,
                 extension: dict[str, Any] | None) -> None:
        self.user, self.description = user, description
        setattr(self, attribute, extension)


def _recorded(storage: Any, tid: bytes) -> tuple[bytes, bytes, bytes]:
    (record,) = storage.iterator(tid, tid)
    return record.user, record.description, record.extension_bytes


@pytest.mark.parametrize("user, description, attribute, extension", [
    ("ünïcode user", None, "extension", {"origin": "old style"}),
    (None, "a note", "_extension", {"origin": "older style"}),
    ("u", "d", "extension", {}),
    ("u", "d", "_extension", None),
])
def test_metadata_given_as_text_or_none_is_recorded_as_bytes(
        storage_factory: Any, user: str | None, description: str | None, attribute: str,
        extension: dict[str, Any] | None) -> None:
    storage = storage_factory.open()
    oid = storage.new_oid()
    meta = _OldStyleMetaData(user, description, attribute, extension)
    storage.tpc_begin(meta)
    storage.store(oid, z64, _pickle(1), "", meta)
    storage.tpc_vote(meta)
    tid = storage.tpc_finish(meta)
    assert storage.load(oid) == (_pickle(1), tid)
    if storage_factory.param.keep_history:   # history-free keeps no transaction metadata
        recorded_user, recorded_description, recorded = _recorded(storage, tid)
        assert recorded_user == (user or "").encode("utf-8")
        assert recorded_description == (description or "").encode("utf-8")
        if extension:
            assert pickle.loads(recorded) == extension
            assert recorded == pickle.dumps(extension, protocol=3)
        else:
            assert recorded == b""


def test_extension_bytes_are_recorded_as_given(storage_factory: Any) -> None:
    """A copy (convert, zodbconvert) passes each transaction's extension as the bytes it
    read: they are kept as they are, not pickled again (another protocol, other bytes)."""
    storage = storage_factory.open()
    given = pickle.dumps({"copied": True}, protocol=1)
    assert given != pickle.dumps({"copied": True}, protocol=3)
    oid = storage.new_oid()
    txn = TransactionMetaData(b"u", b"d", given)
    storage.tpc_begin(txn)
    storage.store(oid, z64, _pickle(1), "", txn)
    storage.tpc_vote(txn)
    tid = storage.tpc_finish(txn)
    if storage_factory.param.keep_history:
        assert _recorded(storage, tid) == (b"u", b"d", given)
    else:
        assert storage.load(oid) == (_pickle(1), tid)


def test_restored_oids_are_never_handed_out_again(storage_factory: Any) -> None:
    storage = storage_factory.open()
    restored = p64(u64(storage.new_oid()) + 50_000)
    txn = TransactionMetaData()
    tid = p64(u64(storage.lastTransaction()) + 1)
    storage.tpc_begin(txn, tid)
    storage.restore(restored, tid, _pickle(5), "", None, txn)
    storage.tpc_vote(txn)
    storage.tpc_finish(txn)
    other = storage_factory.open()            # another process: it allocates afresh
    assert u64(other.new_oid()) > u64(restored)


def test_the_first_oid_restored_into_a_new_database_is_not_handed_out_again(
        storage_factory: Any) -> None:
    """oid 1 restored before any oid was handed out (a copy into a new database whose
    source holds the root and one object): the next new oid is 2.  PostgreSQL's sequence,
    never called, gives its start value next, so raising it to the restored oid must
    count that (it gave oid 1 again: a copy into a new schema, then a new object's
    commit, failed with ZODB's "A different object already has the same oid")."""
    storage = storage_factory.open()
    txn = TransactionMetaData()
    storage.tpc_begin(txn, p64(u64(storage.lastTransaction()) + 1))
    for oid in (0, 1):
        storage.restore(p64(oid), z64, _pickle(oid), "", None, txn)
    storage.tpc_vote(txn)
    storage.tpc_finish(txn)
    assert u64(storage.new_oid()) == 2


@pytest.mark.parametrize("limit", [None, 300])
def test_blob_chunks_fit_the_statement_limit(storage_factory: Any, tmp_path: Any,
                                             limit: int | None) -> None:
    """A blob's contents go up in chunks no larger than one statement may carry (MySQL's
    max_allowed_packet), however large the configured chunk size."""
    storage = storage_factory.open(blob_dir=str(tmp_path / "blobs"), blob_chunk_size=4096)
    backend = storage.shared.backend
    connect = backend.connect_for_commit

    def connect_limited(*args: Any, **kwargs: Any) -> Any:
        conn = connect(*args, **kwargs)
        conn.max_state_size = limit
        return conn
    backend.connect_for_commit = connect_limited
    storage.shared.pool.close()
    data = os.urandom(1000)
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["blob"] = ZODB.blob.Blob(data)
        assert count(storage, "blob_chunk") == (1 if limit is None else 4)  # 3 x 300 + 100
        reader = ZODB.DB(storage_factory.open(blob_dir=str(tmp_path / "other")))
        with reader.transaction() as conn, conn.root()["blob"].open() as f:
            assert f.read() == data
        reader.close()
    finally:
        db.close()


def _error_behind_the_held_pool(storage_factory: Any, monkeypatch: pytest.MonkeyPatch,
                                ask: Callable[[Any], None]) -> str:
    """What ``ask(instance)`` raises, in a thread, while a voted commit of another
    instance holds the commit pool cut to one connection (commit-lock-timeout 0.3 s):
    the DatabaseError's text, or "None" when it raised nothing, hanging until the
    commit gave the connection back."""
    monkeypatch.setattr(zodbsql.storage.shared, "COMMIT_POOL_SIZE", 1)
    storage = storage_factory.open(commit_lock_timeout=0.3)
    first, second = storage.new_instance(), storage.new_instance()
    held = TransactionMetaData()
    first.tpc_begin(held)
    first.store(storage.new_oid(), z64, _pickle(1), "", held)
    first.tpc_vote(held)                   # holds the pool's only connection
    outcome: dict[str, Exception] = {}

    def run() -> None:
        try:
            ask(second)
        except DatabaseError as exc:
            outcome["error"] = exc
    waiting = threading.Thread(target=run, daemon=True)
    waiting.start()
    waiting.join(10)
    first.tpc_abort(held)                  # gives the connection back
    waiting.join(10)
    first.release()
    second.release()
    assert not waiting.is_alive()
    return str(outcome.get("error"))


def test_a_vote_waits_for_a_pooled_connection_at_most_the_lock_timeout(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def vote(second: Any) -> None:
        txn = TransactionMetaData()
        second.tpc_begin(txn)
        second.store(second.new_oid(), z64, _pickle(2), "", txn)
        try:
            second.tpc_vote(txn)
        finally:
            second.tpc_abort(txn)
    error = _error_behind_the_held_pool(storage_factory, monkeypatch, vote)
    assert "all 1 pooled connections stayed busy for 0.3s" in error


def test_a_resolved_state_is_handed_back_and_stored_with_its_checksum(
        storage_factory: Any) -> None:
    """Vote returns the oids it resolved, so the committing connection drops its own
    (unmerged) copy; the merged state is stored with the checksum that guards it."""
    db_a = ZODB.DB(storage_factory.open())
    db_b = ZODB.DB(storage_factory.open())
    try:
        conn_a, conn_b, tally_b, _ = resolved_conflict(db_a, db_b, 1)
        oid = tally_b._p_oid
        run_sql(db_a.storage, CORRUPT, (b"not what was stored", u64(oid)))
        fresh = storage_factory.open(cache_size_mb=0)
        with pytest.raises(CorruptRecordError):
            fresh.load(oid)
        conn_a.close()
        conn_b.close()
    finally:
        db_a.close()
        db_b.close()


def test_resolution_merges_with_the_cached_committed_state_without_reading_it(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One process: the state the other connection committed is in the shared cache, so
    resolving against it reads nothing from the database (ZODB's resolver loads only
    the state both started from)."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["t"] = Tally()
        tm_a, tm_b = transaction.TransactionManager(), transaction.TransactionManager()
        conn_a, conn_b = db.open(tm_a), db.open(tm_b)
        tally_b = conn_b.root()["t"]
        assert tally_b.count == 0
        conn_a.root()["t"].count += 1
        tm_a.commit()
        committed = conn_a.root()["t"]._p_serial
        revisions_read: list[Any] = []
        serials_loaded: list[bytes] = []
        mover = storage.shared.backend.mover
        load_revisions, load_serial = mover.load_revisions, type(storage).loadSerial

        def counted_revisions(conn: Any, wanted: dict[int, int]) -> Any:
            revisions_read.append(dict(wanted))
            return load_revisions(conn, wanted)

        def counted_serial(self: Any, oid: bytes, serial: bytes) -> Any:
            serials_loaded.append(serial)
            return load_serial(self, oid, serial)
        monkeypatch.setattr(mover, "load_revisions", counted_revisions)
        monkeypatch.setattr(type(storage), "loadSerial", counted_serial)
        tally_b.count += 1
        tm_b.commit()
        assert tally_b.count == 2
        assert all(not wanted for wanted in revisions_read)    # the cache had it
        assert committed not in serials_loaded                  # handed to the resolver
        conn_a.close()
        conn_b.close()
    finally:
        db.close()


def test_a_blob_the_cache_cannot_take_leaves_no_file_behind(
        storage_factory: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the commit, a blob's file moves into the local blob cache; when that fails
    (a full disk) the commit stands and the staged file is removed, not left in the
    blob temp directory (a later read downloads the contents again)."""
    storage = storage_factory.open(blob_dir=str(tmp_path / "blobs"))
    cache = storage.shared.blob_files.cache

    def disk_full(*args: Any) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(cache, "install", disk_full)
    data = os.urandom(3000)
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["blob"] = ZODB.blob.Blob(data)
        assert not os.listdir(storage.temporaryDirectory())
        monkeypatch.undo()
        with db.transaction() as conn, conn.root()["blob"].open() as f:
            assert f.read() == data
    finally:
        db.close()


def test_an_object_stored_twice_keeps_the_first_expectation_and_the_last_state(
        storage_factory: Any) -> None:
    """ZODB stores an object again after a savepoint: the expected tid is the first
    store's (the revision the transaction read), the state the last one."""
    storage = storage_factory.open()
    oid, first = _new_object(storage)

    def store_twice(txn: TransactionMetaData) -> None:
        storage.store(oid, first, _pickle(2), "", txn)
        storage.store(oid, z64, _pickle(3), "", txn)
    tid = _commit(storage, store_twice)
    assert storage.load(oid) == (_pickle(3), tid)


def test_a_store_replaces_a_backpointer_and_a_blob_staged_before_it(
        storage_factory: Any, tmp_path: Any) -> None:
    """Restored as a backpointer, or stored with a blob, and then stored plainly in the
    same transaction: the record is the plain state, with neither left."""
    storage = storage_factory.open(blob_dir=str(tmp_path / "blobs"))
    oid, first = _new_object(storage)
    other, other_first = _new_object(storage)
    staged = os.path.join(storage.temporaryDirectory(), "staged.blob")
    with open(staged, "wb") as f:
        f.write(b"blob contents that the store replaces")
    tid = p64(u64(storage.lastTransaction()) + 1)
    txn = TransactionMetaData()
    storage.tpc_begin(txn, tid)
    storage.restore(oid, tid, None, "", first, txn)            # a backpointer
    storage.store(oid, first, _pickle(4), "", txn)
    storage.storeBlob(other, other_first, _pickle(5), staged, "", txn)
    storage.store(other, other_first, _pickle(6), "", txn)
    storage.tpc_vote(txn)
    storage.tpc_finish(txn)
    assert storage.load(oid) == (_pickle(4), tid)
    assert storage.load(other) == (_pickle(6), tid)
    assert not os.listdir(storage.temporaryDirectory())
    with pytest.raises(POSKeyError):
        storage.loadBlob(other, tid)
    if storage_factory.param.keep_history:
        records = {r.oid: r for t in storage.iterator(tid, tid) for r in t}
        assert (records[oid].data, records[oid].data_txn) == (_pickle(4), None)


def test_misused_two_phase_commit_calls_say_what_went_wrong(storage_factory: Any) -> None:
    """A second tpc_begin for the same transaction, a store into a transaction the
    instance has not begun, a store of a version: each refused with ZODB's error that
    says so, and the transaction under way still commits."""
    storage = storage_factory.open()
    instance = storage.new_instance()
    try:
        txn = TransactionMetaData()
        instance.tpc_begin(txn)
        with pytest.raises(StorageTransactionError) as twice:
            instance.tpc_begin(txn)
        assert twice.value.args == ("Duplicate tpc_begin calls for same transaction",)
        other = TransactionMetaData()
        state = _pickle(1)
        with pytest.raises(StorageTransactionError) as stranger:
            instance.store(p64(1), z64, state, "", other)
        assert stranger.value.args == (instance, other)
        for write in (lambda: instance.store(instance.new_oid(), z64, state, "v", txn),
                      lambda: instance.restore(p64(2), z64, state, "v", None, txn)):
            with pytest.raises(ZODB.POSException.Unsupported) as versions:
                write()
            assert versions.value.args == ("versions are not supported",)
        oid = instance.new_oid()
        instance.store(oid, z64, state, "", txn)
        instance.tpc_vote(txn)
        tid = instance.tpc_finish(txn)
        assert instance.load(oid) == (state, tid)
    finally:
        instance.release()
        storage.close()


def test_tpc_transaction_names_the_transaction_being_committed(storage_factory: Any) -> None:
    """``tpc_transaction`` (IStorage): the transaction between tpc_begin and its end, None
    before, after a finish and after an abort."""
    storage = storage_factory.open()
    instance = storage.new_instance()
    try:
        assert instance.tpc_transaction() is None
        for end in ("finish", "abort"):
            txn = TransactionMetaData()
            instance.tpc_begin(txn)
            assert instance.tpc_transaction() is txn
            instance.store(instance.new_oid(), z64, _pickle(1), "", txn)
            instance.tpc_vote(txn)
            assert instance.tpc_transaction() is txn
            if end == "finish":
                instance.tpc_finish(txn)
            else:
                instance.tpc_abort(txn)
            assert instance.tpc_transaction() is None
    finally:
        instance.release()
        storage.close()


def test_an_oid_asked_for_between_vote_and_finish_comes_from_the_commit(
        storage_factory: Any) -> None:
    """An oid block taken after vote is allocated on the commit's own connection: the
    vote holds the database's write lock (SQLite) and the pooled connection the commit
    uses, so another one would wait out commit-lock-timeout and fail.  The oid is new,
    and the commit still finishes."""
    storage = storage_factory.open(commit_lock_timeout=0.5)
    instance = storage.new_instance()
    try:
        txn = TransactionMetaData()
        instance.tpc_begin(txn)
        first = instance.new_oid()
        instance.store(first, z64, _pickle(1), "", txn)
        instance.tpc_vote(txn)
        instance.shared.free_oids.clear()       # the next oid needs a new block
        late = instance.new_oid()
        assert u64(late) > u64(first)
        tid = instance.tpc_finish(txn)
        assert instance.load(first) == (_pickle(1), tid)
        assert u64(instance.new_oid()) > u64(late)
    finally:
        instance.release()
        storage.close()


def test_an_oid_block_waits_for_a_pooled_connection_at_most_the_lock_timeout(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a commit's vote, a new oid block is asked on a pooled connection; with
    the pool's only one held by a voted commit, the ask fails after commit-lock-timeout
    instead of hanging."""
    def new_block(second: Any) -> None:
        second.shared.free_oids.clear()
        second.new_oid()
    error = _error_behind_the_held_pool(storage_factory, monkeypatch, new_block)
    assert "all 1 pooled connections stayed busy for 0.3s" in error
