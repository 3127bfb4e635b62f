"""A helper for tests that need transactions with chosen tids."""
from __future__ import annotations

from typing import Any

from ZODB.Connection import TransactionMetaData
from ZODB.utils import p64, u64


def restore_consecutive(storage: Any, count: int) -> list[bytes]:
    """Commit ``count`` transactions with consecutive tids (nothing between two of
    them, as a copy may restore them), the i-th writing oid i + 1; return the tids."""
    first = u64(storage.lastTransaction()) + (1 << 40)
    tids = [p64(first + i) for i in range(count)]
    for i, tid in enumerate(tids):
        txn = TransactionMetaData()
        storage.tpc_begin(txn, tid)
        storage.restore(p64(i + 1), tid, b"state %d" % i, "", None, txn)
        storage.tpc_vote(txn)
        storage.tpc_finish(txn)
    return tids
