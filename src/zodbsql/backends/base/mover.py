"""Mover: object states into and out of the database.

A commit stages its states in a per-connection temporary table (``temp_store``) during
vote, each with the oids it refers to; ``move_staged`` copies them into the permanent
tables under the final tid in a few set-based statements.

References are a column of the revision (``object_state.refs``, schema version 2): a
JSON array's text on SQLite and MySQL, a ``BIGINT[]`` on PostgreSQL, NULL for none.  A
revision of a BTree node that keeps 250 children writes one value, not 250 rows and 250
index entries, and goes with its revision when pack or a history-free commit deletes it.
``object_ref`` is a view that unnests the column into ``(zoid, [tid,] to_zoid)`` rows,
which is how prefetch, pack, verify and history read them.  Loads come in three kinds:
the current revision, the revision current at a snapshot tid, and one exact revision.

Loaded rows are ``(tid, checksum, state)``; ``state`` is None for a deleted object.
States are staged as the commit sealed them (``zodbsql.atrest``: compressed, encrypted)
and come out of every load opened again by the backend's codec, so the core sees only
states as ZODB wrote them.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, Iterable, Sequence

from zodbsql.backends.base.contract import (BackendContract, CodecRole, ConnectionRole,
                                            LoadedState, PendingLoad,
                                            ResolvedState,
                                            Revision, StagedState, StateRow)
from zodbsql.backends.base.statements import for_mode, in_list
from zodbsql.errors import CorruptRecordError, RecordKeyError

# -- staging (both modes) -----------------------------------------------------------------
CLEAR_TEMP_STORE = "DELETE FROM temp_store"
CLEAR_TEMP_BLOB = "DELETE FROM temp_blob"
STAGE_STATE = ("INSERT INTO temp_store (zoid, prev_tid, data_tid, checksum, state_size, state,"
               " refs) VALUES (%s, %s, %s, %s, %s, %s, %s)")
RESTAGE_STATE = ("UPDATE temp_store SET prev_tid = %s, checksum = %s, state_size = %s,"
                 " state = %s, refs = %s WHERE zoid = %s")

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
    "INSERT INTO object_state (zoid, tid, data_tid, checksum, state_size, refs, state)"
    " SELECT zoid, %s, data_tid, checksum, state_size, refs, state FROM temp_store")
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
    "INSERT INTO object_state (zoid, tid, checksum, state_size, refs, state)"
    " SELECT zoid, %s, checksum, state_size, refs, state FROM temp_store"
    " WHERE state IS NOT NULL"
    " ON CONFLICT (zoid) DO UPDATE SET tid = excluded.tid, checksum = excluded.checksum,"
    " state_size = excluded.state_size, refs = excluded.refs, state = excluded.state")
HF_DELETE_REMOVED = (
    "DELETE FROM object_state WHERE zoid IN (SELECT zoid FROM temp_store WHERE state IS NULL)")
# The objects deleted are recorded (backends/base/poller.py): polls can't name a row that is gone.
HF_NEXT_GONE_SEQ = ("UPDATE gone_row SET last_seq = last_seq + 1"
                    " WHERE EXISTS (SELECT 1 FROM temp_store WHERE state IS NULL)")
HF_RECORD_DELETED = (
    "INSERT INTO object_gone (seq, tid, zoids) SELECT g.last_seq, %s,"
    " (SELECT json_group_array(zoid) FROM temp_store WHERE state IS NULL) FROM gone_row g")
# A new revision replaces the object's blob reference (or drops it: deleted, not a blob).
HF_DELETE_OLD_BLOBS = "DELETE FROM blob_ref WHERE zoid IN (SELECT zoid FROM temp_store)"
HF_MOVE_BLOBS = (
    "INSERT INTO blob_ref (zoid, tid, content_hash) SELECT zoid, %s, content_hash FROM temp_blob")
HF_COUNT_OBJECTS = "SELECT COUNT(*) FROM object_state"

# -- several objects at once (prefetch) ------------------------------------------------------
# ``{listed}`` is the backend's test of a column against a list of oids (``IN (...)``, or
# PostgreSQL's ``= ANY(array)``).  History-preserving: each object's revision current at
# the snapshot tid, as HP_LOAD_AT: its current one (``current_object``) unless that is
# newer than the snapshot, as the portable prefetching statement reads them
# (HP_REVISIONS_PORTABLE).  Looking for the newest revision up to the snapshot for every
# oid took SQLite 1.2 us a row of 512, the current one 0.8 (PostgreSQL 2.0 and 1.8 ms).
HP_LOAD_MANY_AT = (
    "SELECT s.zoid, s.tid, s.checksum, s.state FROM current_object c JOIN object_state s"
    " ON s.zoid = c.zoid WHERE c.zoid {listed} AND s.tid = CASE WHEN c.tid <= %s THEN c.tid"
    " ELSE (SELECT MAX(m.tid) FROM object_state m WHERE m.zoid = c.zoid AND m.tid <= %s) END")
HF_LOAD_MANY = "SELECT zoid, tid, checksum, state FROM object_state WHERE zoid {listed}"
# Appended to the two above (``load_many_at``'s ``largest``): a state stored larger is
# left out, tested on the size column, so that its pages are not read.
HP_WITHIN_SIZE = " AND s.state_size <= %s"
HF_WITHIN_SIZE = " AND state_size <= %s"

# The references of the revisions a batch brought, all of those of its oids (portable:
# through the ``object_ref`` view; history-preserving, the caller keeps the revisions
# it loaded).
HF_REFERENCES_OF_MANY = "SELECT zoid, NULL, to_zoid FROM object_ref WHERE zoid {listed}"
HP_REFERENCES_OF_MANY = "SELECT zoid, tid, to_zoid FROM object_ref WHERE zoid {listed}"

# -- a parent's references, for a miss the client looks ahead for (``LOOKS_AHEAD``) ----------
# The references of a revision from ``at`` on (ascending; from 0: all), the revision
# the snapshot sees.  Portable, through the ``object_ref`` view; a backend that can cut
# its ``refs`` column gives its own.
HF_REFERENCES_FROM = ("SELECT to_zoid FROM object_ref WHERE zoid = %s AND to_zoid >= %s"
                      " ORDER BY to_zoid LIMIT %s")
HP_REFERENCES_FROM = (
    "SELECT to_zoid FROM object_ref WHERE zoid = %s AND tid = (SELECT MAX(tid) FROM"
    " object_state WHERE zoid = %s AND tid <= %s) AND to_zoid >= %s ORDER BY to_zoid LIMIT %s")

# The last clause of the prefetch statements below: the references of the states a
# batch brought (kind 2), at most REFERENCES_EACH of each, taken from the state's own
# row.  A revision's references are stored ascending, so its first ones are its lowest;
# ``{first_references}`` is the backend's query of them (``Mover.FIRST_REFERENCES``).
# (A container's references beyond those are its further children, which a miss among
# them brings as its siblings; a long-lived process that loads the root again had
# brought 1,000 of every container's children: 4,000 references and 7 ms for nothing.)
# Finding them through ``object_ref`` took a second lookup of each state's row and a
# sort of its references: on SQLite 4 of the 10 ms of a batch of 999 states that refer
# to nothing.
REFERENCES_EACH = 64
#: No object has it (oids are not negative): the padding of the candidate parents.
NO_PARENT = -1
#: Candidate parents a load statement takes (``Prefetcher.parents``).
PARENTS = 16
REFERENCES = " UNION ALL SELECT 2, zoid, to_zoid, NULL, NULL FROM ({first_references} LIMIT %s) f"
# -- a load with the states it refers to (reference-driven prefetch) ---------------------------
# One statement returns the object's row (kind 0, as load_at returns it); then up to
# LIMIT states, and the bytes bound in all (kind 1): first of the objects its state refers
# to, then of the listed oids, then of the next references (in oid order) of its parent
# (its siblings: the next children of its container); and (kind 2: zoid, to_zoid in the
# tid column) the object's own first references (at least REFERENCES_EACH), its parent's
# that were looked at, and up to a number of the references of the states that came.
# The parent is the one of the caller's PARENTS candidates (``Prefetcher.parents``: the
# states it touched last) that refers to the object, found through primary keys; finding
# it from the object alone took an index on to_zoid, which every commit paid an entry
# per reference for, in random order.  History-preserving, a candidate is tested by its
# current revision (a guess: the siblings are read at the snapshot).
# Sizes are summed before the states are read, so no state is sorted or copied (except
# on PostgreSQL, whose window carries the states: see its mover).
# ``own``: (parent, zoid) of the object's first references, at most the number given;
# ``siblings``: of the references after it in its parent's (the first of the candidate
# parents, ``{parents}``, that refers to it), at most the number given.  Through the
# ``object_ref`` view here, with a sort; a backend that can address an array's elements
# by position gives its own (``prefetching``).
HF_OWN = (" own AS (SELECT zoid AS parent, to_zoid AS zoid FROM object_ref"
          " WHERE zoid = %s ORDER BY to_zoid LIMIT %s),")
HF_SIBLINGS = (
    " siblings AS (SELECT zoid AS parent, to_zoid AS zoid FROM object_ref"
    " WHERE zoid = (SELECT zoid FROM object_ref WHERE zoid IN ({parents}) AND to_zoid = %s"
    " LIMIT 1) AND to_zoid > %s ORDER BY to_zoid LIMIT %s),")
# ``kept``: the states within the bound, in the order of the running size (a join that
# keeps the outer side's order: the prefetcher queues references in the order of the
# states).  The running size is summed over the oids alone (``sized``), then the states
# within the bound are read: a sort that carried the states cost SQLite 1.5 of the 10 ms
# of a batch of 999 states.  History-free, ``{kept}`` makes ``sized`` too.
HF_KEPT = (" sized AS (SELECT s.zoid, SUM(s.state_size) OVER (ORDER BY w.step, w.zoid) AS total"
           " FROM chosen w JOIN object_state s ON s.zoid = w.zoid),"
           " kept AS (SELECT s.zoid, s.tid, s.checksum, s.state, s.refs FROM sized z"
           " JOIN object_state s ON s.zoid = z.zoid WHERE z.total <= %s)")
HF_LOAD_WITH_REFS = (
    "WITH target AS (SELECT zoid, tid, checksum, state FROM object_state WHERE zoid = %s),"
    "{own}{siblings}"
    " wanted AS (SELECT zoid, 0 AS step FROM own"
    " UNION ALL SELECT zoid, 1 FROM object_state WHERE zoid {listed}"
    " UNION ALL SELECT zoid, 2 FROM siblings),"
    " chosen AS (SELECT zoid, MIN(step) AS step FROM wanted WHERE zoid <> %s"
    " GROUP BY zoid ORDER BY 2, 1 LIMIT %s),"
    "{kept}"
    " SELECT 0, zoid, tid, checksum, state FROM target"
    " UNION ALL SELECT 1, zoid, tid, checksum, state FROM kept"
    " UNION ALL SELECT 2, parent, zoid, NULL, NULL FROM own"
    " UNION ALL SELECT 2, parent, zoid, NULL, NULL FROM siblings"
    + REFERENCES)
# The choice of the states that come along, as both modes' statements above make it.
CHOSEN = (" chosen AS (SELECT zoid, MIN(step) AS step FROM wanted WHERE zoid <> %s"
          " GROUP BY zoid ORDER BY 2, 1 LIMIT %s),")
# History-preserving: every state as of the snapshot tid (the current one unless it is
# newer), and the references recorded with exactly that revision.
# ``own`` of the revision loaded; ``parent`` the candidate whose current revision refers
# to the object; ``siblings`` from its revision at the snapshot.
HP_OWN = (" own AS (SELECT zoid AS parent, to_zoid AS zoid FROM object_ref"
          " WHERE zoid = %s AND tid = (SELECT tid FROM target) ORDER BY to_zoid LIMIT %s),")
HP_PARENT = (
    " parent AS (SELECT c.zoid FROM current_object c JOIN object_ref r ON r.zoid = c.zoid"
    " AND r.tid = c.tid AND r.to_zoid = %s WHERE c.zoid IN ({parents}) LIMIT 1),")
HP_SIBLINGS = (
    " siblings AS (SELECT zoid AS parent, to_zoid AS zoid FROM object_ref"
    " WHERE zoid = (SELECT zoid FROM parent) AND tid = (SELECT MAX(tid) FROM object_state"
    " WHERE zoid = (SELECT zoid FROM parent) AND tid <= %s)"
    " AND to_zoid > %s ORDER BY to_zoid LIMIT %s),")
HP_KEPT = (" kept AS (SELECT s.zoid, s.tid, s.checksum, s.state, s.refs FROM sized z"
           " JOIN object_state s ON s.zoid = z.zoid AND s.tid = z.tid WHERE z.total <= %s)")
HP_LOAD_WITH_REFS = (
    "WITH target AS (SELECT zoid, tid, checksum, state FROM object_state"
    " WHERE zoid = %s AND tid <= %s ORDER BY tid DESC LIMIT 1),"
    "{own}{parent}{siblings}"
    " wanted AS (SELECT zoid, 0 AS step FROM own"
    " UNION ALL SELECT zoid, 1 FROM current_object WHERE zoid {listed}"
    " UNION ALL SELECT zoid, 2 FROM siblings),"
    " chosen AS (SELECT zoid, MIN(step) AS step FROM wanted WHERE zoid <> %s"
    " GROUP BY zoid ORDER BY 2, 1 LIMIT %s),"
    "{revisions}"
    "{kept}"
    " SELECT 0, zoid, tid, checksum, state FROM target"
    " UNION ALL SELECT 1, zoid, tid, checksum, state FROM kept"
    " UNION ALL SELECT 2, parent, zoid, NULL, NULL FROM own"
    " UNION ALL SELECT 2, parent, zoid, NULL, NULL FROM siblings"
    + REFERENCES)
# ``sized``: each chosen object's revision at the snapshot (the current one unless it is
# newer) and the running size of their states.  Portable: through current_object.
HP_REVISIONS_PORTABLE = (
    " revision AS (SELECT w.zoid, w.step, CASE WHEN c.tid <= %s THEN c.tid ELSE"
    " (SELECT MAX(m.tid) FROM object_state m WHERE m.zoid = c.zoid AND m.tid <= %s) END"
    " AS tid FROM chosen w JOIN current_object c ON c.zoid = w.zoid),"
    " sized AS (SELECT s.zoid, s.tid, SUM(s.state_size) OVER (ORDER BY v.step, v.zoid)"
    " AS total FROM revision v JOIN object_state s ON s.zoid = v.zoid AND s.tid = v.tid),")
# PostgreSQL's prefetch follows references further than one step: from the states the
# statement chooses (the seeds) but those the loaded state refers to itself (a load of
# a container or of the root would otherwise spread over every subtree below it),
# breadth first through the references recorded with each object's current revision,
# until the batch is full: a miss in a BTree's items brings the next buckets' items.
# PostgreSQL pulls the recursion only as far as the LIMIT asks; UNION drops an oid seen
# before, so a cycle ends; the references only pick oids, each state is still read as of
# the snapshot.  SQLite runs the same statement, but there the walk cost more than it
# saved: a cold walk of 6,000 BTree items went from ~400 statements to 19, a mapping's
# 1,000 children were read cold at 16,300 objects/s instead of 18,900; not taken (its
# client walks on past a pick that came short with a statement of its own,
# ``load_walked``).  On MySQL and MariaDB it was not tried.
WALK = (
    " bound (oid, n) AS (SELECT CAST(%s AS BIGINT), CAST(%s AS BIGINT)),"
    " seeds AS (SELECT zoid, MIN(step) AS step FROM wanted WHERE zoid <> (SELECT oid FROM"
    " bound) GROUP BY zoid ORDER BY 2, 1 LIMIT (SELECT n FROM bound)),"
    " walk (zoid, onward) AS (SELECT zoid, step > 0 FROM seeds"
    " UNION SELECT r.to_zoid, TRUE FROM walk w {step} WHERE w.onward),"
    " chosen AS (SELECT zoid, MIN(step) AS step FROM (SELECT zoid, row_number() OVER ()"
    " AS step FROM (SELECT zoid FROM walk WHERE zoid <> (SELECT oid FROM bound)"
    " LIMIT (SELECT n FROM bound)) x) y GROUP BY zoid),")
HF_WALK_STEP = "JOIN object_ref r ON r.zoid = w.zoid"
HP_WALK_STEP = ("JOIN current_object c ON c.zoid = w.zoid"
                " JOIN object_ref r ON r.zoid = c.zoid AND r.tid = c.tid")
# Its statements return at most REFERENCES_EACH references of each state (a BTree
# bucket's items and its next bucket) and ``REFERENCES_PER_STATE`` (4) a state in all,
# so that a batch of buckets queues the items the next misses bring (4 a state without
# the cap of each cost a statement a bucket: the first states' references used up the
# batch's).  PostgreSQL took 16 a state until issue 24 measured what they cost: each
# reference is a row of its own, and a batch of 1,000 states sent 13,685, ~3 MB of
# peak RSS (``scripts/cache_memory.py`` above its cache-off run at 10 and 32 MB: 16
# and 37 with 16, 13 and 34 with 4), for the same statements (``zodbsql bench --tests
# btree-walk``: 116 for 100,000 items either way, 13 -> 14 for 6,000).  (Leaving out
# the references inside the batch with NOT IN (kept) was tried: PostgreSQL, expecting
# one row, did not hash it: 1.6 s for 10,000 references; with NOT EXISTS it leaves out
# few: 1,047 of those 13,685 named a state of the batch.)


def prefetching(statement: str, *, own: str, siblings: str, kept: str, parent: str = "",
                revisions: str = "") -> str:
    """A prefetch statement (``HF_LOAD_WITH_REFS``, ``HP_LOAD_WITH_REFS``) with its
    choice of references (``own``, ``parent``, ``siblings``), of the states read
    (``kept``) and, history-preserving, of the revisions (``revisions``); ``{listed}``,
    ``{parents}`` and ``{first_references}`` are left for the call."""
    for name, fragment in (("{own}", own), ("{parent}", parent), ("{siblings}", siblings),
                           ("{kept}", kept), ("{revisions}", revisions)):
        assert (name in statement) == bool(fragment), name
        statement = statement.replace(name, fragment)
    return statement


def walking(statement: str, step: str) -> str:
    """The prefetch ``statement`` with its choice of states made by ``WALK`` (``step``:
    how a walked object's references are found)."""
    assert statement.startswith("WITH ") and CHOSEN in statement
    return "WITH RECURSIVE " + statement[len("WITH "):].replace(
        CHOSEN, WALK.replace("{step}", step))


def state_row(row: tuple[Any, ...] | None, oid: int, codec: CodecRole) -> StateRow | None:
    """A loaded ``(tid, checksum, state)`` row of ``oid`` as a :class:`StateRow`, its
    state decoded."""
    if row is None:
        return None
    tid, stored_checksum, state = row
    if tid.__class__ is int and (state is None or (
            state.__class__ is bytes and not state.startswith(codec.sealed_prefix))):
        return StateRow(tid, stored_checksum, state)    # as stored (``loaded_states``)
    return StateRow(int(tid), stored_checksum, opened(codec, oid, int(tid), state))


def opened(codec: CodecRole, oid: int, tid: int, state: Any) -> bytes | None:
    """A stored state column as the state it holds (None: a deletion)."""
    if state is None:
        return None
    return codec.decode(oid, tid, bytes(state))


class LoadedNow:
    """A ``PendingLoad`` whose result was there when it was asked for."""

    def __init__(self, result: tuple[list[LoadedState], list[Revision]]) -> None:
        self._result = result

    def result(self) -> tuple[list[LoadedState], list[Revision]]:
        return self._result


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoverStatements:
    """The mover's statements in one history mode ("": none in this mode)."""

    clear_store: str = CLEAR_TEMP_STORE
    clear_blob: str = CLEAR_TEMP_BLOB
    stage_state: str = STAGE_STATE
    restage_state: str = RESTAGE_STATE
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
    #: Prefetch: several objects as of a snapshot, and a load with the states it refers
    #: to (``{listed}``: the backend's test against a list of oids).
    load_many: str
    #: ``load_many``'s test of a state's size (``HP_WITHIN_SIZE``).
    within_size: str
    references_of_many: str
    load_with_refs: str
    #: A revision's references from an oid on (``HF_REFERENCES_FROM``).
    references_from: str
    move_states: str
    move_blobs: str
    set_current: str = ""
    delete_removed: str = ""
    #: Records the objects a history-free commit deleted (their oids as a JSON array).
    record_deleted: str = ""
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
        load_revisions=HP_LOAD_REVISIONS, load_many=HP_LOAD_MANY_AT,
        within_size=HP_WITHIN_SIZE,
        references_of_many=HP_REFERENCES_OF_MANY,
        references_from=HP_REFERENCES_FROM,
        load_with_refs=prefetching(HP_LOAD_WITH_REFS, own=HP_OWN, parent=HP_PARENT,
                                   siblings=HP_SIBLINGS, kept=HP_KEPT,
                                   revisions=HP_REVISIONS_PORTABLE),
        move_states=HP_MOVE_STATES, move_blobs=HP_MOVE_BLOBS, set_current=HP_SET_CURRENT)
    HISTORY_FREE: ClassVar[MoverStatements] = MoverStatements(
        load_current=HF_LOAD_CURRENT, load_at=HF_LOAD_CURRENT, load_serial=HF_LOAD_CURRENT,
        load_before=HF_LOAD_CURRENT, exists=HF_CURRENT_TID, current_tid=HF_CURRENT_TID,
        count_objects=HF_COUNT_OBJECTS, load_revisions=HF_LOAD_REVISIONS,
        load_many=HF_LOAD_MANY, within_size=HF_WITHIN_SIZE,
        references_of_many=HF_REFERENCES_OF_MANY,
        references_from=HF_REFERENCES_FROM,
        load_with_refs=prefetching(HF_LOAD_WITH_REFS, own=HF_OWN, siblings=HF_SIBLINGS,
                                   kept=HF_KEPT),
        move_states=HF_MOVE_STATES, move_blobs=HF_MOVE_BLOBS,
        delete_removed=HF_DELETE_REMOVED, delete_old_blobs=HF_DELETE_OLD_BLOBS,
        record_deleted=HF_RECORD_DELETED)
    #: The most oids one statement lists (the rest go in further statements).
    MAX_LISTED_OIDS = 1000
    #: The query of ``(zoid, to_zoid)``, the first REFERENCES_EACH oids of the ``refs``
    #: (an array, ascending) of each ``kept`` state ``k`` (``REFERENCES``); none of a
    #: state whose ``refs`` is NULL.
    FIRST_REFERENCES: ClassVar[str]
    #: References of prefetched states a load brings along, per state it may prefetch
    #: (they name what a later miss brings: the items of a BTree's next buckets).
    REFERENCES_PER_STATE = 4
    #: The client picks what a miss brings along, instead of ``load_with_refs``: with a
    #: parent in the cache, its references after the miss (``zodbsql.cache.lookahead``;
    #: a parent too large to read is asked ``references_after``); without one, the
    #: miss's first references (``load_and_references``); then it loads them by oid.
    #: SQLite: a statement costs microseconds, and the prefetching statement's choice
    #: (references read from JSON, running sizes) cost more than the loads it saved,
    #: and its preparation 1 to 2 ms in every new connection.  A server's round trip
    #: makes its own choice worth it, except for a container's children
    #: (``LOOKAHEAD_AT_LEAST``).
    LOOKS_AHEAD = False
    #: The largest cached state it reads for its references (None: only the bound of
    #: ``lookahead.BYTES_READ_PER_OID`` per state wanted); a larger one is asked.
    LOOKAHEAD_LARGEST: int | None = None
    #: With LOOKS_AHEAD, where the mover has its prefetching statement: the fewest
    #: states the client's pick must find for it to be taken (None: always taken).
    #: A miss without a cached parent, or with fewer, goes to ``load_with_references``.
    LOOKAHEAD_AT_LEAST: int | None = None
    #: How many times ``load_with_refs`` (history-preserving) takes the snapshot tid
    #: where it finds the chosen objects' revisions (``HP_REVISIONS_*``).
    HP_REVISION_SNAPSHOTS = 2
    #: Can ``send_load_many_with_references`` send a pick and return before its rows
    #: come (a server that runs it while the client reads what came before)?  Here
    #: it loads at once.
    SENDS_AHEAD = False

    def __init__(self, backend: BackendContract) -> None:
        self.backend = backend
        self.keep_history = backend.keep_history
        self.sql = for_mode(self.keep_history, self.HISTORY_PRESERVING, self.HISTORY_FREE)

    def prepare_connection(self, conn: ConnectionRole) -> None:
        """Create the temporary tables a committing connection stages into."""
        for statement in self.CREATE_TEMP_TABLES:
            conn.execute(statement)

    # -- loading --------------------------------------------------------------------------
    def _row(self, row: tuple[Any, ...] | None, oid: int) -> StateRow | None:
        return state_row(row, oid, self.backend.codec)

    def load_current(self, conn: ConnectionRole, oid: int) -> StateRow | None:
        return self._row(conn.fetchone(self.sql.load_current, (oid,)), oid)

    def load_at(self, conn: ConnectionRole, oid: int, snapshot_tid: int) -> StateRow | None:
        """The revision current as of ``snapshot_tid`` (HP); the current one (HF)."""
        params = (oid, snapshot_tid) if self.keep_history else (oid,)
        return self._row(conn.fetchone(self.sql.load_at, params), oid)

    def load_serial(self, conn: ConnectionRole, oid: int, tid: int) -> StateRow | None:
        if self.keep_history:
            return self._row(conn.fetchone(self.sql.load_serial, (oid, tid)), oid)
        row = self._row(conn.fetchone(self.sql.load_serial, (oid,)), oid)
        return row if row is not None and row.tid == tid else None

    def load_before(self, conn: ConnectionRole, oid: int,
                    before_tid: int) -> tuple[StateRow, int | None] | None:
        """The revision before ``before_tid`` and the tid that replaced it (or None)."""
        if not self.keep_history:
            row = self._row(conn.fetchone(self.sql.load_before, (oid,)), oid)
            return (row, None) if row is not None and row.tid < before_tid else None
        row = self._row(conn.fetchone(self.sql.load_before, (oid, before_tid)), oid)
        if row is None:
            return None
        following = conn.fetchone(self.sql.next_tid, (oid, row.tid))
        end = following[0] if following else None
        return row, (int(end) if end is not None else None)

    def exists(self, conn: ConnectionRole, oid: int) -> bool:
        return conn.fetchone(self.sql.exists, (oid,)) is not None

    def listed(self, oids: Sequence[int]) -> tuple[str, list[Any]]:
        """The SQL test of a column against ``oids`` (not empty), and its parameters.

        The list is padded (repeating its last oid) to a power of two, so that a few
        statement texts serve every length and stay in the driver's statement cache.
        """
        padded = list(oids) + [oids[-1]] * (padded_length(len(oids)) - len(oids))
        return f"IN ({in_list(len(padded))})", padded

    def load_many_at(self, conn: ConnectionRole, oids: Sequence[int],
                     snapshot_tid: int, max_bytes: int | None = None,
                     largest: int | None = None) -> list[LoadedState]:
        """Those of ``oids`` that exist, each as ``load_at`` would return it, in one
        statement per ``MAX_LISTED_OIDS``; with ``max_bytes``, until that many bytes of
        states came: ``BYTES_STEP`` oids first, then as many as the bytes left hold at
        the sizes seen; with ``largest``, none stored in more bytes than that."""
        rows: list[LoadedState] = []
        step = self.MAX_LISTED_OIDS if max_bytes is None else min(BYTES_STEP, len(oids))
        size = start = 0
        while start < len(oids):
            test, params = self.listed(oids[start:start + step])
            start += step
            sql = self.sql.load_many.format(listed=test)
            if self.keep_history:
                params = [*params, snapshot_tid, snapshot_tid]
            if largest is not None:
                sql += self.sql.within_size
                params = [*params, largest]
            found = conn.fetchall(sql, params, binary=True)
            batch = loaded_states(found, self.backend.codec)
            rows += batch
            if max_bytes is not None:
                size += sum(len(state.state or b"") for state in batch)
                if size >= max_bytes:
                    break
                # The next statement lists as many as the bytes left should hold, at
                # the sizes seen so far.
                each = max(1, size // max(1, len(rows)))
                step = max(1, min(self.MAX_LISTED_OIDS, (max_bytes - size) // each))
        return rows

    def load_walked(self, conn: ConnectionRole, seeds: Sequence[int], snapshot_tid: int,
                    limit: int, largest: int) -> list[LoadedState] | None:
        """None: the portable mover has no walking statement of its own (a server's
        prefetching statement walks, ``WALK``; a client that picks walks a statement a
        step)."""
        return None

    def send_load_many_with_references(self, conn: ConnectionRole, oids: Sequence[int],
                                       snapshot_tid: int, max_bytes: int | None,
                                       references_each: int) -> PendingLoad:
        """``load_many_with_references``, its result taken later (``SENDS_AHEAD``);
        here it is loaded now."""
        return LoadedNow(self.load_many_with_references(
            conn, oids, snapshot_tid, max_bytes, references_each))

    def load_many_with_references(self, conn: ConnectionRole, oids: Sequence[int],
                                  snapshot_tid: int, max_bytes: int | None,
                                  references_each: int,
                                  ) -> tuple[list[LoadedState], list[Revision]]:
        """``load_many_at``'s states and the first ``references_each`` references of
        each of their revisions: portable, a second statement through ``object_ref``
        (a backend that keeps the references in the state's row reads them with it)."""
        states = self.load_many_at(conn, oids, snapshot_tid, max_bytes)
        loaded = {(each.oid, each.tid) for each in states if each.state is not None}
        if not loaded or references_each <= 0:
            return states, []
        found: dict[int, list[int]] = {}
        oids_loaded = sorted({oid for oid, _ in loaded})
        for start in range(0, len(oids_loaded), self.MAX_LISTED_OIDS):
            test, params = self.listed(oids_loaded[start:start + self.MAX_LISTED_OIDS])
            for zoid, tid, to_zoid in conn.fetchall(
                    self.sql.references_of_many.format(listed=test), params):
                zoid = int(zoid)
                if not self.keep_history or (zoid, int(tid)) in loaded:
                    found.setdefault(zoid, []).append(int(to_zoid))
        return states, [(zoid, to_zoid) for zoid in oids_loaded
                        for to_zoid in sorted(set(found.get(zoid, ())))[:references_each]]

    def load_with_references(self, conn: ConnectionRole, oid: int, snapshot_tid: int,
                             also: Sequence[int], limit: int, max_bytes: int,
                             max_references: int,
                             parents: Sequence[int] = (),
                             ) -> tuple[StateRow | None, list[LoadedState], list[Revision]]:
        """``oid``'s row as ``load_at`` returns it; in the same statement up to ``limit``
        states (``max_bytes`` bytes in all) at the same snapshot: of the objects it
        refers to, then of those of ``also``, then of its parent's references after it
        (its next siblings; the parent is the one of ``parents`` that refers to it); up
        to ``max_references`` references ``(from, to)`` of those states, and its own and
        its parent's that were looked at."""
        test, listed = self.listed(list(also[:self.MAX_LISTED_OIDS]) or [oid])
        sql = self.sql.load_with_refs.format(listed=test, parents=in_list(PARENTS),
                                             first_references=self.FIRST_REFERENCES)
        candidates = list(parents[-PARENTS:])
        candidates = [NO_PARENT] * (PARENTS - len(candidates)) + candidates
        own = max(limit, REFERENCES_EACH)
        if self.keep_history:
            params = [oid, snapshot_tid, oid, own, oid, *candidates, snapshot_tid, oid, limit,
                      *listed, oid, limit, *[snapshot_tid] * self.HP_REVISION_SNAPSHOTS,
                      max_bytes, max_references]
        else:
            params = [oid, oid, own, *candidates, oid, oid, limit, *listed, oid, limit,
                      max_bytes, max_references]
        row: StateRow | None = None
        brought: list[tuple[Any, ...]] = []
        references: list[Revision] = []
        for kind, zoid, tid, stored_checksum, state in conn.fetchall(sql, params, binary=True,
                                                                      prepare=True):
            if kind == 0:
                row = self._row((tid, stored_checksum, state), oid)
            elif kind == 1:
                brought.append((zoid, tid, stored_checksum, state))
            else:
                references.append((int(zoid), int(tid)))
        return row, loaded_states(brought, self.backend.codec), references

    def _references_from(self, conn: ConnectionRole, oid: int, snapshot_tid: int,
                         start: int, count: int) -> list[int]:
        """Up to ``count`` references, from ``start`` on, of ``oid``'s revision at the
        snapshot."""
        if self.keep_history:
            params: tuple[int, ...] = (oid, oid, snapshot_tid, start, count)
        else:
            params = (oid, start, count)
        return [int(row[0]) for row in conn.fetchall(self.sql.references_from, params)]

    def references_after(self, conn: ConnectionRole, parent: int, oid: int,
                         snapshot_tid: int, count: int) -> list[int] | None:
        """Up to ``count`` oids after ``oid`` among the references of ``parent``'s
        revision at the snapshot (ascending); None when it does not refer to ``oid``."""
        found = self._references_from(conn, parent, snapshot_tid, oid, count + 1)
        if not found or found[0] != oid:
            return None
        return found[1:]

    def load_and_references(self, conn: ConnectionRole, oid: int, snapshot_tid: int,
                            count: int) -> tuple[StateRow | None, list[int]]:
        """``oid``'s row as ``load_at`` returns it, and the first ``count`` oids its
        revision refers to."""
        row = self.load_at(conn, oid, snapshot_tid)
        if row is None or row.state is None or count <= 0:
            return row, []
        return row, self._references_from(conn, oid, snapshot_tid, 0, count)

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
        # temp_blob is emptied by move_staged after use (and by rollback), so a commit
        # without blobs spends no statement on it.

    def stage(self, conn: ConnectionRole, states: Sequence[StagedState]) -> None:
        """Stage states, each with the oids it refers to."""
        if states:
            conn.executemany(self.sql.stage_state, states)

    def write_states(self, conn: ConnectionRole, tid: int,
                     states: Sequence[StagedState]) -> None:
        """Only a backend whose commits hold the only write lock from vote on writes
        there (``Features.writes_at_vote``); the others stage."""
        raise NotImplementedError(
            f"{type(self).__name__} stages a commit's states (writes_at_vote is false)")

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
                found[int(oid)] = (stored_checksum,
                                   opened(self.backend.codec, int(oid), int(tid), state))
        return found

    def restage_many(self, conn: ConnectionRole, rows: list[ResolvedState]) -> None:
        """Replace staged states after conflict resolution, whatever their number, in
        one statement."""
        conn.executemany(self.sql.restage_state,
                         [(prev, check, size, state, refs, oid)
                          for oid, prev, check, size, state, refs in rows])

    def move_staged(self, conn: ConnectionRole, tid: int, blobs: bool) -> None:
        """Make the staged states the revisions of ``tid``.

        ``blobs``: the commit may change blob references (it staged blobs, copies
        revisions, deletes or restores objects); otherwise the blob steps are skipped.
        """
        sql = self.sql
        if self.keep_history:
            conn.execute(sql.move_states, (tid,))
            conn.execute(sql.set_current, (tid,))
            if blobs:
                conn.execute(sql.move_blobs, (tid,))
        else:
            conn.execute(sql.move_states, (tid,))
            conn.execute(sql.delete_removed)
            if blobs:   # (as any deletion is: see the caller)
                if conn.execute(HF_NEXT_GONE_SEQ):
                    conn.execute(sql.record_deleted, (tid,))
                conn.execute(sql.delete_old_blobs)
                conn.execute(sql.move_blobs, (tid,))
        if blobs and not self.backend.features.staging_emptied_by_transaction_end:
            conn.execute(sql.clear_blob)


#: Oids a statement of ``load_many_at`` lists when it counts bytes.
BYTES_STEP = 256


def padded_length(count: int) -> int:
    """The power of two at or above ``count`` (``count`` itself above 512)."""
    return count if count > 512 else 1 << max(0, count - 1).bit_length()


#: A row of four as a :class:`LoadedState`, without ``_make``'s frame (Python): 1,000
#: rows 0.88 -> 0.78 ms.
_AS_LOADED_STATE = functools.partial(tuple.__new__, LoadedState)


def loaded_states(rows: Iterable[tuple[Any, ...]], codec: CodecRole) -> list[LoadedState]:
    """Prefetched ``(oid, tid, checksum, state)`` rows as :class:`LoadedState`, without
    those that do not open (``loaded_state``).  A row read as it is stored (integers,
    and bytes the codec did not seal: most) is taken as it is, a step in C; the codec
    opens the others."""
    prefix = codec.sealed_prefix
    make = _AS_LOADED_STATE
    states: list[LoadedState] = []
    add = states.append
    for row in rows:
        oid, tid, _, state = row
        if (oid.__class__ is int and tid.__class__ is int
                and (state is None or (state.__class__ is bytes
                                       and not state.startswith(prefix)))):
            add(make(row))
        elif (loaded := loaded_state(row, codec)) is not None:
            add(loaded)
    return states


def loaded_state(row: tuple[Any, ...], codec: CodecRole) -> LoadedState | None:
    """A prefetched ``(oid, tid, checksum, state)`` row as a :class:`LoadedState`, its
    state decoded; None when it does not open (damaged, or its key is not configured):
    it is left out, and its own load reports it."""
    oid, tid, stored_checksum, state = row
    try:
        return LoadedState(int(oid), int(tid), stored_checksum,
                           opened(codec, int(oid), int(tid), state))
    except (CorruptRecordError, RecordKeyError):
        return None
