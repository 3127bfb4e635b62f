"""PostgreSQL stages commits in TEMPORARY tables: private to the session, never WAL-logged.

A commit's states (each with its references) reach them in one statement whatever their number,
the locker's call of ``zodbsql_stage_and_lock`` (locker.py), which stages and then locks:
each column travels as one array (``as_arrays``) and ``unnest`` turns the arrays back into
rows.  (``executemany``, even pipelined, makes the server parse, bind and run one INSERT
per row.)  The states' ``bytea[]`` goes in binary (``%b``): psycopg's text form of it
escapes every byte, which cost 7.7 ms for 1,000 states of 170 bytes here, against 0.9 ms
in binary.  The integer arrays go as text (``bigint_array``): psycopg dumps a binary
array element by element in Python, and ``str.join`` builds the text in C (a commit of
10,000 new objects: 25 ms to send its six staged columns in binary, 18 ms with the five
integer ones as text).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from zodbsql.backends.base.contract import (ConnectionRole, LoadedState, PendingLoad,
                                            ResolvedState, Revision)
from zodbsql.backends.base.mover import (HF_LOAD_WITH_REFS, HF_WALK_STEP, HP_LOAD_WITH_REFS,
                                        HP_WALK_STEP, REFERENCES_EACH, LoadedNow, Mover,
                                        loaded_states, prefetching, walking)
from zodbsql.backends.postgresql.connections import PostgreSQLConnection, ReadAhead


# ON COMMIT DELETE ROWS: every commit or rollback empties them, so a commit never
# spends statements clearing what the previous one staged.  temp_store has no primary
# key: its oids are distinct (a commit's states are a dict), every statement reading it
# reads it whole (a hash join, or an array of its oids), and staging 10,000 new objects
# took 50-60 ms with the index against 41-44 ms without (the fastest of five commits).
CREATE_TEMP_TABLES = (
    "CREATE TEMPORARY TABLE IF NOT EXISTS temp_store (zoid BIGINT NOT NULL,"
    " prev_tid BIGINT NOT NULL, data_tid BIGINT, checksum BIGINT,"
    " state_size BIGINT NOT NULL, state BYTEA, refs BIGINT[]) ON COMMIT DELETE ROWS",
    "CREATE TEMPORARY TABLE IF NOT EXISTS temp_blob (zoid BIGINT PRIMARY KEY,"
    " content_hash BYTEA NOT NULL) ON COMMIT DELETE ROWS",
)


# After conflict resolution, with the row locks held: the resolved states (and their
# references) replace the staged ones, in one statement.
RESTAGE_ALL = (
    "UPDATE temp_store t SET prev_tid = r.prev_tid, checksum = r.checksum,"
    " state_size = r.state_size, state = r.state,"
    " refs = translate(r.refs, '[]', '{}')::BIGINT[]"
    " FROM unnest(%b::BIGINT[], %b::BIGINT[], %b::BIGINT[], %b::BIGINT[], %b::BYTEA[],"
    " %b::TEXT[]) AS r (zoid, prev_tid, checksum, state_size, state, refs)"
    " WHERE t.zoid = r.zoid")


# Prefetch takes a revision's references as slices of its array (the oids are
# ascending): its first ones, and those after the object in its parent's (found with
# array_position), where rows of the object_ref view needed an unnest of the whole array
# and a sort: a load of one child of a 10,000-child container spent 3.5 ms of the
# server's time on its siblings.
FIRST_REFERENCES = ("SELECT k.zoid, j.to_zoid FROM kept k"
                    f" CROSS JOIN LATERAL unnest(k.refs[1:{REFERENCES_EACH}]) AS j (to_zoid)")
# A running size sums ``state_size::INT4`` (a state is under PostgreSQL's 1 GB limit on a
# value): the SUM of a BIGINT is a NUMERIC, and its window took a third of the server's
# time of a pick of 999 children (4.8 -> 4.0 ms, ``EXPLAIN ANALYZE``; 7.3 -> 6.7 ms at
# the client).
# Here the states travel with their running size (history-preserving, one index scan
# each finds the revision and reads its state).  Summed apart from the states, as the
# other backends do, the walk's numbering of its states (``row_number() OVER ()``, the
# order the recursion produced them in) came out reversed in the generic plan, and a
# cold BTree walk's queue lost the next buckets: 299 statements instead of 19.
HP_REVISIONS = (
    " sized AS (SELECT s.zoid, s.tid, s.checksum, s.state, s.refs,"
    " SUM(s.state_size::INT4) OVER (ORDER BY w.step, w.zoid) AS total"
    " FROM chosen w CROSS JOIN LATERAL (SELECT m.zoid, m.tid, m.checksum, m.state, m.refs,"
    " m.state_size FROM object_state m WHERE m.zoid = w.zoid AND m.tid <= %s"
    " ORDER BY m.tid DESC LIMIT 1) s),")
KEPT = " kept AS (SELECT zoid, tid, checksum, state, refs FROM sized WHERE total <= %s)"
HF_KEPT = (
    " sized AS (SELECT s.zoid, s.tid, s.checksum, s.state, s.refs,"
    " SUM(s.state_size::INT4) OVER (ORDER BY w.step, w.zoid) AS total"
    " FROM chosen w JOIN object_state s ON s.zoid = w.zoid)," + KEPT)
HF_OWN = (" own AS (SELECT s.zoid AS parent, u.zoid FROM (SELECT zoid, refs FROM object_state"
          " WHERE zoid = %s) s CROSS JOIN LATERAL unnest(s.refs[1:%s::INT]) AS u (zoid)),")
# A miss's siblings: the references after it in its parent's (step 2), then the
# parent's first ones before it (step 3, at most FIRST_OF_PARENT, in the room left).  A
# BTree bucket whose next bucket has a lower oid than its items (oids come in the order
# a commit finds its new objects) has it first among its references, never after an
# item: without them a walk that lost the buckets went on at a statement a bucket or
# two (the bucket's own references, not walked on from); a second pass over twice what
# a 32 MB cache holds took 963 statements, 194 now.  (SQLite's client takes a parent's
# references before the miss too, ``lookahead``.)
FIRST_OF_PARENT = 16
AFTER_IN_PARENT = (" CROSS JOIN LATERAL (SELECT array_position(p.refs, %s::BIGINT) AS at,"
                   " %s::INT AS n) b CROSS JOIN LATERAL (SELECT a.zoid, 2 AS step"
                   " FROM unnest(p.refs[b.at + 1 : b.at + b.n]) AS a (zoid) UNION ALL"
                   " SELECT f.zoid, 3 FROM unnest(p.refs[1 : LEAST(b.at - 1,"
                   f" {FIRST_OF_PARENT})]) AS f (zoid)) u),")
HF_SIBLINGS = (" siblings AS (SELECT p.zoid AS parent, u.zoid, u.step FROM (SELECT zoid, refs"
               " FROM object_state WHERE zoid IN ({parents}) AND %s::BIGINT = ANY(refs)"
               " LIMIT 1) p" + AFTER_IN_PARENT)
HP_OWN = (" own AS (SELECT s.zoid AS parent, u.zoid FROM (SELECT zoid, refs FROM object_state"
          " WHERE zoid = %s AND tid = (SELECT tid FROM target)) s"
          " CROSS JOIN LATERAL unnest(s.refs[1:%s::INT]) AS u (zoid)),")
HP_PARENT = (" parent AS (SELECT c.zoid FROM current_object c JOIN object_state s"
             " ON s.zoid = c.zoid AND s.tid = c.tid AND %s::BIGINT = ANY(s.refs)"
             " WHERE c.zoid IN ({parents}) LIMIT 1),")
HP_SIBLINGS = (" siblings AS (SELECT p.zoid AS parent, u.zoid, u.step FROM (SELECT zoid, refs"
               " FROM object_state WHERE zoid = (SELECT zoid FROM parent) AND tid = (SELECT"
               " MAX(tid) FROM object_state WHERE zoid = (SELECT zoid FROM parent)"
               " AND tid <= %s)) p" + AFTER_IN_PARENT)


# The client's pick (``load_many_with_references``), in one statement: each listed
# oid's state, its first references (a slice of its ``refs``, ascending), and the size
# of the states listed before it (``unnest WITH ORDINALITY`` keeps the list's order),
# kept while that is under ``max_bytes``.  (The base mover's loop asks 256 oids first,
# then as many as the bytes left hold: two round trips for a container's 1,000
# children.)  The oids go as the text of an array (``bigint_array``), built in C:
# psycopg's binary array is dumped element by element (999 oids: 0.41 against 0.22 ms).
HF_LOAD_MANY_BYTES = (
    "SELECT zoid, tid, checksum, state, refs FROM (SELECT o.zoid, o.tid, o.checksum,"
    " o.state, o.refs[1:%s::INT] AS refs,"
    " SUM(o.state_size::INT4) OVER (ORDER BY w.n) - o.state_size AS before"
    " FROM unnest(%t::BIGINT[]) WITH ORDINALITY AS w (zoid, n)"
    " JOIN object_state o ON o.zoid = w.zoid) s WHERE before < %s")
HP_LOAD_MANY_BYTES = (
    "SELECT zoid, tid, checksum, state, refs FROM (SELECT o.zoid, o.tid, o.checksum,"
    " o.state, o.refs[1:%s::INT] AS refs,"
    " SUM(o.state_size::INT4) OVER (ORDER BY w.n) - o.state_size AS before"
    " FROM unnest(%t::BIGINT[]) WITH ORDINALITY AS w (zoid, n)"
    " CROSS JOIN LATERAL (SELECT m.zoid, m.tid, m.checksum, m.state, m.state_size, m.refs"
    " FROM object_state m WHERE m.zoid = w.zoid AND m.tid <= %s"
    " ORDER BY m.tid DESC LIMIT 1) o) s WHERE before < %s")
#: ``max_bytes`` None: no bound.
NO_BYTE_BOUND = 1 << 62


def stepped_siblings(statement: str) -> str:
    """``statement`` with each sibling's own step (``AFTER_IN_PARENT``)."""
    plain = " UNION ALL SELECT zoid, 2 FROM siblings),"
    assert statement.count(plain) == 1
    return statement.replace(plain, " UNION ALL SELECT zoid, step FROM siblings),")


