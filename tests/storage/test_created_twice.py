"""Two commits that create the same oid (``store`` with serial z64 in both, as a copy
or a client that chose its oids can do): the second to finish must fail with a
retryable conflict, and the first one's state stays.  (On PostgreSQL, whose votes of
new objects don't wait for each other, the second can also fail only at its finish:
tests/backends/postgresql/test_postgresql.py.)"""
from __future__ import annotations

from typing import Any

import pytest
import transaction.interfaces
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import ConflictError
from ZODB.tests.MinPO import MinPO
from ZODB.tests.StorageTestBase import zodb_pickle
from ZODB.utils import z64


def begun(storage: Any, oid: bytes, value: int) -> TransactionMetaData:
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    storage.store(oid, z64, zodb_pickle(MinPO(value)), "", txn)
    return txn


def test_the_second_creation_of_an_oid_conflicts(storage_factory: Any) -> None:
    one, two = storage_factory.open(), storage_factory.open()
    try:
        oid = one.new_oid()
        first, second = begun(one, oid, 1), begun(two, oid, 2)
        one.tpc_vote(first)
        committed = one.tpc_finish(first)
        with pytest.raises(ConflictError) as caught:
            two.tpc_vote(second)
            two.tpc_finish(second)
        two.tpc_abort(second)
        assert isinstance(caught.value, transaction.interfaces.TransientError)
        two.sync()
        assert two.load(oid) == (zodb_pickle(MinPO(1)), committed)
    finally:
        one.close()
        two.close()

