"""readCurrent of an object another commit has voted to change (and holds the row lock
of) is a ReadConflictError at once, not a wait for that commit: the vote that read it
never waits for a row it only reads (the lockers' NOWAIT share locks, which keep two
commits from waiting for each other in a cycle).  The voted commit then finishes."""
from __future__ import annotations

import time
from typing import Any

import pytest
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import ReadConflictError
from ZODB.tests.MinPO import MinPO
from ZODB.tests.StorageTestBase import zodb_pickle
from ZODB.utils import z64

storage_backends = ("postgresql", "mysql")
storage_backends_reason = (
    "row locks: SQLite takes its one write lock in vote, so the second vote waits for it"
    " (tests/storage/test_read_current.py covers read conflicts there)")

TIMEOUT = 20.0   # seconds a vote may wait for a row lock; the conflict must come sooner


def _commit(storage: Any, states: dict[bytes, tuple[bytes, int]]) -> bytes:
    """Commit ``{oid: (previous serial, value)}`` as MinPO states; the new tid."""
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    for oid, (serial, value) in states.items():
        storage.store(oid, serial, zodb_pickle(MinPO(value)), "", txn)
    storage.tpc_vote(txn)
    tid: bytes = storage.tpc_finish(txn)
    return tid


@pytest.mark.parametrize("objects", [1, 3])
def test_read_current_of_a_row_a_voted_commit_holds_conflicts_at_once(
        storage_factory: Any, objects: int) -> None:
    writer = storage_factory.open(commit_lock_timeout=TIMEOUT)
    reader = storage_factory.open(commit_lock_timeout=TIMEOUT)
    xs = [writer.new_oid() for _ in range(objects)]
    y = writer.new_oid()
    first = _commit(writer, {oid: (z64, 0) for oid in [*xs, y]})
    reader.sync()

    t1 = TransactionMetaData()
    writer.tpc_begin(t1)
    writer.store(xs[-1], first, zodb_pickle(MinPO(1)), "", t1)
    writer.tpc_vote(t1)                 # holds the row of the last x until it finishes

    t2 = TransactionMetaData()
    reader.tpc_begin(t2)
    for oid in xs:
        reader.checkCurrentSerialInTransaction(oid, first, t2)
    reader.store(y, first, zodb_pickle(MinPO(2)), "", t2)
    started = time.monotonic()
    with pytest.raises(ReadConflictError) as raised:
        reader.tpc_vote(t2)
    # The error says what happened and that a retry is the cure.
    assert ("another commit is changing an object this transaction read-current"
            " (checkCurrentSerialInTransaction); the transaction can be retried") in str(
        raised.value)
    assert time.monotonic() - started < TIMEOUT / 2
    reader.tpc_abort(t2)

    tid = writer.tpc_finish(t1)
    check = storage_factory.open(cache_size_mb=0)
    assert check.load(xs[-1]) == (zodb_pickle(MinPO(1)), tid)
    assert check.load(y) == (zodb_pickle(MinPO(0)), first)   # the reader wrote nothing
    assert check.lastTransaction() == tid


def test_read_current_beside_a_voted_commit_on_other_rows_goes_through(
        storage_factory: Any) -> None:
    """The share locks are taken on the rows read-current only: a voted commit that
    holds other rows does not make the vote a conflict."""
    writer = storage_factory.open(commit_lock_timeout=TIMEOUT)
    reader = storage_factory.open(commit_lock_timeout=TIMEOUT)
    x, read, y = writer.new_oid(), writer.new_oid(), writer.new_oid()
    first = _commit(writer, {oid: (z64, 0) for oid in (x, read, y)})
    reader.sync()

    t1 = TransactionMetaData()
    writer.tpc_begin(t1)
    writer.store(x, first, zodb_pickle(MinPO(1)), "", t1)
    writer.tpc_vote(t1)                 # holds x's row until it finishes

    t2 = TransactionMetaData()
    reader.tpc_begin(t2)
    reader.checkCurrentSerialInTransaction(read, first, t2)
    reader.store(y, first, zodb_pickle(MinPO(2)), "", t2)
    reader.tpc_vote(t2)
    second = reader.tpc_finish(t2)
    tid = writer.tpc_finish(t1)
    check = storage_factory.open(cache_size_mb=0)
    assert check.load(y) == (zodb_pickle(MinPO(2)), second)
    assert check.load(x) == (zodb_pickle(MinPO(1)), tid)
