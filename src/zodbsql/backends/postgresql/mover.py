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

from zodbsql.backends.base.contract import ConnectionRole, ResolvedState
from zodbsql.backends.base.mover import (HF_LOAD_WITH_REFS, HF_REFERENCES, HF_WALK_STEP,
                                        HP_LOAD_WITH_REFS, HP_REFERENCES,
                                        HP_REVISIONS_LATERAL, HP_WALK_STEP,
                                        REFERENCES_EACH, Mover, walking)


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


# PostgreSQL caps each state's references with LATERAL (see ``walking``).
HF_CAPPED = (" FROM kept k CROSS JOIN LATERAL (SELECT r.zoid, r.to_zoid FROM object_ref r"
             f" WHERE r.zoid = k.zoid LIMIT {REFERENCES_EACH}) r LIMIT %s) f")
HP_CAPPED = (" FROM kept k CROSS JOIN LATERAL (SELECT r.zoid, r.to_zoid FROM object_ref r"
             f" WHERE r.zoid = k.zoid AND r.tid = k.tid LIMIT {REFERENCES_EACH}) r"
             " LIMIT %s) f")


class PostgreSQLMover(Mover):
    CREATE_TEMP_TABLES = CREATE_TEMP_TABLES
    HISTORY_PRESERVING = dataclasses.replace(
        Mover.HISTORY_PRESERVING, load_with_refs=walking(
            HP_LOAD_WITH_REFS.replace("{revisions}", HP_REVISIONS_LATERAL), HP_WALK_STEP,
            HP_REFERENCES, HP_CAPPED))
    HISTORY_FREE = dataclasses.replace(Mover.HISTORY_FREE, load_with_refs=walking(
        HF_LOAD_WITH_REFS, HF_WALK_STEP, HF_REFERENCES, HF_CAPPED))
    HP_REVISION_SNAPSHOTS = 1
    REFERENCES_PER_STATE = 16
    # One array parameter whatever the number: the statement's text never changes, so
    # it stays prepared.
    MAX_LISTED_OIDS = 100_000

    def listed(self, oids: Sequence[int]) -> tuple[str, list[Any]]:
        return any_of(oids)

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
