"""loadSerial(oid, serial) gives that exact revision or POSKeyError, never another one:
history-free, only the current serial is there; history-preserving, every revision
not packed away.  A write over an object whose creation was undone (its current
revision says "deleted") is a ConflictError, not a crash."""
from __future__ import annotations

from typing import Any

import pytest
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import ConflictError, POSKeyError
from ZODB.tests.MinPO import MinPO
from ZODB.tests.StorageTestBase import zodb_pickle
from ZODB.utils import p64, u64, z64

from tests.storage.test_verify import CORRUPT, run_sql
from zodbsql.errors import CorruptRecordError


def _commit(storage: Any, oid: bytes, serial: bytes, value: int) -> bytes:
    return _commit_state(storage, oid, serial, zodb_pickle(MinPO(value)))


def _commit_state(storage: Any, oid: bytes, serial: bytes, state: bytes) -> bytes:
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    storage.store(oid, serial, state, "", txn)
    storage.tpc_vote(txn)
    tid: bytes = storage.tpc_finish(txn)
    return tid


def test_load_serial_gives_that_revision_or_none(storage_factory: Any) -> None:
    storage = storage_factory.open(cache_size_mb=0)
    oid = storage.new_oid()
    first = _commit(storage, oid, z64, 1)
    second = _commit(storage, oid, first, 2)
    assert storage.loadSerial(oid, second) == zodb_pickle(MinPO(2))
    if storage_factory.param.keep_history:
        assert storage.loadSerial(oid, first) == zodb_pickle(MinPO(1))
    else:
        with pytest.raises(POSKeyError):
            storage.loadSerial(oid, first)       # gone: never the current one instead
    missing = storage.new_oid()
    with pytest.raises(POSKeyError) as raised:
        storage.loadSerial(missing, second)
    assert raised.value.args == (missing,)          # the error names the object


def test_a_damaged_revision_is_refused_by_every_read_of_a_revision(
        storage_factory: Any) -> None:
    """loadSerial and loadBefore check a state against its checksum as load does, and
    name the object and the revision; a state of no bytes is given as it is."""
    storage = storage_factory.open(cache_size_mb=0)
    oid, empty_oid = storage.new_oid(), storage.new_oid()
    tid = _commit(storage, oid, z64, 1)
    empty_tid = _commit_state(storage, empty_oid, z64, b"")
    after = p64(u64(empty_tid) + 1)
    assert storage.loadSerial(empty_oid, empty_tid) == b""
    assert storage.loadBefore(empty_oid, after) == (b"", empty_tid, None)
    run_sql(storage, CORRUPT, (b"not what was stored", u64(oid)))
    for read in (lambda: storage.loadSerial(oid, tid),
                 lambda: storage.loadBefore(oid, after), lambda: storage.load(oid)):
        with pytest.raises(CorruptRecordError) as raised:
            read()
        assert (raised.value.oid, raised.value.tid) == (u64(oid), u64(tid))


class TestWriteOverAnUndoneCreation:
    history_modes = (True,)
    history_modes_reason = "undo needs a history-preserving storage"

    def test_is_a_conflict(self, storage_factory: Any) -> None:
        storage = storage_factory.open(cache_size_mb=0)
        oid = storage.new_oid()
        created = _commit(storage, oid, z64, 1)
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        storage.undo(storage.undoLog(0, 1)[0]["id"], txn)
        storage.tpc_vote(txn)
        undone = storage.tpc_finish(txn)
        with pytest.raises(POSKeyError):
            storage.load(oid)
        # Every way of reading the current revision says which object is gone.
        for read in (storage.load, storage.getTid,
                     lambda oid: storage.loadBefore(oid, p64(u64(undone) + 1)),
                     lambda oid: storage.loadSerial(oid, undone)):
            with pytest.raises(POSKeyError) as raised:
                read(oid)
            assert raised.value.args == (oid,)
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        storage.store(oid, created, zodb_pickle(MinPO(2)), "", txn)
        with pytest.raises(ConflictError):
            storage.tpc_vote(txn)
        storage.tpc_abort(txn)
        with pytest.raises(POSKeyError):
            storage.load(oid)
        other = storage_factory.open()          # its prefetch meets the "deleted" row
        other.poll_invalidations()
        other.prefetch([oid])
        with pytest.raises(POSKeyError):
            other.load(oid)