class PostgreSQLMover(Mover):
    CREATE_TEMP_TABLES = CREATE_TEMP_TABLES
    FIRST_REFERENCES = FIRST_REFERENCES
    HISTORY_PRESERVING = dataclasses.replace(
        Mover.HISTORY_PRESERVING, load_with_refs=walking(stepped_siblings(prefetching(
            HP_LOAD_WITH_REFS, own=HP_OWN, parent=HP_PARENT, siblings=HP_SIBLINGS,
            kept=KEPT, revisions=HP_REVISIONS)), HP_WALK_STEP))
    HISTORY_FREE = dataclasses.replace(Mover.HISTORY_FREE, load_with_refs=walking(
        stepped_siblings(prefetching(HF_LOAD_WITH_REFS, own=HF_OWN, siblings=HF_SIBLINGS,
                                     kept=HF_KEPT)), HF_WALK_STEP),
        # (zodbsql_finish records them itself; this is the portable finish's form.)
        record_deleted="INSERT INTO object_gone (seq, tid, zoids) SELECT g.last_seq, %s,"
        " array_to_json(ARRAY(SELECT zoid FROM temp_store WHERE state IS NULL))::TEXT"
        " FROM gone_row g")
    HP_REVISION_SNAPSHOTS = 1
    # A miss among a cached container's children brings the others not cached by oid
    # (``load_many_with_references``: one plain statement), where the prefetching
    # statement found them, walked on from each, sorted and summed them, and sent the
    # container's references back: 8.5 ms of the server's for 999 children against
    # 3.9 here (``EXPLAIN ANALYZE``), and a cold read of 1,000 children took 31 ms
    # instead of 25 (the median of 15, read in turn in one process).  Anything else
    # stays the statement's: a BTree's bucket holds 15 to 30 items, and the statement
    # walks on to the next buckets.
    LOOKS_AHEAD = True
    LOOKAHEAD_AT_LEAST = 128
    # One array parameter whatever the number: the statement's text never changes, so
    # it stays prepared.
    MAX_LISTED_OIDS = 100_000
    # The rest of a large pick goes in pipeline mode: the server reads it while ZODB
    # reads the first part (see ``storage._load_batch``).
    SENDS_AHEAD = True

    def listed(self, oids: Sequence[int]) -> tuple[str, list[Any]]:
        return any_of(oids)

    def load_many_with_references(self, conn: ConnectionRole, oids: Sequence[int],
                                  snapshot_tid: int, max_bytes: int | None,
                                  references_each: int,
                                  ) -> tuple[list[LoadedState], list[Revision]]:
        """In one statement: the states, with their references cut from their rows."""
        if not oids:
            return [], []
        sql, params = self._pick(oids, snapshot_tid, max_bytes, references_each)
        return self._picked(conn.fetchall(sql, params, binary=True, prepare=True))

    def send_load_many_with_references(self, conn: ConnectionRole, oids: Sequence[int],
                                       snapshot_tid: int, max_bytes: int | None,
                                       references_each: int) -> PendingLoad:
        """The same statement in pipeline mode (``PostgreSQLConnection.send_fetchall``)."""
        assert isinstance(conn, PostgreSQLConnection)
        if not (oids and conn.sends_ahead()):
            return LoadedNow(self.load_many_with_references(
                conn, oids, snapshot_tid, max_bytes, references_each))
        sql, params = self._pick(oids, snapshot_tid, max_bytes, references_each)
        return _SentPick(self, conn.send_fetchall(sql, params))

    def _pick(self, oids: Sequence[int], snapshot_tid: int, max_bytes: int | None,
              references_each: int) -> tuple[str, list[Any]]:
        bound = NO_BYTE_BOUND if max_bytes is None else max_bytes
        if self.keep_history:
            return HP_LOAD_MANY_BYTES, [references_each, bigint_array(oids), snapshot_tid,
                                        bound]
        return HF_LOAD_MANY_BYTES, [references_each, bigint_array(oids), bound]

    def _picked(self, rows: list[Any]) -> tuple[list[LoadedState], list[Revision]]:
        references = [(int(zoid), int(to_zoid)) for zoid, _, _, _, refs in rows if refs
                      for to_zoid in refs]
        return loaded_states([row[:4] for row in rows], self.backend.codec), references

    def restage_many(self, conn: ConnectionRole, rows: list[ResolvedState]) -> None:
        conn.execute(RESTAGE_ALL, as_arrays(rows, 6))


