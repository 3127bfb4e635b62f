"""One commit in progress: what was stored, how vote checks it and finish publishes it.

``store``/``restore``/``deleteObject``/``undo`` only buffer in memory.  Vote takes a
connection from the pool, opens the write transaction, stages every state in one bulk
statement, locks and finds conflicts in one query, resolves what it can, and leaves the
locks held.  Finish takes the commit lock, allocates the tid (strictly after the last
one, close to the clock), moves the staged states in a few set-based statements and
commits.  Abort rolls back and gives the connection back.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ZODB.POSException import ConflictError, ReadConflictError, StorageTransactionError
from ZODB.utils import newTid, p64, u64

from zodbsql.errors import DatabaseError
from zodbsql.storage.records import checksum, references, verified

if TYPE_CHECKING:
    from zodbsql.backends.base.connections import DBConnection
    from zodbsql.storage.storage import SQLStorage


class PendingCommit:
    def __init__(self, storage: "SQLStorage", transaction: Any, tid: bytes | None,
                 status: str) -> None:
        self.storage = storage
        self.transaction = transaction
        self.requested_tid = u64(tid) if tid is not None else None
        self.status = status
        # oid -> (expected previous tid, state or None for a deletion)
        self.states: dict[int, tuple[int, bytes | None]] = {}
        # States that skip conflict detection (restore, undo computed under its own check).
        self.unchecked: set[int] = set()
        # oid -> tid whose state this one copies (undo, restore with a backpointer).
        self.data_tids: dict[int, int] = {}
        self.read_current: dict[int, int] = {}
        self.conn: "DBConnection | None" = None
        self.voted = False
        self.resolved: set[bytes] = set()
        self.tid: int | None = None

    # -- buffering --------------------------------------------------------------------------
    def store(self, oid: int, prev_tid: int, state: bytes | None) -> None:
        if oid in self.states and oid not in self.unchecked:
            # Stored twice in one transaction: keep the first expectation, the last state.
            prev_tid = self.states[oid][0]
        self.states[oid] = (prev_tid, state)
        self.data_tids.pop(oid, None)

    def restore(self, oid: int, state: bytes | None, data_tid: int | None) -> None:
        self.states[oid] = (0, state)
        self.unchecked.add(oid)
        if data_tid is None:
            self.data_tids.pop(oid, None)
        else:
            self.data_tids[oid] = data_tid

    # -- vote -------------------------------------------------------------------------------
    def vote(self) -> set[bytes]:
        shared = self.storage.shared
        backend = shared.backend
        conn = self.conn = shared.pool.acquire(shared.options.commit_lock_timeout)
        self._check_sizes()  # before anything is sent, so nothing is half-written
        backend.locker.begin_commit(conn, shared.options.commit_lock_timeout)
        mover = backend.mover
        mover.clear_staged(conn)
        rows = []
        refs = []
        for oid, (prev_tid, state) in self.states.items():
            rows.append((oid, prev_tid, self.data_tids.get(oid), checksum(state),
                         len(state) if state else 0, state))
            refs.extend((oid, ref) for ref in references(oid, state))
        mover.stage(conn, rows, refs)
        conflicts, read_conflicts = backend.locker.lock_objects(conn, self.read_current)
        for oid, expected, actual in read_conflicts:
            raise ReadConflictError(oid=p64(oid), serials=(p64(actual), p64(expected)))
        for oid, expected, actual in conflicts:
            if oid in self.unchecked:
                continue
            self._resolve(conn, oid, expected, actual)
        self.voted = True
        return self.resolved

    def _check_sizes(self) -> None:
        """Refuse states larger than one statement may carry (``Features.max_state_size``)."""
        backend = self.storage.shared.backend
        limit = backend.features.max_state_size
        if limit is None:
            return
        for oid, (_, state) in self.states.items():
            if state is not None and len(state) > limit:
                detail = backend.features.max_state_size_detail
                raise DatabaseError(
                    f"the state of oid 0x{oid:016x} is {len(state)} bytes, larger than the"
                    f" {limit} bytes {backend.describe()} accepts in one statement"
                    + (f" ({detail})" if detail else "")
                    + "; nothing of this transaction was written")

    def _resolve(self, conn: "DBConnection", oid: int, expected: int, actual: int) -> None:
        prev_tid, state = self.states[oid]
        if state is None or actual == 0 or expected == 0:
            # A deletion, a vanished object or a second creation can't be merged.
            raise ConflictError(oid=p64(oid), serials=(p64(actual), p64(expected)))
        # The committed state is read on the commit connection: the instance's own load
        # connection may hold an older snapshot (history-free read transaction).
        row = self.storage.shared.backend.mover.load_serial(conn, oid, actual)
        if row is None or row[2] is None:
            raise ConflictError(oid=p64(oid), serials=(p64(actual), p64(expected)))
        committed = verified(oid, actual, row[1], bytes(row[2])) or b""
        resolved = self.storage.tryToResolveConflict(
            p64(oid), p64(actual), p64(expected), state, committed)
        self.states[oid] = (actual, resolved)
        self.data_tids.pop(oid, None)
        self.storage.shared.backend.mover.restage(
            conn, oid, actual, checksum(resolved), len(resolved), resolved,
            references(oid, resolved))
        self.resolved.add(p64(oid))

    # -- finish -----------------------------------------------------------------------------
    def finish(self) -> int:
        if not self.voted or self.conn is None:
            raise StorageTransactionError("tpc_finish called before tpc_vote")
        conn = self.conn
        backend = self.storage.shared.backend
        backend.locker.lock_commit(conn, self.storage.shared.options.commit_lock_timeout)
        last = backend.history.read_last_tid(conn)
        if self.requested_tid is not None:
            if self.requested_tid <= last:
                raise StorageTransactionError(
                    f"transaction id 0x{self.requested_tid:016x} is not after the last"
                    f" committed one, 0x{last:016x} (restored transactions must come in order)")
            tid = self.requested_tid
        else:
            tid = u64(newTid(p64(last) if last else None))
        meta = self.transaction
        backend.history.record_commit(
            conn, tid, _as_bytes(meta.user), _as_bytes(meta.description),
            _extension_bytes(meta))
        if self.states:
            backend.mover.move_staged(conn, tid)
            highest = max(self.states)
            if highest > self.storage.shared.highest_oid_seen:
                backend.oids.ensure_above(conn, highest)
                self.storage.shared.highest_oid_seen = highest
        conn.commit()
        self.tid = tid
        return tid

    def release(self) -> None:
        if self.conn is not None:
            self.storage.shared.pool.release(self.conn)
            self.conn = None

    def abort(self) -> None:
        if self.conn is not None:
            self.conn.rollback()
        self.release()


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value or "").encode("utf-8")


def _extension_bytes(meta: Any) -> bytes:
    data = getattr(meta, "extension_bytes", None)
    if data is not None:
        return bytes(data)
    extension = getattr(meta, "extension", None) or getattr(meta, "_extension", None)
    if not extension:
        return b""
    from ZODB._compat import dumps
    return dumps(extension, 3)

