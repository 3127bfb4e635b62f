"""IStorageIteration: transactions in tid order, and every current record.

The iterator reads through its own connection, a batch of transactions at a time, so a
long copy never holds one huge result in memory nor the load connection of the storage.
"""
from __future__ import annotations

from typing import Any, Iterator

from ZODB.BaseStorage import DataRecord, TransactionRecord
from ZODB.utils import p64, u64

from zodbsql.backends.base.contract import BackendContract, ConnectionRole
from zodbsql.storage.history import decode_extension
from zodbsql.storage.shared import Shared

CURRENT_RECORDS_BATCH = 100


class SQLTransactionRecord(TransactionRecord):  # type: ignore[misc]  # ZODB is untyped
    def __init__(self, tid: int, status: str, user: bytes, description: bytes,
                 extension: bytes | None, records: list[DataRecord]) -> None:
        super().__init__(p64(tid), status, user, description, decode_extension(extension))
        # The bytes as committed, not the dictionary pickled again: a copy (convert,
        # zodbconvert) then records the same bytes as its source.
        self.extension_bytes = bytes(extension) if extension else b""
        self._records = records

    def __iter__(self) -> Iterator[DataRecord]:
        return iter(self._records)


class TransactionIterator:
    def __init__(self, shared: Shared, start: bytes | None, stop: bytes | None) -> None:
        self._conn = shared.connect()
        # Transactions committed after the iterator was made are not part of it.
        last = shared.backend.poller.last_tid(self._conn)
        upto = min(u64(stop), last) if stop else last
        self._rows = shared.backend.history.iter_transactions(
            self._conn, u64(start) if start else 0, upto)
        self._open = True

    def __iter__(self) -> "TransactionIterator":
        return self

    def __next__(self) -> SQLTransactionRecord:
        if not self._open:
            raise StopIteration
        try:
            (tid, packed, user, description, extension), states = next(self._rows)
        except StopIteration:
            self.close()
            raise
        records = [DataRecord(p64(oid), p64(tid), state,
                              p64(data_tid) if data_tid is not None else None)
                   for oid, state, data_tid in states]
        return SQLTransactionRecord(tid, "p" if packed else " ", user, description,
                                    extension, records)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._conn.close()


def record_iternext(backend: BackendContract, conn: ConnectionRole,
                    next_oid: Any) -> tuple[bytes, bytes, bytes, Any]:
    """One current record per call: ``(oid, tid, state, next)``; next is None at the end."""
    after = -1 if next_oid is None else u64(next_oid) - 1
    rows = backend.history.current_records(conn, after, 2)
    if not rows:
        raise ValueError("no more records")
    oid, tid, state = rows[0]
    following = p64(rows[1].oid) if len(rows) > 1 else None
    return p64(oid), p64(tid), state, following
