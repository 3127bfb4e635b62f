"""A commit between vote and finish, on every backend: nobody else sees what it wrote,
an abort leaves nothing, finish's tid is the revisions' tid.  Where a commit holds the
only write lock from vote on (``Features.writes_at_vote``: SQLite), a commit of states
alone writes them into ``object_state`` at vote, under the tid it took there, and
stages nothing; one with a deletion stages as every backend does.
"""
from __future__ import annotations

from typing import Any

import pytest
import ZODB.tests.MinPO
import ZODB.tests.StorageTestBase
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import POSKeyError, StorageTransactionError
from ZODB.tests.ConflictResolution import PCounter
from ZODB.utils import p64, u64, z64


def _pickle(value: int) -> bytes:
    return ZODB.tests.StorageTestBase.zodb_pickle(ZODB.tests.MinPO.MinPO(value))


def _value(state: bytes) -> int:
    value: int = ZODB.tests.StorageTestBase.zodb_unpickle(state).value
    return value


def _commit(storage: Any, stores: dict[bytes, tuple[bytes, bytes]]) -> bytes:
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    for oid, (serial, state) in stores.items():
        storage.store(oid, serial, state, "", txn)
    storage.tpc_vote(txn)
    tid: bytes = storage.tpc_finish(txn)
    return tid


def _writes_at_vote(storage: Any) -> bool:
    return bool(storage.shared.backend.features.writes_at_vote)


def test_a_voted_commit_is_seen_by_nobody_and_an_abort_leaves_nothing(
        storage_factory: Any) -> None:
    storage = storage_factory.open()
    other = storage_factory.open()
    try:
        old_oid = storage.new_oid()
        first = _commit(storage, {old_oid: (z64, _pickle(1))})
        new_oid = storage.new_oid()
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        storage.store(old_oid, first, _pickle(2), "", txn)
        storage.store(new_oid, z64, _pickle(3), "", txn)
        storage.tpc_vote(txn)
        other.poll_invalidations()
        assert other.load(old_oid)[1] == first
        assert _value(other.load(old_oid)[0]) == 1
        with pytest.raises(POSKeyError):
            other.load(new_oid)
        storage.tpc_abort(txn)
        for each in (storage, other):
            each.poll_invalidations()
            assert each.lastTransaction() == first
            assert each.load(old_oid)[1] == first
            with pytest.raises(POSKeyError):
                each.load(new_oid)
        # The same commit again, finished: its tid is the revisions' and follows the last.
        tid = _commit(storage, {old_oid: (first, _pickle(2)), new_oid: (z64, _pickle(3))})
        assert u64(tid) > u64(first)
        other.poll_invalidations()
        assert other.lastTransaction() == tid
        assert other.load(old_oid) == (_pickle(2), tid)
        assert other.load(new_oid) == (_pickle(3), tid)
    finally:
        other.close()
        storage.close()


def test_states_alone_are_written_at_vote_under_the_tid_finish_returns(
        storage_factory: Any) -> None:
    storage = storage_factory.open()
    try:
        if not _writes_at_vote(storage):
            pytest.skip(f"{storage_factory.param.backend}: stages every commit for finish")
        oid = storage.new_oid()
        first = _commit(storage, {oid: (z64, _pickle(1))})
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        storage.store(oid, first, _pickle(2), "", txn)
        storage.tpc_vote(txn)
        pending = storage._pending_for(txn)
        conn = pending.conn
        staged = conn.fetchone("SELECT COUNT(*) FROM temp_store")[0]
        written = conn.fetchall("SELECT tid, state FROM object_state WHERE zoid = %s"
                                " ORDER BY tid", (u64(oid),))
        tid = storage.tpc_finish(txn)
        assert pending.written_tid == u64(tid)
        assert staged == 0
        expected = [(u64(tid), _pickle(2))]
        if storage_factory.param.keep_history:
            expected.insert(0, (u64(first), _pickle(1)))
        assert [(row[0], bytes(row[1])) for row in written] == expected
        assert storage.load(oid) == (_pickle(2), tid)
    finally:
        storage.close()


def test_a_commit_with_a_deletion_stages_for_finish(storage_factory: Any) -> None:
    storage = storage_factory.open()
    try:
        if not _writes_at_vote(storage):
            pytest.skip(f"{storage_factory.param.backend}: stages every commit for finish")
        gone, kept = storage.new_oid(), storage.new_oid()
        first = _commit(storage, {gone: (z64, _pickle(1)), kept: (z64, _pickle(1))})
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        storage.deleteObject(gone, first, txn)
        storage.store(kept, first, _pickle(2), "", txn)
        storage.tpc_vote(txn)
        pending = storage._pending_for(txn)
        staged = pending.conn.fetchone("SELECT COUNT(*) FROM temp_store")[0]
        newest = pending.conn.fetchone("SELECT MAX(tid) FROM object_state")[0]
        tid = storage.tpc_finish(txn)
        assert (staged, newest, pending.written_tid) == (2, u64(first), None)
        assert storage.load(kept) == (_pickle(2), tid)
        with pytest.raises(POSKeyError):
            storage.load(gone)
    finally:
        storage.close()


def test_a_restored_tid_not_after_the_last_is_refused_and_writes_nothing(
        storage_factory: Any) -> None:
    storage = storage_factory.open()
    try:
        oid = storage.new_oid()
        first = _commit(storage, {oid: (z64, _pickle(1))})
        second = _commit(storage, {oid: (first, _pickle(2))})
        txn = TransactionMetaData()
        storage.tpc_begin(txn, p64(u64(first) + 1))       # before ``second``
        storage.restore(oid, first, _pickle(9), "", None, txn)
        with pytest.raises(StorageTransactionError, match="not after the last committed"):
            storage.tpc_vote(txn)
            storage.tpc_finish(txn)
        storage.tpc_abort(txn)
        assert storage.load(oid) == (_pickle(2), second)
        assert storage.lastTransaction() == second
        third = _commit(storage, {oid: (second, _pickle(3))})
        assert storage.load(oid) == (_pickle(3), third)
    finally:
        storage.close()


def _counter(value: int) -> bytes:
    counter = PCounter()
    counter.inc(value)
    return ZODB.tests.StorageTestBase.zodb_pickle(counter)


@pytest.mark.parametrize("deleting", [False, True], ids=["states alone", "with a deletion"])
def test_a_conflict_resolved_at_vote_is_what_is_stored(storage_factory: Any,
                                                       deleting: bool) -> None:
    """The resolved state is written whichever way the commit goes: at vote (SQLite,
    states alone) or staged and restaged (a deletion with it; every server commit).
    The committed state is read from the database: the other storage committed it."""
    storage = storage_factory.open()
    other = storage_factory.open()
    try:
        oid, doomed = storage.new_oid(), storage.new_oid()
        first = _commit(storage, {oid: (z64, _counter(0)), doomed: (z64, _pickle(1))})
        other.poll_invalidations()
        second = _commit(other, {oid: (first, _counter(1))})
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        storage.store(oid, first, _counter(2), "", txn)
        if deleting:
            storage.deleteObject(doomed, first, txn)
        resolved = storage.tpc_vote(txn)
        tid = storage.tpc_finish(txn)
        assert set(resolved or ()) == {oid}
        for each in (storage, other):
            each.poll_invalidations()
            state, serial = each.load(oid)
            assert serial == tid and u64(tid) > u64(second)
            assert ZODB.tests.StorageTestBase.zodb_unpickle(state)._value == 3
        if deleting:
            with pytest.raises(POSKeyError):
                other.load(doomed)
    finally:
        other.close()
        storage.close()