def as_arrays(rows: Sequence[Sequence[Any]], width: int) -> list[list[Any]]:
    """Rows of ``width`` values as ``width`` columns, one array parameter each."""
    if not rows:
        return [[] for _ in range(width)]
    return [list(column) for column in zip(*rows)]


def bigint_array(values: Sequence[int | None]) -> str:
    """``values`` as the text of a ``BIGINT[]`` (``{1,-2,NULL}``), for a ``%t::BIGINT[]``
    parameter."""
    if None in values:
        return "{" + ",".join(["NULL" if v is None else str(v) for v in values]) + "}"
    return "{" + ",".join(map(str, values)) + "}"


def text_array(values: Sequence[str | None]) -> str:
    """``values`` (each a JSON array of oids, or None) as the text of a ``TEXT[]``, for a
    ``%t::TEXT[]`` parameter.  Their characters are digits, commas and brackets, which
    need no escape inside the quotes."""
    return "{" + ",".join(["NULL" if v is None else f'"{v}"' for v in values]) + "}"


def any_of(oids: Sequence[int]) -> tuple[str, list[Any]]:
    """The test of a column against ``oids`` as one binary array, and its parameter (the
    mover's and the packer's ``listed``)."""
    return "= ANY(%b::BIGINT[])", [list(oids)]


class _SentPick:
    """A pick sent ahead: its rows are read, and turned into states, when asked for."""

    def __init__(self, mover: PostgreSQLMover, sent: ReadAhead) -> None:
        self._mover = mover
        self._sent = sent

    def result(self) -> tuple[list[LoadedState], list[Revision]]:
        return self._mover._picked(self._sent.rows())
