"""One commit in progress: what was stored, how vote checks it and finish publishes it.

``store``/``restore``/``deleteObject``/``undo`` only buffer in memory.  Vote takes a
connection from the pool, opens the write transaction, stages every state in one bulk
statement, locks and finds conflicts in one query, resolves what it can, and leaves the
locks held.  Finish takes the commit lock, allocates the tid (strictly after the last
one, close to the clock), moves the staged states in a few set-based statements and
commits.  Abort rolls back and gives the connection back.

Blobs (when the storage has a blob directory): ``storeBlob`` moves the file into the
blob temp directory.  Vote hashes each file; in the database layout it uploads the
chunks of contents the database does not have yet, and stages ``(oid, hash)`` either
way.  Finish moves the staged references with the states; in the shared layout it puts
the files in place after the tid is known and before the database commit.
"""
from __future__ import annotations

import itertools
import logging
import operator
import time
from typing import Any, Callable

from ZODB.POSException import ConflictError, ReadConflictError, StorageTransactionError
from ZODB.utils import newTid, p64, u64

from zodbsql.backends.base.contract import (STAGED_OID, STAGED_SIZE, STAGED_STATE, Conflict,
                                            ConnectionRole, ResolvedState,
                                            StagedState)
from zodbsql.errors import (CommitOutcomeUnknown, ConnectionLost, DatabaseConflict,
                            DatabaseError, ServerChangedConflict, described)
from zodbsql.storage.blobs import file_chunks, file_hash, remove_quietly
from zodbsql.storage.records import (checksum, checksummer, references, references_text,
                                      refers_to_nothing, verified)
from zodbsql.storage.shared import Shared

log = logging.getLogger(__name__)

#: Seconds between attempts to reach the database after a lost COMMIT.
RECONNECT_PAUSE = 0.2


#: ZODB's conflict resolution: ``(oid, committed tid, old tid, new state, committed
#: state) -> resolved state``, or ConflictError (``SQLStorage.resolve_conflict``).
Resolver = Callable[[int, int, int, "bytes | None", bytes], bytes]


#: A staged row's stored size and its state, read in C.
_size = operator.itemgetter(STAGED_SIZE)
_state_of = operator.itemgetter(STAGED_STATE)
#: The state of a ``PendingCommit.states`` value (expected tid, state).
_pending_state = operator.itemgetter(1)

#: Numbers commits in this process (an id() would be reused by a later commit).
_SERIALS = itertools.count(1)


