"""Mover: object states into and out of the database.

A commit stages its states in a per-connection temporary table (``temp_store``) and their
references in ``temp_ref`` during vote; ``move_staged`` copies them into the permanent
tables under the final tid in a few set-based statements.  Loads come in three kinds:
the current revision, the revision current at a snapshot tid, and one exact revision.

Loaded rows are ``(tid, checksum, state)``; ``state`` is None for a deleted object.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Iterable, Sequence

from zodbsql.backends.base.contract import (BackendContract, ConnectionRole, ResolvedState,
                                            Revision, StagedState, StateRow)
from zodbsql.backends.base.statements import for_mode, in_list

# -- staging (both modes) -----------------------------------------------------------------
CLEAR_TEMP_STORE = "DELETE FROM temp_store"
CLEAR_TEMP_REF = "DELETE FROM temp_ref"
CLEAR_TEMP_BLOB = "DELETE FROM temp_blob"
STAGE_STATE = ("INSERT INTO temp_store (zoid, prev_tid, data_tid, checksum, state_size, state)"
               " VALUES (%s, %s, %s, %s, %s, %s)")
STAGE_REF = "INSERT INTO temp_ref (zoid, to_zoid) VALUES (%s, %s)"
RESTAGE_STATE = ("UPDATE temp_store SET prev_tid = %s, checksum = %s, state_size = %s,"
                 " state = %s WHERE zoid = %s")
UNSTAGE_REFS_OF = "DELETE FROM temp_ref WHERE zoid IN ({oids})"
MAX_STAGED_OID = "SELECT MAX(zoid) FROM temp_store"

# -- history-preserving ---------------------------------------------------------------------
HP_LOAD_CURRENT = (
    "SELECT c.tid, s.checksum, s.state FROM current_object c"
    " JOIN object_state s ON s.zoid = c.zoid AND s.tid = c.tid WHERE c.zoid = %s")
HP_LOAD_AT = (
    "SELECT tid, checksum, state FROM object_state WHERE zoid = %s AND tid <= %s"
    " ORDER BY tid DESC LIMIT 1")
HP_LOAD_SERIAL = "SELECT tid, checksum, state FROM object_state WHERE zoid = %s AND tid = %s"
HP_LOAD_BEFORE = (
    "SELECT tid, checksum, state FROM object_state WHERE zoid = %s AND tid < %s"
    " ORDER BY tid DESC LIMIT 1")
HP_NEXT_TID = "SELECT MIN(tid) FROM object_state WHERE zoid = %s AND tid > %s"
HP_EXISTS = "SELECT 1 FROM object_state WHERE zoid = %s LIMIT 1"
HP_CURRENT_TID = "SELECT tid FROM current_object WHERE zoid = %s"
HP_MOVE_STATES = (
    "INSERT INTO object_state (zoid, tid, data_tid, checksum, state_size, state)"
    " SELECT zoid, %s, data_tid, checksum, state_size, state FROM temp_store")
HP_MOVE_REFS = "INSERT INTO object_ref (zoid, tid, to_zoid) SELECT zoid, %s, to_zoid FROM temp_ref"
HP_SET_CURRENT = (
    "INSERT INTO current_object (zoid, tid) SELECT zoid, %s FROM temp_store WHERE true"
    " ON CONFLICT (zoid) DO UPDATE SET tid = excluded.tid")
HP_MOVE_BLOBS = (
    "INSERT INTO blob_ref (zoid, tid, content_hash) SELECT zoid, %s, content_hash FROM temp_blob")
HP_COUNT_OBJECTS = "SELECT COUNT(*) FROM current_object"

# -- history-free -----------------------------------------------------------------------------
HF_LOAD_CURRENT = "SELECT tid, checksum, state FROM object_state WHERE zoid = %s"
# Several exact revisions in one statement (conflict resolution reads the committed ones).
HP_LOAD_REVISIONS = (
    "SELECT zoid, tid, checksum, state FROM object_state WHERE (zoid, tid) IN ({pairs})")
HF_LOAD_REVISIONS = "SELECT zoid, tid, checksum, state FROM object_state WHERE zoid IN ({oids})"
HF_CURRENT_TID = "SELECT tid FROM object_state WHERE zoid = %s"
HF_MOVE_STATES = (
    "INSERT INTO object_state (zoid, tid, checksum, state_size, state)"
    " SELECT zoid, %s, checksum, state_size, state FROM temp_store WHERE state IS NOT NULL"
    " ON CONFLICT (zoid) DO UPDATE SET tid = excluded.tid, checksum = excluded.checksum,"
    " state_size = excluded.state_size, state = excluded.state")
HF_DELETE_REMOVED = (
    "DELETE FROM object_state WHERE zoid IN (SELECT zoid FROM temp_store WHERE state IS NULL)")
HF_DELETE_OLD_REFS = "DELETE FROM object_ref WHERE zoid IN (SELECT zoid FROM temp_store)"
HF_MOVE_REFS = "INSERT INTO object_ref (zoid, to_zoid) SELECT zoid, to_zoid FROM temp_ref"
# A new revision replaces the object's blob reference (or drops it: deleted, not a blob).
HF_DELETE_OLD_BLOBS = "DELETE FROM blob_ref WHERE zoid IN (SELECT zoid FROM temp_store)"
HF_MOVE_BLOBS = (
    "INSERT INTO blob_ref (zoid, tid, content_hash) SELECT zoid, %s, content_hash FROM temp_blob")
HF_COUNT_OBJECTS = "SELECT COUNT(*) FROM object_state"


def state_row(row: tuple[Any, ...] | None) -> StateRow | None:
    """A loaded ``(tid, checksum, state)`` row as a :class:`StateRow`."""
    if row is None:
        return None
    tid, stored_checksum, state = row
    return StateRow(int(tid), stored_checksum, bytes(state) if state is not None else None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoverStatements:
    """The mover's statements in one history mode ("": none in this mode)."""

    clear_store: str = CLEAR_TEMP_STORE
    clear_ref: str = CLEAR_TEMP_REF
    clear_blob: str = CLEAR_TEMP_BLOB
    stage_state: str = STAGE_STATE
    stage_ref: str = STAGE_REF
    restage_state: str = RESTAGE_STATE
    unstage_refs_of: str = UNSTAGE_REFS_OF
    max_staged_oid: str = MAX_STAGED_OID
    load_current: str
    #: The revision current at a snapshot tid (history-free: the current one).
    load_at: str
    #: One exact revision (history-free: the current one, compared in Python).
    load_serial: str
    load_before: str
    next_tid: str = ""
    exists: str
    current_tid: str
    count_objects: str
    #: Exact revisions: ``{pairs}`` of (oid, tid); history-free ``{oids}``.
    load_revisions: str
    move_states: str
    move_refs: str
    move_blobs: str
    set_current: str = ""
    delete_removed: str = ""
    delete_old_refs: str = ""
    delete_old_blobs: str = ""


