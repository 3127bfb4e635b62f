"""Mover: object states into and out of the database.

A commit stages its states in a per-connection temporary table (``temp_store``) and their
references in ``temp_ref`` during vote; ``move_staged`` copies them into the permanent
tables under the final tid in a few set-based statements.  Loads come in three kinds:
the current revision, the revision current at a snapshot tid, and one exact revision.

Loaded rows are ``(tid, checksum, state)``; ``state`` is None for a deleted object.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:
    from zodbsql.backends.base.adapter import Backend
    from zodbsql.backends.base.connections import DBConnection, Row

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

# -- several objects at once (prefetch) ------------------------------------------------------
# ``{listed}`` is the backend's test of a column against a list of oids (``IN (...)``, or
# PostgreSQL's ``= ANY(array)``).  History-preserving: each object's revision current at
# the snapshot tid, as HP_LOAD_AT.
HP_LOAD_MANY_AT = (
    "SELECT s.zoid, s.tid, s.checksum, s.state FROM object_state s WHERE s.zoid {listed}"
    " AND s.tid = (SELECT MAX(m.tid) FROM object_state m WHERE m.zoid = s.zoid AND m.tid <= %s)")
HF_LOAD_MANY = "SELECT zoid, tid, checksum, state FROM object_state WHERE zoid {listed}"

# -- a load with the states it refers to (reference-driven prefetch) ---------------------------
# One statement returns the object's row (kind 0, as load_at returns it); then up to
# LIMIT states, and the bytes bound in all (kind 1): first of the objects its state refers
# to, then of the listed oids, then of the next references (in oid order) of an object
# that refers to it (its siblings: the next children of its container); and up to a
# number of the references of those states (kind 2: zoid, to_zoid in the tid column).
# Sizes are summed before the states are read, so no state is sorted or copied.
HF_LOAD_WITH_REFS = (
    "WITH target AS (SELECT zoid, tid, checksum, state FROM object_state WHERE zoid = %s),"
    " wanted AS (SELECT zoid, 0 AS step FROM (SELECT to_zoid AS zoid FROM object_ref"
    " WHERE zoid = %s ORDER BY to_zoid LIMIT %s) o"
    " UNION ALL SELECT zoid, 1 FROM object_state WHERE zoid {listed}"
    " UNION ALL SELECT zoid, 2 FROM (SELECT to_zoid AS zoid FROM object_ref"
    " WHERE zoid = (SELECT zoid FROM object_ref WHERE to_zoid = %s LIMIT 1)"
    " AND to_zoid > %s ORDER BY to_zoid LIMIT %s) n),"
    " chosen AS (SELECT zoid, MIN(step) AS step FROM wanted WHERE zoid <> %s"
    " GROUP BY zoid ORDER BY 2, 1 LIMIT %s),"
    " sized AS (SELECT s.zoid, s.tid, SUM(s.state_size) OVER (ORDER BY w.step, w.zoid)"
    " AS total FROM chosen w JOIN object_state s ON s.zoid = w.zoid),"
    " kept AS (SELECT zoid, tid FROM sized WHERE total <= %s)"
    " SELECT 0, zoid, tid, checksum, state FROM target"
    " UNION ALL SELECT 1, s.zoid, s.tid, s.checksum, s.state FROM kept k"
    " JOIN object_state s ON s.zoid = k.zoid"
    " UNION ALL SELECT 2, zoid, to_zoid, NULL, NULL FROM (SELECT r.zoid, r.to_zoid"
    " FROM object_ref r WHERE r.zoid IN (SELECT zoid FROM kept) LIMIT %s) f")
# History-preserving: every state as of the snapshot tid (the current one unless it is
# newer), and the references recorded with exactly that revision.
HP_LOAD_WITH_REFS = (
    "WITH target AS (SELECT zoid, tid, checksum, state FROM object_state"
    " WHERE zoid = %s AND tid <= %s ORDER BY tid DESC LIMIT 1),"
    " parent AS (SELECT zoid FROM object_ref WHERE to_zoid = %s ORDER BY tid DESC LIMIT 1),"
    " wanted AS (SELECT zoid, 0 AS step FROM (SELECT to_zoid AS zoid FROM object_ref"
    " WHERE zoid = %s AND tid = (SELECT tid FROM target) ORDER BY to_zoid LIMIT %s) o"
    " UNION ALL SELECT zoid, 1 FROM current_object WHERE zoid {listed}"
    " UNION ALL SELECT zoid, 2 FROM (SELECT to_zoid AS zoid FROM object_ref"
    " WHERE zoid = (SELECT zoid FROM parent) AND tid = (SELECT MAX(tid) FROM object_state"
    " WHERE zoid = (SELECT zoid FROM parent) AND tid <= %s)"
    " AND to_zoid > %s ORDER BY to_zoid LIMIT %s) n),"
    " chosen AS (SELECT zoid, MIN(step) AS step FROM wanted WHERE zoid <> %s"
    " GROUP BY zoid ORDER BY 2, 1 LIMIT %s),"
    " revision AS (SELECT w.zoid, w.step, CASE WHEN c.tid <= %s THEN c.tid ELSE"
    " (SELECT MAX(m.tid) FROM object_state m WHERE m.zoid = c.zoid AND m.tid <= %s) END"
    " AS tid FROM chosen w JOIN current_object c ON c.zoid = w.zoid),"
    " sized AS (SELECT s.zoid, s.tid, SUM(s.state_size) OVER (ORDER BY v.step, v.zoid)"
    " AS total FROM revision v JOIN object_state s ON s.zoid = v.zoid AND s.tid = v.tid),"
    " kept AS (SELECT zoid, tid FROM sized WHERE total <= %s)"
    " SELECT 0, zoid, tid, checksum, state FROM target"
    " UNION ALL SELECT 1, s.zoid, s.tid, s.checksum, s.state FROM kept k"
    " JOIN object_state s ON s.zoid = k.zoid AND s.tid = k.tid"
    " UNION ALL SELECT 2, zoid, to_zoid, NULL, NULL FROM (SELECT r.zoid, r.to_zoid"
    " FROM object_ref r JOIN kept k ON r.zoid = k.zoid AND r.tid = k.tid LIMIT %s) f")


class Mover:
    """Moves states between Python and the database for one history mode."""

    #: Statements that create the per-connection temporary tables.
    CREATE_TEMP_TABLES: tuple[str, ...] = ()
    #: The statements whose dialect differs (upserts, deletes driven by temp_store).
    HP_SET_CURRENT = HP_SET_CURRENT
    HF_MOVE_STATES = HF_MOVE_STATES
    HF_DELETE_REMOVED = HF_DELETE_REMOVED
    HF_DELETE_OLD_REFS = HF_DELETE_OLD_REFS
    HF_DELETE_OLD_BLOBS = HF_DELETE_OLD_BLOBS
    #: The most oids one statement lists (the rest go in further statements).
    MAX_LISTED_OIDS = 1000

    def __init__(self, backend: "Backend") -> None:
        self.backend = backend
        self.keep_history = backend.keep_history

    def prepare_connection(self, conn: "DBConnection") -> None:
        """Create the temporary tables a committing connection stages into."""
        for statement in self.CREATE_TEMP_TABLES:
            conn.execute(statement)

    # -- loading --------------------------------------------------------------------------
    def load_current(self, conn: "DBConnection", oid: int) -> "Row | None":
        sql = HP_LOAD_CURRENT if self.keep_history else HF_LOAD_CURRENT
        return conn.fetchone(sql, (oid,))

    def load_at(self, conn: "DBConnection", oid: int, snapshot_tid: int) -> "Row | None":
        """The revision current as of ``snapshot_tid`` (HP); the current one (HF)."""
        if self.keep_history:
            return conn.fetchone(HP_LOAD_AT, (oid, snapshot_tid))
        return conn.fetchone(HF_LOAD_CURRENT, (oid,))

    def load_serial(self, conn: "DBConnection", oid: int, tid: int) -> "Row | None":
        if self.keep_history:
            return conn.fetchone(HP_LOAD_SERIAL, (oid, tid))
        row = conn.fetchone(HF_LOAD_CURRENT, (oid,))
        return row if row is not None and row[0] == tid else None

    def load_before(self, conn: "DBConnection", oid: int,
                    before_tid: int) -> "tuple[Row, int | None] | None":
        """The revision before ``before_tid`` and the tid that replaced it (or None)."""
        if not self.keep_history:
            row = conn.fetchone(HF_LOAD_CURRENT, (oid,))
            return (row, None) if row is not None and row[0] < before_tid else None
        row = conn.fetchone(HP_LOAD_BEFORE, (oid, before_tid))
        if row is None:
            return None
        following = conn.fetchone(HP_NEXT_TID, (oid, row[0]))
        return row, (following[0] if following else None)

    def exists(self, conn: "DBConnection", oid: int) -> bool:
        sql = HP_EXISTS if self.keep_history else HF_CURRENT_TID
        return conn.fetchone(sql, (oid,)) is not None

    def listed(self, oids: Sequence[int]) -> tuple[str, list[Any]]:
        """The SQL test of a column against ``oids`` (not empty), and its parameters.

        The list is padded (repeating its last oid) to a power of two, so that a few
        statement texts serve every length and stay in the driver's statement cache.
        """
        padded = list(oids) + [oids[-1]] * (padded_length(len(oids)) - len(oids))
        return "IN (" + ", ".join(["%s"] * len(padded)) + ")", padded

    def load_many_at(self, conn: "DBConnection", oids: Sequence[int],
                     snapshot_tid: int) -> "list[Row]":
        """``(oid, tid, checksum, state)`` of those of ``oids`` that exist, each as
        ``load_at`` would return it, in one statement per ``MAX_LISTED_OIDS``."""
        rows: list[Row] = []
        step = self.MAX_LISTED_OIDS
        for start in range(0, len(oids), step):
            test, params = self.listed(oids[start:start + step])
            if self.keep_history:
                rows += conn.fetchall(HP_LOAD_MANY_AT.format(listed=test), [*params, snapshot_tid])
            else:
                rows += conn.fetchall(HF_LOAD_MANY.format(listed=test), params)
        return rows

    def load_with_references(self, conn: "DBConnection", oid: int, snapshot_tid: int,
                             also: Sequence[int], limit: int, max_bytes: int,
                             max_references: int,
                             ) -> "tuple[Row | None, list[Row], list[tuple[int, int]]]":
        """``oid``'s row as ``load_at`` returns it; in the same statement up to ``limit``
        states (``max_bytes`` bytes in all) at the same snapshot, as ``(oid, tid,
        checksum, state)``: of the objects it refers to, then of those of ``also``, then
        of its siblings; and up to ``max_references`` references ``(from, to)`` of those
        states."""
        test, listed = self.listed(list(also[:self.MAX_LISTED_OIDS]) or [oid])
        if self.keep_history:
            sql = HP_LOAD_WITH_REFS.format(listed=test)
            params = [oid, snapshot_tid, oid, oid, limit, *listed, snapshot_tid, oid, limit,
                      oid, limit, snapshot_tid, snapshot_tid, max_bytes, max_references]
        else:
            sql = HF_LOAD_WITH_REFS.format(listed=test)
            params = [oid, oid, limit, *listed, oid, oid, limit, oid, limit, max_bytes,
                      max_references]
        row: Row | None = None
        states: list[Row] = []
        references: list[tuple[int, int]] = []
        for kind, zoid, tid, stored_checksum, state in conn.fetchall(sql, params):
            if kind == 0:
                row = (tid, stored_checksum, state)
            elif kind == 1:
                states.append((int(zoid), int(tid), stored_checksum, state))
            else:
                references.append((int(zoid), int(tid)))
        return row, states, references

    def current_tid(self, conn: "DBConnection", oid: int) -> int | None:
        row = conn.fetchone(HP_CURRENT_TID if self.keep_history else HF_CURRENT_TID, (oid,))
        return int(row[0]) if row else None

    def count_objects(self, conn: "DBConnection") -> int:
        row = conn.fetchone(HP_COUNT_OBJECTS if self.keep_history else HF_COUNT_OBJECTS)
        return int(row[0]) if row else 0

    # -- committing -----------------------------------------------------------------------
    def clear_staged(self, conn: "DBConnection") -> None:
        if self.backend.features.staging_emptied_by_transaction_end:
            return
        conn.execute(CLEAR_TEMP_STORE)
        conn.execute(CLEAR_TEMP_REF)
        # temp_blob is emptied by move_staged after use (and by rollback), so a commit
        # without blobs spends no statement on it.

    def stage(self, conn: "DBConnection", states: Sequence[tuple[Any, ...]],
              refs: Iterable[tuple[int, int]]) -> None:
        """Stage ``(oid, prev_tid, data_tid, checksum, size, state)`` rows and ``(oid, to_oid)`` refs."""
        if states:
            conn.executemany(STAGE_STATE, states)
        refs = list(refs)
        if refs:
            conn.executemany(STAGE_REF, refs)

    def load_revisions(self, conn: "DBConnection", wanted: dict[int, int],
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

    def restage_many(self, conn: "DBConnection",
                     rows: list[tuple[int, int, int | None, int, bytes]],
                     refs: list[tuple[int, int]]) -> None:
        """Replace staged states after conflict resolution, whatever their number, in
        three statements: ``rows`` are (oid, prev_tid, checksum, size, state)."""
        conn.executemany(RESTAGE_STATE, [(prev, check, size, state, oid)
                                         for oid, prev, check, size, state in rows])
        oids = [row[0] for row in rows]
        conn.execute(UNSTAGE_REFS_OF.format(oids=", ".join(["%s"] * len(oids))), oids)
        if refs:
            conn.executemany(STAGE_REF, refs)

    def max_staged_oid(self, conn: "DBConnection") -> int | None:
        row = conn.fetchone(MAX_STAGED_OID)
        return int(row[0]) if row and row[0] is not None else None

    def move_staged(self, conn: "DBConnection", tid: int, blobs: bool = True) -> None:
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


def padded_length(count: int) -> int:
    """The power of two at or above ``count`` (``count`` itself above 512)."""
    return count if count > 512 else 1 << max(0, count - 1).bit_length()
