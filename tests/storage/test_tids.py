"""Every commit's tid is strictly after the last one committed, even when that one is
ahead of this machine's clock (a copied transaction, another client's faster clock)."""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import StorageTransactionError
from ZODB.tests.MinPO import MinPO
from ZODB.tests.StorageTestBase import zodb_pickle
from ZODB.TimeStamp import TimeStamp
from ZODB.utils import u64, z64

from zodbsql.backends.base.txncontrol import TransactionControl
from zodbsql.storage.pack import time_to_tid


def _commit(storage: Any, oid: bytes, serial: bytes, value: int,
            tid: bytes | None = None) -> bytes:
    txn = TransactionMetaData()
    storage.tpc_begin(txn, tid)
    storage.store(oid, serial, zodb_pickle(MinPO(value)), "", txn)
    storage.tpc_vote(txn)
    committed: bytes = storage.tpc_finish(txn)
    return committed


def test_a_commit_after_one_ahead_of_the_clock_gets_a_later_tid(storage_factory: Any) -> None:
    storage = storage_factory.open()
    other = storage_factory.open()           # another client: it did not commit it
    oid = storage.new_oid()
    ahead = time_to_tid(time.time() + 3600)  # an hour ahead of the clock
    future = _commit(storage, oid, z64, 1, tid=ahead.to_bytes(8, "big"))
    assert u64(future) == ahead
    other.sync()
    following = _commit(other, oid, future, 2)
    assert u64(following) == u64(future) + 1      # the clock is an hour behind
    assert TimeStamp(following).timeTime() > time.time() + 3000
    assert other.load(oid) == (zodb_pickle(MinPO(2)), following)


def test_last_transaction_is_the_own_commit_before_any_poll(storage_factory: Any) -> None:
    """An instance that polled, then committed, reports that commit as its last
    transaction at once (ZODB's DB reads it for new connections), not its snapshot."""
    storage = storage_factory.open()
    instance = storage.new_instance()
    try:
        instance.poll_invalidations()
        polled = instance.lastTransaction()
        committed = _commit(instance, instance.new_oid(), z64, 1)
        assert u64(committed) > u64(polled)
        assert instance.lastTransaction() == committed
    finally:
        instance.release()


def test_a_restore_at_the_last_tid_is_refused(storage_factory: Any) -> None:
    """A restored transaction must come after the last one: at the same tid it would
    be a second transaction of that tid."""
    storage = storage_factory.open()
    try:
        oid = storage.new_oid()
        first = _commit(storage, oid, z64, 1)
        txn = TransactionMetaData()
        storage.tpc_begin(txn, first)
        storage.store(oid, first, zodb_pickle(MinPO(2)), "", txn)
        with pytest.raises(StorageTransactionError, match="not after the last committed"):
            storage.tpc_vote(txn)
            storage.tpc_finish(txn)
        storage.tpc_abort(txn)
        assert storage.lastTransaction() == first
        assert storage.load(oid) == (zodb_pickle(MinPO(1)), first)
    finally:
        storage.close()


def test_a_commit_waits_for_the_one_finishing_before_it(storage_factory: Any,
                                                        monkeypatch: Any) -> None:
    """The portable finish takes the commit lock before it reads the last tid: a
    second commit waits until the first is done, and its tid comes after (without the
    lock both read the same last tid, and the later commit could take the smaller)."""

    one, two = storage_factory.open(), storage_factory.open()
    try:
        if type(one.shared.backend.txncontrol).finish is not TransactionControl.finish:
            pytest.skip("this backend's finish is one call of its own (a server function)")
        history = one.shared.backend.history
        real_record = history.record_commit
        inside, go_on = threading.Event(), threading.Event()

        def record_commit(*args: Any) -> Any:
            if not inside.is_set():         # the first finish holds the lock here
                inside.set()
                assert go_on.wait(30)
            return real_record(*args)
        monkeypatch.setattr(history, "record_commit", record_commit)
        oid1, oid2 = one.new_oid(), two.new_oid()
        tids: dict[str, bytes] = {}
        first = threading.Thread(target=lambda: tids.update(one=_commit(one, oid1, z64, 1)))
        first.start()
        assert inside.wait(30)
        second = threading.Thread(target=lambda: tids.update(two=_commit(two, oid2, z64, 2)))
        second.start()
        second.join(0.5)
        assert second.is_alive()            # waiting for the commit lock
        go_on.set()
        first.join(30)
        second.join(30)
        assert u64(tids["two"]) > u64(tids["one"])
    finally:
        one.close()
        two.close()