class Mover:
    """Moves states between Python and the database for one history mode (a
    ``MoverRole``)."""

    #: Statements that create the per-connection temporary tables.
    CREATE_TEMP_TABLES: tuple[str, ...] = ()
    HISTORY_PRESERVING: ClassVar[MoverStatements] = MoverStatements(
        load_current=HP_LOAD_CURRENT, load_at=HP_LOAD_AT, load_serial=HP_LOAD_SERIAL,
        load_before=HP_LOAD_BEFORE, next_tid=HP_NEXT_TID, exists=HP_EXISTS,
        current_tid=HP_CURRENT_TID, count_objects=HP_COUNT_OBJECTS,
        load_revisions=HP_LOAD_REVISIONS, move_states=HP_MOVE_STATES, move_refs=HP_MOVE_REFS,
        move_blobs=HP_MOVE_BLOBS, set_current=HP_SET_CURRENT)
    HISTORY_FREE: ClassVar[MoverStatements] = MoverStatements(
        load_current=HF_LOAD_CURRENT, load_at=HF_LOAD_CURRENT, load_serial=HF_LOAD_CURRENT,
        load_before=HF_LOAD_CURRENT, exists=HF_CURRENT_TID, current_tid=HF_CURRENT_TID,
        count_objects=HF_COUNT_OBJECTS, load_revisions=HF_LOAD_REVISIONS,
        move_states=HF_MOVE_STATES, move_refs=HF_MOVE_REFS, move_blobs=HF_MOVE_BLOBS,
        delete_removed=HF_DELETE_REMOVED, delete_old_refs=HF_DELETE_OLD_REFS,
        delete_old_blobs=HF_DELETE_OLD_BLOBS)

    def __init__(self, backend: BackendContract) -> None:
        self.backend = backend
        self.keep_history = backend.keep_history
        self.sql = for_mode(self.keep_history, self.HISTORY_PRESERVING, self.HISTORY_FREE)

    def prepare_connection(self, conn: ConnectionRole) -> None:
        """Create the temporary tables a committing connection stages into."""
        for statement in self.CREATE_TEMP_TABLES:
            conn.execute(statement)

    # -- loading --------------------------------------------------------------------------
    def load_current(self, conn: ConnectionRole, oid: int) -> StateRow | None:
        return state_row(conn.fetchone(self.sql.load_current, (oid,)))

    def load_at(self, conn: ConnectionRole, oid: int, snapshot_tid: int) -> StateRow | None:
        """The revision current as of ``snapshot_tid`` (HP); the current one (HF)."""
        if self.keep_history:
            return state_row(conn.fetchone(self.sql.load_at, (oid, snapshot_tid)))
        return state_row(conn.fetchone(self.sql.load_at, (oid,)))

    def load_serial(self, conn: ConnectionRole, oid: int, tid: int) -> StateRow | None:
        if self.keep_history:
            return state_row(conn.fetchone(self.sql.load_serial, (oid, tid)))
        row = state_row(conn.fetchone(self.sql.load_serial, (oid,)))
        return row if row is not None and row.tid == tid else None

    def load_before(self, conn: ConnectionRole, oid: int,
                    before_tid: int) -> tuple[StateRow, int | None] | None:
        """The revision before ``before_tid`` and the tid that replaced it (or None)."""
        if not self.keep_history:
            row = state_row(conn.fetchone(self.sql.load_before, (oid,)))
            return (row, None) if row is not None and row.tid < before_tid else None
        row = state_row(conn.fetchone(self.sql.load_before, (oid, before_tid)))
        if row is None:
            return None
        following = conn.fetchone(self.sql.next_tid, (oid, row.tid))
        end = following[0] if following else None
        return row, (int(end) if end is not None else None)

    def exists(self, conn: ConnectionRole, oid: int) -> bool:
        return conn.fetchone(self.sql.exists, (oid,)) is not None

    def current_tid(self, conn: ConnectionRole, oid: int) -> int | None:
        row = conn.fetchone(self.sql.current_tid, (oid,))
        return int(row[0]) if row else None

    def count_objects(self, conn: ConnectionRole) -> int:
        row = conn.fetchone(self.sql.count_objects)
        return int(row[0]) if row else 0

    # -- committing -----------------------------------------------------------------------
    def clear_staged(self, conn: ConnectionRole) -> None:
        if self.backend.features.staging_emptied_by_transaction_end:
            return
        conn.execute(self.sql.clear_store)
        conn.execute(self.sql.clear_ref)
        # temp_blob is emptied by move_staged after use (and by rollback), so a commit
        # without blobs spends no statement on it.

    def stage(self, conn: ConnectionRole, states: Sequence[StagedState],
              refs: Iterable[Revision]) -> None:
        """Stage states and ``(oid, to_oid)`` refs."""
        if states:
            conn.executemany(self.sql.stage_state, states)
        refs = list(refs)
        if refs:
            conn.executemany(self.sql.stage_ref, refs)

    def load_revisions(self, conn: ConnectionRole, wanted: dict[int, int],
                       ) -> dict[int, tuple[int | None, bytes | None]]:
        """``{oid: (checksum, state)}`` of the revisions ``{oid: tid}`` that exist, in one
        statement (history-free: only where the current revision is the one wanted)."""
        if not wanted:
            return {}
        oids = sorted(wanted)
        if self.keep_history:
            sql = self.sql.load_revisions.format(pairs=in_list(len(oids), 2))
            params = [value for oid in oids for value in (oid, wanted[oid])]
        else:
            sql = self.sql.load_revisions.format(oids=in_list(len(oids)))
            params = oids
        found: dict[int, tuple[int | None, bytes | None]] = {}
        for oid, tid, stored_checksum, state in conn.fetchall(sql, params):
            if wanted.get(int(oid)) == int(tid):
                found[int(oid)] = (stored_checksum, bytes(state) if state is not None else None)
        return found

    def restage_many(self, conn: ConnectionRole,
                     rows: list[ResolvedState], refs: list[Revision]) -> None:
        """Replace staged states after conflict resolution, whatever their number, in
        three statements."""
        conn.executemany(self.sql.restage_state, [(prev, check, size, state, oid)
                                                  for oid, prev, check, size, state in rows])
        oids = [row.oid for row in rows]
        conn.execute(self.sql.unstage_refs_of.format(oids=in_list(len(oids))), oids)
        if refs:
            conn.executemany(self.sql.stage_ref, refs)

    def max_staged_oid(self, conn: ConnectionRole) -> int | None:
        row = conn.fetchone(self.sql.max_staged_oid)
        return int(row[0]) if row and row[0] is not None else None

    def move_staged(self, conn: ConnectionRole, tid: int, blobs: bool = True) -> None:
        """Make the staged states the revisions of ``tid``.

        ``blobs``: the commit may change blob references (it staged blobs, copies
        revisions, deletes or restores objects); otherwise the blob steps are skipped.
        """
        sql = self.sql
        if self.keep_history:
            conn.execute(sql.move_states, (tid,))
            conn.execute(sql.set_current, (tid,))
            conn.execute(sql.move_refs, (tid,))
            if blobs:
                conn.execute(sql.move_blobs, (tid,))
        else:
            conn.execute(sql.move_states, (tid,))
            conn.execute(sql.delete_removed)
            conn.execute(sql.delete_old_refs)
            conn.execute(sql.move_refs)
            if blobs:
                conn.execute(sql.delete_old_blobs)
                conn.execute(sql.move_blobs, (tid,))
        if blobs and not self.backend.features.staging_emptied_by_transaction_end:
            conn.execute(sql.clear_blob)
