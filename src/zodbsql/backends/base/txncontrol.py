"""Transaction control: the serialised final step of a commit.

``finish`` takes the commit lock, allocates the tid (the clock's tid, or one past the
last, whichever is later; or the tid a restore asked for, which must come after the
last), records the transaction, moves the staged states in under it and returns it.
The portable version sends one statement per step; a backend with server-side
procedures does it all in one call.  The caller commits.

``commit_outcome`` answers the one question a lost COMMIT leaves open: is the
transaction in the database?  It runs on a new connection, after the backend made sure
the old session can no longer change the answer (``settle_session``).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Mapping

from ZODB.POSException import StorageTransactionError
from ZODB.utils import p64

from zodbsql.backends.base.contract import BackendContract, ConnectionRole
from zodbsql.backends.base.statements import for_mode, in_list
from zodbsql.errors import BlobContentVanished


def blob_vanished(oid: int | None) -> BlobContentVanished:
    where = f" of oid 0x{oid:016x}" if oid is not None else ""
    return BlobContentVanished(
        f"the blob content{where} was freed by a pack while this transaction committed;"
        " the transaction can be retried", oid=p64(oid) if oid is not None else None)


def out_of_order(requested: int, last: int) -> StorageTransactionError:
    return StorageTransactionError(
        f"transaction id 0x{requested:016x} is not after the last committed one,"
        f" 0x{last:016x} (restored transactions must come in order)")


HP_HAS_TRANSACTION = "SELECT 1 FROM transactions WHERE tid = %s"
HP_STATES_AT = "SELECT zoid, checksum FROM object_state WHERE tid = %s AND zoid IN ({oids})"
HF_CURRENT_STATES = "SELECT zoid, tid, checksum FROM object_state WHERE zoid IN ({oids})"
#: Oids of a commit looked at to recognise it (enough to tell it from any other).
PROBE_OIDS = 100


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutcomeStatements:
    """What ``commit_outcome`` reads, in one history mode ("": none in this mode)."""

    #: Is the transaction recorded (history-preserving)?
    has_transaction: str = ""
    #: ``(oid, checksum)`` the transaction wrote to ``{oids}``; history-free
    #: ``(oid, tid, checksum)`` of their current states.
    written_states: str


class TransactionControl:
    """The portable final step, one statement per step (a ``TransactionControlRole``)."""

    HISTORY_PRESERVING: ClassVar[OutcomeStatements] = OutcomeStatements(
        has_transaction=HP_HAS_TRANSACTION, written_states=HP_STATES_AT)
    HISTORY_FREE: ClassVar[OutcomeStatements] = OutcomeStatements(
        written_states=HF_CURRENT_STATES)

    #: The portable finish leaves COMMIT to the caller.
    finishes_with_commit: ClassVar[bool] = False

    def __init__(self, backend: BackendContract) -> None:
        self.backend = backend
        self.sql = for_mode(backend.keep_history, self.HISTORY_PRESERVING, self.HISTORY_FREE)

    def finish(self, conn: ConnectionRole, clock_tid: int, requested_tid: int | None,
               user: bytes, description: bytes, extension: bytes, lock_timeout: float,
               has_states: bool = True, check_blobs: bool = False,
               blobs: bool = True, commit: bool = False) -> int:
        """``blobs``: the commit may change blob references (see ``Mover.move_staged``).
        ``commit`` is never asked of this version (``finishes_with_commit``).
        ``check_blobs``: the commit staged blob contents kept in the database; check
        under the commit lock that each is still complete (a pack may have freed one)."""
        backend = self.backend
        conn.commit_previous = None
        locked_last = backend.locker.lock_commit(conn, lock_timeout)
        if check_blobs:
            missing = backend.blobs.staged_missing(conn)
            if missing is not None:
                raise blob_vanished(missing)
        last = locked_last if locked_last is not None else backend.poller.last_tid(conn)
        if requested_tid is not None:
            if requested_tid <= last:
                raise out_of_order(requested_tid, last)
            tid = requested_tid
        else:
            tid = max(clock_tid, last + 1)
        backend.history.record_commit(conn, tid, user, description, extension)
        if has_states:
            backend.mover.move_staged(conn, tid, blobs)
        # Read under the commit lock: nothing can be committed between it and ``tid``.
        conn.commit_previous = last
        return tid

    # -- after a lost COMMIT -------------------------------------------------------------
    def settle_session(self, conn: ConnectionRole, old: ConnectionRole,
                       deadline: float) -> bool:
        """Make sure the session of ``old`` can no longer commit or roll back; return
        False if that could not be made sure by ``deadline`` (``time.monotonic()``).

        The portable version closes ``old``: for an embedded database that ends it."""
        old.close()
        return True

    def commit_outcome(self, conn: ConnectionRole, old: ConnectionRole, tid: int | None,
                       written: Mapping[int, int | None], deadline: float) -> bool | None:
        """Was the commit of ``tid`` on ``old`` made durable?  True, False, or None when
        it can't be told.  ``written``: oid -> checksum of the state the commit wrote
        (None for a deletion).  Runs on ``conn``, a new connection."""
        if not self.settle_session(conn, old, deadline) or tid is None:
            return None
        probe = sorted(written)[:PROBE_OIDS]
        if self.backend.keep_history:
            return self._outcome_with_history(conn, tid, written, probe)
        return self._outcome_history_free(conn, tid, written, probe)

    def _outcome_with_history(self, conn: ConnectionRole, tid: int,
                              written: Mapping[int, int | None], probe: list[int]) -> bool:
        if conn.fetchone(self.sql.has_transaction, (tid,)) is None:
            return False
        if not probe:
            return True
        sql = self.sql.written_states.format(oids=in_list(len(probe)))
        found = {int(o): c for o, c in conn.fetchall(sql, [tid, *probe])}
        # A later commit could only have reused this tid if ours never happened; it
        # would have to have written the very same states to be mistaken for ours.
        return all(oid in found and _same(found[oid], written[oid]) for oid in probe)

    def _outcome_history_free(self, conn: ConnectionRole, tid: int,
                              written: Mapping[int, int | None],
                              probe: list[int]) -> bool | None:
        if not probe:
            return True  # an empty commit changes no data: nothing can be applied twice
        sql = self.sql.written_states.format(oids=in_list(len(probe)))
        current = {int(o): (int(t), c) for o, t, c in conn.fetchall(sql, probe)}
        older = 0
        for oid in probe:
            row = current.get(oid)
            if row is None:
                if written[oid] is not None:
                    older += 1  # a state ours wrote would be there (or a later one)
                continue
            row_tid, row_checksum = row
            if row_tid == tid and _same(row_checksum, written[oid]):
                return True
            if row_tid < tid:
                # Ours would have replaced it, and later commits only raise the tid.
                return False
        # No object shows a state ours wrote: ours never landed.  Otherwise later commits
        # replaced what ours may have written.
        return False if older == len(probe) else None


def _same(stored: int | None, checksum: int | None) -> bool:
    """Is the stored checksum the one written (None: a deletion)?"""
    if checksum is None:
        return stored is None
    return stored is not None and int(stored) == checksum
