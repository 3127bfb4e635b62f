"""Transaction control: the serialised final step of a commit.

``finish`` takes the commit lock, allocates the tid (the clock's tid, or one past the
last, whichever is later; or the tid a restore asked for, which must come after the
last), records the transaction, moves the staged states in under it and returns it.
The portable version sends one statement per step; a backend with server-side
procedures does it all in one call.  The caller commits.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ZODB.POSException import StorageTransactionError
from ZODB.utils import p64

from zodbsql.errors import BlobContentVanished

if TYPE_CHECKING:
    from zodbsql.backends.base.adapter import Backend
    from zodbsql.backends.base.connections import DBConnection


def blob_vanished(oid: int | None) -> BlobContentVanished:
    where = f" of oid 0x{oid:016x}" if oid is not None else ""
    return BlobContentVanished(
        f"the blob content{where} was freed by a pack while this transaction committed;"
        " the transaction can be retried", oid=p64(oid) if oid is not None else None)


def out_of_order(requested: int, last: int) -> StorageTransactionError:
    return StorageTransactionError(
        f"transaction id 0x{requested:016x} is not after the last committed one,"
        f" 0x{last:016x} (restored transactions must come in order)")


class TransactionControl:
    def __init__(self, backend: "Backend") -> None:
        self.backend = backend

    def finish(self, conn: "DBConnection", clock_tid: int, requested_tid: int | None,
               user: bytes, description: bytes, extension: bytes, lock_timeout: float,
               has_states: bool = True, check_blobs: bool = False,
               blobs: bool = True) -> int:
        """``blobs``: the commit may change blob references (see ``Mover.move_staged``).
        ``check_blobs``: the commit staged blob contents kept in the database; check
        under the commit lock that each is still complete (a pack may have freed one)."""
        backend = self.backend
        backend.locker.lock_commit(conn, lock_timeout)
        if check_blobs:
            missing = backend.blobs.staged_missing(conn)
            if missing is not None:
                raise blob_vanished(missing)
        last = backend.poller.last_tid(conn)
        if requested_tid is not None:
            if requested_tid <= last:
                raise out_of_order(requested_tid, last)
            tid = requested_tid
        else:
            tid = max(clock_tid, last + 1)
        backend.history.record_commit(conn, tid, user, description, extension)
        if has_states:
            backend.mover.move_staged(conn, tid, blobs)
        return tid