class PendingCommit:
    def __init__(self, shared: Shared, resolve: Resolver, transaction: Any,
                 tid: bytes | None, status: str) -> None:
        self.serial = next(_SERIALS)
        self.shared = shared
        self.resolve = resolve
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
        self.conn: "ConnectionRole | None" = None
        self.voted = False
        self.resolved: set[bytes] = set()
        # Blobs: oid -> file in the blob temp dir; after vote, oid -> (hash, size,
        # revision with the same content in the shared layout).
        self.blob_files: dict[int, str] = {}
        self.blob_staged: dict[int, tuple[bytes, int, tuple[int, int] | None]] = {}
        # The tid of a commit that wrote its states at vote (``_write_at_vote``).
        self.written_tid: int | None = None
        # The last tid before this commit's, when finish told it (storage.py: the next
        # start need not poll when it is the committing instance's snapshot).
        self.previous_tid: int | None = None
        #: Is the snapshot this commit's reads came from still the server's?  (Set by
        #: the storage for an instance that polled; ``vote`` asks it once it holds a
        #: connection, which is where a restart or failover shows.)
        self.snapshot_current: Callable[[], bool] | None = None

    # -- buffering --------------------------------------------------------------------------
    def store(self, oid: int, prev_tid: int, state: bytes | None) -> None:
        if oid in self.states and oid not in self.unchecked:
            # Stored twice in one transaction: keep the first expectation, the last state.
            prev_tid = self.states[oid][0]
        self.states[oid] = (prev_tid, state)
        # Tested first: a commit of many objects and no blob calls neither (3 us a store).
        if self.data_tids:
            self.data_tids.pop(oid, None)
        if self.blob_files:
            self._drop_blob(oid)

    def store_blob(self, oid: int, staged: str) -> None:
        """After ``store``/``restore`` of the same oid: its blob file (owned now)."""
        self.blob_files[oid] = staged

    def _drop_blob(self, oid: int) -> None:
        staged = self.blob_files.pop(oid, None)
        if staged is not None:
            remove_quietly(staged)

    def restore(self, oid: int, state: bytes | None, data_tid: int | None) -> None:
        self._drop_blob(oid)
        self.states[oid] = (0, state)
        self.unchecked.add(oid)
        if data_tid is None:
            self.data_tids.pop(oid, None)
        else:
            self.data_tids[oid] = data_tid

    # -- vote -------------------------------------------------------------------------------
    def vote(self) -> set[bytes]:
        shared = self.shared
        backend = shared.backend
        conn = self.conn = shared.pool.acquire(shared.options.commit_lock_timeout)
        if self.snapshot_current is not None and not self.snapshot_current():
            raise ServerChangedConflict(
                f"{backend.describe()} restarted or failed over since this transaction's"
                " snapshot, which may hold commits the server no longer has: retry it")
        rows = self._staged_rows()
        self._check_sizes(conn, rows)  # before anything is sent, so nothing is half-written
        mover = backend.mover
        locker = backend.locker
        if self._writes_at_vote(rows):
            self._write_at_vote(conn, rows)
            self.voted = True
            return self.resolved
        mover.clear_staged(conn)  # before the transaction: MySQL's TRUNCATE would end it
        if (not (rows or self.blob_files or self.data_tids or self.read_current)
                and locker.skip_empty_lock and backend.txncontrol.finishes_with_commit):
            # Nothing to stage or lock: finish runs alone, a transaction of its own.
            self.voted = True
            return self.resolved
        # The transaction begins with the first statement that needs it: the blobs'
        # (inside it), else the staging call, which may carry BEGIN (PostgreSQL).
        wait = shared.options.row_lock_wait
        begin: float | None = wait
        if self.blob_files or self.data_tids:
            locker.begin_commit(conn, wait)
            begin = None
            self._stage_blobs(conn)
        if not (rows or self.blob_staged or self.read_current) and locker.skip_empty_lock:
            if begin is not None:
                locker.begin_commit(conn, begin)
            self.voted = True  # nothing staged, nothing read-current: nothing to lock
            return self.resolved
        conflicts, read_conflicts = locker.stage_and_lock(
            conn, mover, rows, self.read_current, begin=begin)
        for oid, expected, actual in read_conflicts:
            raise ReadConflictError(oid=p64(oid), serials=(p64(actual), p64(expected)))
        self._restage_resolved(conn, [c for c in conflicts if c.oid not in self.unchecked])
        self.voted = True
        return self.resolved

    def _writes_at_vote(self, rows: list[StagedState]) -> bool:
        """Can this commit write its states at vote (``Features.writes_at_vote``)?  Not
        with blobs, copies or deletions, which finish's set-based steps handle."""
        return (bool(rows) and self.shared.backend.features.writes_at_vote
                and not (self.blob_files or self.data_tids)
                and None not in map(_state_of, rows))

    def _write_at_vote(self, conn: ConnectionRole, rows: list[StagedState]) -> None:
        """Check, resolve and write the states under the write lock that vote takes and
        finish's COMMIT ends: nobody else can commit in between, so the tid is taken
        now (``finish`` of the backend, without states) and the states go straight
        into their table, under it, with nothing staged."""
        shared = self.shared
        backend = shared.backend
        backend.locker.begin_commit(conn, shared.options.row_lock_wait)
        checked = [row[STAGED_OID] for row in rows if row[STAGED_OID] not in self.unchecked]
        current = backend.locker.current_tids(
            conn, sorted(set(checked).union(self.read_current)))
        for oid, expected in self.read_current.items():
            actual = current.get(oid, 0)
            if actual != expected:
                raise ReadConflictError(oid=p64(oid), serials=(p64(actual), p64(expected)))
        states = self.states
        conflicts = [Conflict(oid, states[oid][0], current.get(oid, 0)) for oid in checked
                     if current.get(oid, 0) != states[oid][0]]
        if conflicts:
            resolved = {row.oid: row for row in self._resolve(conn, conflicts)}
            rows = [row if row[STAGED_OID] not in resolved else
                    _staged(resolved[row[STAGED_OID]]) for row in rows]
        self.written_tid = self._call_finish(u64(newTid(None)), False, commit=False,
                                             has_states=False)
        backend.mover.write_states(conn, self.written_tid, rows)

    def _staged_rows(self) -> list[StagedState]:
        """The rows vote stages: one per state, with the oids it refers to.

        The loop runs once per stored object, so it does the least it can per state: a
        hasher made once (``checksummer``), and no codec call when the codec seals
        nothing (``references`` returns at once for a state without a reference opcode).
        """
        codec = self.shared.codec
        # A codec that compresses and encrypts nothing stores each state as it is.
        encode = codec.encode if codec.active else None
        digest = checksummer(codec.checksum_key)
        data_tids = self.data_tids
        rows: list[StagedState] = []
        add_row = rows.append
        for oid, (prev_tid, state) in self.states.items():
            data_tid = data_tids.get(oid) if data_tids else None
            if state is None:   # a deletion
                add_row((oid, prev_tid, data_tid, None, 0, None, None))
                continue
            # The checksum is of the state itself; what is stored may be sealed.
            stored = encode(oid, state) if encode is not None and state else state
            # Most states are leaves: told apart here without two calls per state.
            refs = None if refers_to_nothing(state) else references_text(
                references(oid, state))
            add_row((oid, prev_tid, data_tid, digest(state), len(stored), stored, refs))
        return rows

    def _stage_blobs(self, conn: ConnectionRole) -> None:
        files = self.shared.blob_files
        blobs = self.shared.backend.blobs
        if files is None:
            return
        rows = []
        uploaded: set[bytes] = set()
        hashed = sorted((file_hash(staged), oid, staged)
                        for oid, staged in self.blob_files.items())
        # In hash order: two commits uploading the same contents wait for each other
        # on the first one (insert-if-absent) instead of deadlocking.
        for (content_hash, size), oid, staged in hashed:
            same_as = None
            if files.shared:
                same_as = blobs.revision_with_content(conn, content_hash)
            elif content_hash in uploaded or blobs.has_content(conn, content_hash):
                pass  # stored already: nothing to upload
            else:
                # A chunk must fit one statement (MySQL: below max_allowed_packet).
                limit = conn.max_state_size
                chunk = min(files.chunk_size, limit) if limit else files.chunk_size
                blobs.upload(conn, content_hash, size, file_chunks(staged, chunk))
                uploaded.add(content_hash)
            self.blob_staged[oid] = (content_hash, size, same_as)
            rows.append((oid, content_hash))
        blobs.stage(conn, rows)
        # Undo and restores with a backpointer copy an older revision's blob reference.
        for oid, data_tid in self.data_tids.items():
            if oid not in self.blob_files:
                blobs.stage_copy(conn, oid, data_tid)

    def _check_sizes(self, conn: ConnectionRole, rows: list[StagedState]) -> None:
        """Refuse states larger, as stored (compressed, encrypted), than one statement
        may carry on ``conn``'s server (``max_state_size``)."""
        backend = self.shared.backend
        limit = conn.max_state_size
        if limit is None:
            return
        if not rows or max(rows, key=_size)[STAGED_SIZE] <= limit:
            return  # the usual case, found without a Python step per row
        for row in rows:
            oid, size, state = row[STAGED_OID], row[STAGED_SIZE], row[STAGED_STATE]
            if state is not None and size > limit:
                detail = conn.max_state_size_detail
                raise DatabaseError(
                    f"the state of oid 0x{oid:016x} is {size} bytes, larger than the"
                    f" {limit} bytes {backend.describe()} accepts in one statement"
                    + (f" ({detail})" if detail else "")
                    + "; nothing of this transaction was written")

    def _restage_resolved(self, conn: ConnectionRole, conflicts: list[Conflict]) -> None:
        """``_resolve``, the resolved states restaged in a few statements (one on
        PostgreSQL)."""
        if conflicts:
            self.shared.backend.mover.restage_many(conn, self._resolve(conn, conflicts))

    def _resolve(self, conn: ConnectionRole, conflicts: list[Conflict],
                 ) -> list[ResolvedState]:
        """Resolve write conflicts against the newest committed states, or raise; the
        resolved states.

        Runs with the row locks held, so its round trips are few whatever the number of
        conflicts: the committed states in one statement (those not in the state cache).
        """
        for oid, expected, actual in conflicts:
            if self.states[oid][1] is None or actual == 0 or expected == 0:
                # A deletion, a vanished object or a second creation can't be merged.
                raise ConflictError(oid=p64(oid), serials=(p64(actual), p64(expected)))
        shared = self.shared
        committed: dict[int, bytes] = {}
        missing: dict[int, int] = {}
        for oid, _, actual in conflicts:
            cached = shared.cache.get_revision(oid, actual)
            if cached is not None:
                committed[oid] = cached
            else:
                missing[oid] = actual
        # Read on the commit connection: the instance's own load connection may hold an
        # older snapshot (history-free read transaction).
        for oid, (stored_checksum, state) in shared.backend.mover.load_revisions(
                conn, missing).items():
            if state is not None:
                committed[oid] = verified(oid, missing[oid], stored_checksum, state,
                                          shared.codec.checksum_key) or b""
        rows: list[ResolvedState] = []
        for oid, expected, actual in conflicts:
            if oid not in committed:
                raise ConflictError(oid=p64(oid), serials=(p64(actual), p64(expected)))
            resolved = self.resolve(
                oid, actual, expected, self.states[oid][1], committed[oid])
            self.states[oid] = (actual, resolved)
            self.data_tids.pop(oid, None)
            stored = shared.codec.encode(oid, resolved) if resolved else resolved
            rows.append(ResolvedState(oid, actual, checksum(resolved, shared.codec.checksum_key),
                                      len(stored), stored,
                                      references_text(references(oid, resolved))))
            self.resolved.add(p64(oid))
        return rows

    # -- finish -----------------------------------------------------------------------------
    def finish(self) -> int:
        if not self.voted or self.conn is None:
            raise StorageTransactionError("tpc_finish called before tpc_vote")
        conn = self.conn
        # The clock's tid; the backend takes one past the last tid if that is later.
        clock_tid = u64(newTid(None))
        files = self.shared.blob_files
        blobs = bool(self.blob_staged or self.data_tids)
        check_blobs = files is not None and not files.shared and blobs
        placing = files is not None and files.shared and blobs
        if self.written_tid is not None:
            tid = self.written_tid    # written at vote (no blob: nothing to place)
        elif not placing and self.shared.backend.txncontrol.finishes_with_commit:
            return self._finish_and_commit(clock_tid, check_blobs)
        else:
            tid = self._call_finish(clock_tid, check_blobs, commit=False)
        self._raise_oid_counter()
        if placing and files is not None:
            # The files are in place before the commit makes the revisions visible; a
            # crash in between leaves only files no revision names (pack removes them).
            placed: dict[bytes, tuple[int, int]] = {}
            for oid, (content_hash, _, same_as) in self.blob_staged.items():
                files.place(oid, tid, self.blob_files.pop(oid),
                            same_as or placed.get(content_hash))
                placed.setdefault(content_hash, (oid, tid))
            for oid, data_tid in self.data_tids.items():
                if oid not in self.blob_staged:
                    files.link_revision(oid, data_tid, tid)
        try:
            conn.commit()
        except DatabaseConflict:
            # The server answered: rolled back as a whole (a Galera certification
            # failure arrives here, at COMMIT).  Retryable, nothing to settle.
            raise
        except Exception as exc:
            self._settle_lost_commit(tid, exc)  # returns only if the commit is durable
        else:
            self.previous_tid = conn.commit_previous
        self._install_blobs(tid)
        return tid

    def _install_blobs(self, tid: int) -> None:
        """After the commit: the blob files join the local cache under their hash."""
        files = self.shared.blob_files
        if files is not None and files.cache is not None:
            for oid, (content_hash, size, _) in self.blob_staged.items():
                files.hashes.put(oid, tid, content_hash)
                staged = self.blob_files.pop(oid)
                try:
                    files.cache.install(content_hash, size, staged)
                except OSError:
                    remove_quietly(staged)

    def _call_finish(self, clock_tid: int, check_blobs: bool, commit: bool,
                     has_states: bool = True) -> int:
        """The backend's finish of this commit (``commit``: with COMMIT; without
        ``has_states``, no staged state is moved)."""
        conn = self.conn
        assert conn is not None
        meta = self.transaction
        return self.shared.backend.txncontrol.finish(
            conn, clock_tid, self.requested_tid, _as_bytes(meta.user),
            _as_bytes(meta.description), _extension_bytes(meta),
            self.shared.options.commit_lock_timeout, has_states and bool(self.states),
            check_blobs=check_blobs, blobs=self._changes_blob_refs(), commit=commit)

    def _finish_and_commit(self, clock_tid: int, check_blobs: bool) -> int:
        """Finish and COMMIT in one round trip (no blob file to place under the tid)."""
        conn = self.conn
        assert conn is not None
        self._raise_oid_counter()
        try:
            tid = self._call_finish(clock_tid, check_blobs, commit=True)
        except ConnectionLost as exc:
            # The server answered nothing: COMMIT may have run.  (An error it answered
            # with means the transaction was rolled back: raised as it is.)
            tid = self._settle_lost_commit(None, exc)
        else:
            self.previous_tid = conn.commit_previous
        self._install_blobs(tid)
        return tid

    def _raise_oid_counter(self) -> None:
        """Restored and copied objects bring their own oids: none is handed out again."""
        if self.states:
            highest = max(self.states)
            if highest > self.shared.highest_oid_seen:
                assert self.conn is not None
                self.shared.backend.oids.ensure_above(self.conn, highest)
                self.shared.highest_oid_seen = highest

    def _settle_lost_commit(self, tid: int | None, error: Exception) -> int:
        """COMMIT of ``tid`` failed with ``error``: find out whether it happened anyway.

        Returns the tid if the transaction is in the database (the application sees a
        normal commit).  Raises ``error`` again if it certainly is not (a lost connection
        stays a retryable ``ConnectionLost``), and the never-retryable
        ``CommitOutcomeUnknown`` if the database can't tell or can't be reached within
        commit-lock-timeout.  ``tid`` None: COMMIT went with finish, whose answer (the
        tid) was lost too; the lookup finds the tid.
        """
        shared = self.shared
        backend = shared.backend
        old = self.conn
        assert old is not None
        old.broken = True
        key = shared.codec.checksum_key
        written = {oid: checksum(state, key) for oid, (_, state) in self.states.items()}
        deadline = time.monotonic() + max(shared.options.commit_lock_timeout, 1.0)
        outcome: bool | None = None
        last_problem: Exception = error
        while True:
            try:
                probe = backend.connect()
            except DatabaseError as exc:  # the server may be restarting: try again
                last_problem = exc
                if time.monotonic() >= deadline:
                    break
                time.sleep(RECONNECT_PAUSE)
                continue
            try:
                outcome = backend.txncontrol.commit_outcome(probe, old, tid, written, deadline)
            except DatabaseError as exc:
                last_problem = exc
                outcome = None
            finally:
                probe.close()
            break
        where = backend.describe()
        if outcome is True:
            if tid is None:
                tid = old.commit_tid
                assert tid is not None, "commit_outcome found the commit, not its tid"
            log.warning("COMMIT of transaction 0x%016x on %s reported %s, but the"
                        " transaction is in the database: it counts as committed",
                        tid, where, described(error))
            return tid
        which = (f"transaction 0x{tid:016x}" if tid is not None else
                 "a transaction (its tid was not known yet)")
        if outcome is False:
            if isinstance(error, ConnectionLost):
                raise ConnectionLost(
                    f"the connection to {where} was lost during COMMIT of {which}, which"
                    " the database confirms was not committed; the transaction can be"
                    " retried") from error
            raise error
        if tid is None:
            nonce = getattr(old, "commit_nonce", None)
            look = f"for nonce {nonce} in zodbsql's commit_log table first"
        else:
            look = (f"for transaction 0x{tid:016x} in the database first (in a history-"
                    "preserving database, zodbsql's transactions table)")
        raise CommitOutcomeUnknown(
            f"COMMIT of {which} on {where} failed ({error}) and whether it was applied"
            f" could not be found out ({last_problem}). Do not simply retry it: look"
            f" {look}, since retrying a committed transaction applies it twice",
            tid) from error

    def _changes_blob_refs(self) -> bool:
        """Can this commit add, replace or drop a blob reference?"""
        if self.blob_staged or self.data_tids or self.unchecked:
            return True
        return None in map(_pending_state, self.states.values())

    def release(self) -> None:
        for staged in self.blob_files.values():
            remove_quietly(staged)
        self.blob_files.clear()
        if self.conn is not None:
            self.shared.pool.release(self.conn)
            self.conn = None

    def abort(self) -> None:
        if self.conn is not None:
            self.conn.rollback()
        self.release()


def _staged(row: ResolvedState) -> StagedState:
    """A resolved state as the row vote stages."""
    return (row.oid, row.prev_tid, None, row.checksum, row.size, row.state, row.refs)


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
    pickled: bytes = dumps(extension, 3)
    return pickled

