"""Every commit's tid is strictly after the last one committed, even when that one is
ahead of this machine's clock (a copied transaction, another client's faster clock)."""
from __future__ import annotations

import time
from typing import Any

from ZODB.Connection import TransactionMetaData
from ZODB.tests.MinPO import MinPO
from ZODB.tests.StorageTestBase import zodb_pickle
from ZODB.TimeStamp import TimeStamp
from ZODB.utils import u64, z64

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
    assert u64(following) > u64(future)
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
