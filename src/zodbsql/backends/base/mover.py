"""Mover: object states into and out of the database.

A commit stages its states in a per-connection temporary table (``temp_store``) and their
references in ``temp_ref`` during vote; ``move_staged`` copies them into the permanent
tables under the final tid in a few set-based statements.  Loads come in three kinds:
the current revision, the revision current at a snapshot tid, and one exact revision.

Loaded rows are ``(tid, checksum, state)``; ``state`` is None for a deleted object.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from zodbsql.backends.base.contract import (BackendContract, ConnectionRole, ResolvedState,
                                            Revision, StagedState, StateRow)

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


class Mover:
    """Moves states between Python and the database for one history mode (a
    ``MoverRole``)."""

    #: Statements that create the per-connection temporary tables.
    CREATE_TEMP_TABLES: tuple[str, ...] = ()
    #: The statements whose dialect differs (upserts, deletes driven by temp_store).
    HP_SET_CURRENT = HP_SET_CURRENT
    HF_MOVE_STATES = HF_MOVE_STATES
    HF_DELETE_REMOVED = HF_DELETE_REMOVED
    HF_DELETE_OLD_REFS = HF_DELETE_OLD_REFS
    HF_DELETE_OLD_BLOBS = HF_DELETE_OLD_BLOBS

    def __init__(self, backend: BackendContract) -> None:
        self.backend = backend
        self.keep_history = backend.keep_history

    def prepare_connection(self, conn: ConnectionRole) -> None:
        """Create the temporary tables a committing connection stages into."""
        for statement in self.CREATE_TEMP_TABLES:
            conn.execute(statement)

    # -- loading --------------------------------------------------------------------------
    def load_current(self, conn: ConnectionRole, oid: int) -> StateRow | None:
        sql = HP_LOAD_CURRENT if self.keep_history else HF_LOAD_CURRENT
        return state_row(conn.fetchone(sql, (oid,)))

    def load_at(self, conn: ConnectionRole, oid: int, snapshot_tid: int) -> StateRow | None:
        """The revision current as of ``snapshot_tid`` (HP); the current one (HF)."""
        if self.keep_history:
            return state_row(conn.fetchone(HP_LOAD_AT, (oid, snapshot_tid)))
        return state_row(conn.fetchone(HF_LOAD_CURRENT, (oid,)))

    def load_serial(self, conn: ConnectionRole, oid: int, tid: int) -> StateRow | None:
        if self.keep_history:
            return state_row(conn.fetchone(HP_LOAD_SERIAL, (oid, tid)))
        row = state_row(conn.fetchone(HF_LOAD_CURRENT, (oid,)))
        return row if row is not None and row.tid == tid else None

    def load_before(self, conn: ConnectionRole, oid: int,
                    before_tid: int) -> tuple[StateRow, int | None] | None:
        """The revision before ``before_tid`` and the tid that replaced it (or None)."""
        if not self.keep_history:
            row = state_row(conn.fetchone(HF_LOAD_CURRENT, (oid,)))
            return (row, None) if row is not None and row.tid < before_tid else None
        row = state_row(conn.fetchone(HP_LOAD_BEFORE, (oid, before_tid)))
        if row is None:
            return None
        following = conn.fetchone(HP_NEXT_TID, (oid, row.tid))
        end = following[0] if following else None
        return row, (int(end) if end is not None else None)

    def exists(self, conn: ConnectionRole, oid: int) -> bool:
        sql = HP_EXISTS if self.keep_history else HF_CURRENT_TID
        return conn.fetchone(sql, (oid,)) is not None

    def current_tid(self, conn: ConnectionRole, oid: int) -> int | None:
        row = conn.fetchone(HP_CURRENT_TID if self.keep_history else HF_CURRENT_TID, (oid,))
        return int(row[0]) if row else None

    def count_objects(self, conn: ConnectionRole) -> int:
        row = conn.fetchone(HP_COUNT_OBJECTS if self.keep_history else HF_COUNT_OBJECTS)
        return int(row[0]) if row else 0

    # -- committing -----------------------------------------------------------------------
    def clear_staged(self, conn: ConnectionRole) -> None:
        if self.backend.features.staging_emptied_by_transaction_end:
            return
        conn.execute(CLEAR_TEMP_STORE)
        conn.execute(CLEAR_TEMP_REF)
        # temp_blob is emptied by move_staged after use (and by rollback), so a commit
        # without blobs spends no statement on it.

    def stage(self, conn: ConnectionRole, states: Sequence[StagedState],
              refs: Iterable[Revision]) -> None:
        """Stage states and ``(oid, to_oid)`` refs."""
        if states:
            conn.executemany(STAGE_STATE, states)
        refs = list(refs)
        if refs:
            conn.executemany(STAGE_REF, refs)

    def load_revisions(self, conn: ConnectionRole, wanted: dict[int, int],
                       ) -> dict[int, tuple[int | None, bytes | None]]:
        """``{oid: (checksum, state)}`` of the revisions ``{oid: tid}`` that exist, in one
        statement (history-free: only where the current revision is the one wanted)."""
        if not wanted:
            return {}
        oids = sorted(wanted)
        if self.keep_history:
            sql = HP_LOAD_REVISIONS.format(pairs=", ".join(["(%s, %s)"] * len(oids)))
            params = [value for oid in oids for value in (oid, wanted[oid])]
        else:
            sql = HF_LOAD_REVISIONS.format(oids=", ".join(["%s"] * len(oids)))
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
        conn.executemany(RESTAGE_STATE, [(prev, check, size, state, oid)
                                         for oid, prev, check, size, state in rows])
        oids = [row.oid for row in rows]
        conn.execute(UNSTAGE_REFS_OF.format(oids=", ".join(["%s"] * len(oids))), oids)
        if refs:
            conn.executemany(STAGE_REF, refs)

    def max_staged_oid(self, conn: ConnectionRole) -> int | None:
        row = conn.fetchone(MAX_STAGED_OID)
        return int(row[0]) if row and row[0] is not None else None

    def move_staged(self, conn: ConnectionRole, tid: int, blobs: bool = True) -> None:
        """Make the staged states the revisions of ``tid``.

        ``blobs``: the commit may change blob references (it staged blobs, copies
        revisions, deletes or restores objects); otherwise the blob steps are skipped.
        """
        if self.keep_history:
            conn.execute(HP_MOVE_STATES, (tid,))
            conn.execute(self.HP_SET_CURRENT, (tid,))
            conn.execute(HP_MOVE_REFS, (tid,))
            if blobs:
                conn.execute(HP_MOVE_BLOBS, (tid,))
        else:
            conn.execute(self.HF_MOVE_STATES, (tid,))
            conn.execute(self.HF_DELETE_REMOVED)
            conn.execute(self.HF_DELETE_OLD_REFS)
            conn.execute(HF_MOVE_REFS)
            if blobs:
                conn.execute(self.HF_DELETE_OLD_BLOBS)
                conn.execute(HF_MOVE_BLOBS, (tid,))
        if blobs and not self.backend.features.staging_emptied_by_transaction_end:
            conn.execute(CLEAR_TEMP_BLOB)
