"""History and undo over the backend's history role (history-preserving mode).

Undo is planned when ``undo()`` is called, so an impossible undo fails at once with
``UndoError``; what it plans is ordinary buffered stores whose expected serial is the
current tid, so vote's conflict check still protects against a concurrent commit.
"""
from __future__ import annotations

import base64
from typing import Any, Callable

from ZODB import POSException
from ZODB._compat import loads
from ZODB.TimeStamp import TimeStamp
from ZODB.utils import p64, u64

from zodbsql.backends.base.contract import BackendContract, ConnectionRole
from zodbsql.storage.commit import PendingCommit
from zodbsql.storage.records import as_int, checksum, verified
from zodbsql.storage.shared import Shared

#: ZODB's ``tryToResolveConflict(oid, committed serial, old serial, new state,
#: committed state)``: the merged state, or ConflictError.
ConflictResolver = Callable[[bytes, bytes, bytes, bytes, bytes], bytes]

PACKED_TID = "packed_tid"


def tid_time(tid: int) -> float:
    seconds: float = TimeStamp(p64(tid)).timeTime()
    return seconds


def decode_extension(data: bytes | None) -> dict[str, Any]:
    if not data:
        return {}
    try:
        value = loads(bytes(data))
    except Exception:
        return {}
    return value if isinstance(value, dict) else {}


def _text(value: bytes | None) -> bytes:
    return bytes(value) if value is not None else b""


def object_history(backend: BackendContract, conn: ConnectionRole, oid: bytes,
                   size: int) -> list[dict[str, Any]]:
    rows = backend.history.object_history(conn, u64(oid), max(1, size))
    if not rows:
        raise POSException.POSKeyError(oid)
    result = []
    for tid, state_size, user, description, extension in rows:
        entry = decode_extension(extension)
        entry.update(time=tid_time(tid), tid=p64(tid), serial=p64(tid),
                     user_name=_text(user), description=_text(description),
                     size=int(state_size))
        result.append(entry)
    return result


def packed_tid(backend: BackendContract, conn: ConnectionRole) -> int:
    value = backend.history.get_meta(conn, PACKED_TID)
    return int(value) if value else 0


def undo_log(shared: Shared, conn: ConnectionRole, first: int, last: int,
             filter: Callable[[dict[str, Any]], bool] | None) -> list[dict[str, Any]]:
    if not shared.options.keep_history:
        return []
    if last < 0:
        last = first - last
    after = packed_tid(shared.backend, conn)
    found: list[dict[str, Any]] = []
    offset, batch = 0, max(20, last)
    while len(found) < last:
        rows = shared.backend.history.undo_log(conn, after, offset, batch)
        if not rows:
            break
        offset += len(rows)
        for tid, user, description, extension in rows:
            entry = decode_extension(extension)
            entry.update(id=p64(tid), time=tid_time(tid), user_name=_text(user),
                         description=_text(description))
            if filter is None or filter(entry):
                found.append(entry)
    return found[first:last]


def _transaction_id(transaction_id: bytes | str) -> int:
    if isinstance(transaction_id, str):
        transaction_id = transaction_id.encode("ascii")
    if len(transaction_id) == 8:
        return as_int(transaction_id)
    try:
        decoded = base64.decodebytes(transaction_id + b"\n")
    except Exception:
        decoded = b""
    if len(decoded) != 8:
        raise POSException.UndoError(f"invalid transaction id {transaction_id!r}")
    return as_int(decoded)


def undo(shared: Shared, conn: ConnectionRole, pending: PendingCommit,
         transaction_id: bytes, resolve: ConflictResolver) -> tuple[bytes, list[bytes]]:
    """Buffer the stores that undo ``transaction_id``; return ``(tid, oids)``."""
    if not shared.options.keep_history:
        raise POSException.UndoError("undo needs a history-preserving storage")
    tid = _transaction_id(transaction_id)
    backend = shared.backend
    if not backend.history.transaction_exists(conn, tid) or tid <= packed_tid(backend, conn):
        raise POSException.UndoError("Invalid transaction id")
    oids = []
    for oid, undone_checksum, _ in backend.history.transaction_states(conn, tid):
        state, data_tid = _undo_one(backend, conn, pending, oid, tid, undone_checksum,
                                    resolve, shared.codec.checksum_key)
        current_tid = backend.mover.current_tid(conn, oid) or 0
        prev_tid = pending.states[oid][0] if oid in pending.states else current_tid
        pending.states[oid] = (prev_tid, state)
        if data_tid is None:
            pending.data_tids.pop(oid, None)
        else:
            pending.data_tids[oid] = data_tid
        oids.append(p64(oid))
    return p64(tid), oids


def _undo_one(backend: BackendContract, conn: ConnectionRole, pending: PendingCommit,
              oid: int, tid: int, undone_checksum: int | None, resolve: ConflictResolver,
              key: bytes | None) -> tuple[bytes | None, int | None]:
    """The state that undoes ``tid``'s record of ``oid`` and the tid it copies, or UndoError."""
    before = backend.history.state_before(conn, oid, tid)
    restored = before.state if before is not None else None
    before_tid = before.tid if before is not None else None
    row = backend.mover.load_current(conn, oid)
    if row is None:
        raise POSException.UndoError("the object no longer exists", p64(oid))
    current_tid = row.tid
    if oid in pending.states:
        # Undone twice in one transaction: undo against what is already buffered.
        current_state = pending.states[oid][1]
        current_checksum = checksum(current_state, key)
        unchanged = current_checksum == undone_checksum
    else:
        current_checksum = row.checksum
        current_state = verified(oid, current_tid, row.checksum, row.state, key)
        unchanged = current_tid == tid or current_checksum == undone_checksum
    if unchanged:
        return restored, before_tid
    if restored is None or current_state is None:
        raise POSException.UndoError("Some data were modified by a later transaction", p64(oid))
    try:
        resolved = resolve(p64(oid), p64(current_tid), p64(tid), restored, current_state)
    except POSException.ConflictError:
        raise POSException.UndoError("Some data were modified by a later transaction",
                                     p64(oid)) from None
    return resolved, None
