"""readCurrent: a commit that read objects as current fails with ReadConflictError when
any one of them changed since, however many it read (more than one statement checks),
and commits when none did."""
from __future__ import annotations

from typing import Any

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import ReadConflictError

ITEMS = 1001   # more than one statement's worth of oids (500 a statement)


@pytest.mark.parametrize("changed", [None, 0, 499, 500, 1000])
def test_read_current_catches_a_change_to_any_object_read(storage_factory: Any,
                                                          changed: int | None) -> None:
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["items"] = [PersistentMapping(v=i) for i in range(ITEMS)]
        reader_tm = transaction.TransactionManager()
        reader = db.open(reader_tm)
        items = reader.root()["items"]
        for item in items:
            assert item["v"] >= 0
            reader.readCurrent(item)
        reader.root()["total"] = sum(item["v"] for item in items)
        if changed is not None:
            with db.transaction() as writer:
                writer.root()["items"][changed]["v"] = -1
        if changed is None:
            reader_tm.commit()
            with db.transaction() as conn:
                assert conn.root()["total"] == sum(range(ITEMS))
        else:
            with pytest.raises(ReadConflictError) as raised:
                reader_tm.commit()
            assert raised.value.oid == items[changed]._p_oid
            reader_tm.abort()
        reader.close()
    finally:
        db.close()


def test_an_object_read_current_and_deleted_since_conflicts_with_serial_zero(
        storage_factory: Any) -> None:
    """History-free, a deleted object has no row left: a commit that read it as current
    fails with a ReadConflictError naming it, its serial then as 0 (nothing current)."""
    from ZODB.Connection import TransactionMetaData
    from ZODB.utils import z64
    if storage_factory.param.keep_history:
        pytest.skip("history-preserving: a deletion leaves a current row (its own tid)")
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["doomed"] = PersistentMapping(v=1)
        reader_tm = transaction.TransactionManager()
        reader = db.open(reader_tm)
        doomed = reader.root()["doomed"]
        read_serial = doomed._p_serial
        reader.readCurrent(doomed)
        reader.root()["seen"] = doomed["v"]
        other = storage.new_instance()
        txn = TransactionMetaData()
        other.tpc_begin(txn)
        other.deleteObject(doomed._p_oid, read_serial, txn)
        other.tpc_vote(txn)
        other.tpc_finish(txn)
        other.release()
        with pytest.raises(ReadConflictError) as raised:
            reader_tm.commit()
        assert raised.value.oid == doomed._p_oid
        assert raised.value.serials == (z64, read_serial)
        reader_tm.abort()
        reader.close()
    finally:
        db.close()



@pytest.mark.parametrize("changed", [False, True])
def test_a_commit_that_only_reads_current(storage_factory: Any, changed: bool) -> None:
    """A commit that stores nothing but checks an object current (the storage API:
    ZODB itself joins a transaction only for a change) still votes: it fails when
    another commit changed the object, and commits when none did."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["item"] = item = PersistentMapping(v=1)
        oid = item._p_oid
        read_serial = storage.load(oid)[1]
        if changed:
            with db.transaction() as writer:
                writer.root()["item"]["v"] = 2
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        storage.checkCurrentSerialInTransaction(oid, read_serial, txn)
        if changed:
            with pytest.raises(ReadConflictError) as raised:
                storage.tpc_vote(txn)
            assert raised.value.oid == oid
            storage.tpc_abort(txn)
        else:
            storage.tpc_vote(txn)
            tid = storage.tpc_finish(txn)
            assert tid == storage.lastTransaction() and tid > read_serial
            assert storage.load(oid)[1] == read_serial     # nothing of it was written
    finally:
        db.close()
