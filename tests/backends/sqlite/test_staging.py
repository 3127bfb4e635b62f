"""SQLite stages a commit's states in multi-row INSERTs (backends/sqlite/mover.py), the
states of a statement bound as one blob that each row cuts: whatever the mix of rows,
their number and their sizes, temp_store holds what the portable staging (one INSERT a
row, executemany) put there."""
from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from zodbsql.backends.base.mover import Mover
from zodbsql.backends.sqlite import mover as sqlite_mover
from zodbsql.backends.sqlite.mover import (STAGE_ANY, STAGE_PLAIN, STAGE_REFERRING,
                                           sliced_values, staging_groups,
                                           staging_statement, statement_spans)

storage_backends = ("sqlite",)
storage_backends_reason = "SQLite's own staging statements"


def test_statement_spans() -> None:
    assert statement_spans([], 1024, 100) == []
    assert statement_spans([10] * 5, 2, 100) == [(0, 2), (2, 4), (4, 5)]
    assert statement_spans([10] * 2100, 1024, 1 << 20) == [(0, 1024), (1024, 2048),
                                                          (2048, 2100)]
    # Over the byte bound: cut before the row that would pass it; a larger row alone.
    assert statement_spans([10] * 5, 4, 25) == [(0, 2), (2, 4), (4, 5)]
    assert statement_spans([10] * 5, 4, 20) == [(0, 2), (2, 4), (4, 5)]
    assert statement_spans([50, 1, 1, 60, 1], 8, 40) == [(0, 1), (1, 3), (3, 4), (4, 5)]
    assert statement_spans([1] * 6, 2, 5) == [(0, 2), (2, 4), (4, 6)]


def test_a_statement_binds_its_states_as_one_blob() -> None:
    rows = [(1, 0, None, 11, 3, b"abc", None), (2, 5, None, 12, 2, b"de", "[1]")]
    assert sliced_values(rows, referring=False) == [b"abcde", 1, 0, 11, 1, 3,
                                                   2, 5, 12, 4, 2]
    assert sliced_values(rows, referring=True) == [b"abcde", 1, 0, 11, 1, 3, None,
                                                  2, 5, 12, 4, 2, "[1]"]


def test_rows_are_grouped_by_the_nulls_they_have() -> None:
    plain = (1, 0, None, 11, 3, b"abc", None)
    referring = (2, 5, None, 12, 3, b"def", "[1]")
    deleted = (3, 5, None, None, 0, None, None)
    copied = (4, 5, 99, 13, 3, b"ghi", None)
    unchecked = (5, 0, None, None, 3, b"jkl", None)
    empty = (6, 0, None, 14, 0, b"", None)
    groups = staging_groups([plain, referring, deleted, copied, unchecked, empty])
    assert groups == [
        (STAGE_PLAIN, 5, [plain]),
        (STAGE_REFERRING, 6, [referring]),
        (STAGE_ANY, 7, [deleted, copied, unchecked, empty]),
    ]


def test_padding_rows_are_not_inserted() -> None:
    sql = staging_statement(STAGE_ANY, 2, 4)
    assert sql.count("(%s,%s)") == 4 and sql.endswith("WHERE column1 IS NOT NULL")
    sql = staging_statement(STAGE_PLAIN, 5, 4)
    assert sql.count("(%s,%s,%s,%s,%s)") == 4 and "substr(?1, column4, column5)" in sql


def staged_rows(count: int) -> list[tuple[Any, ...]]:
    """``count`` rows of every kind, mixed."""
    rows: list[tuple[Any, ...]] = []
    for oid in range(1, count + 1):
        kind = oid % 7
        state = bytes([oid % 251]) * (oid % 13 + 1)
        if oid % 11 == 0:
            state = b""
        elif oid % 17 == 0:
            state = bytes(range(256)) * 40      # 10 KB: the blob is cut by its bytes
        if kind == 1:
            rows.append((oid, oid * 3, None, oid * 5, len(state), state, f"[{oid + 1}]"))
        elif kind == 2:
            rows.append((oid, oid * 3, None, None, 0, None, None))
        elif kind == 3:
            rows.append((oid, oid * 3, oid * 2, oid * 5, len(state), state, None))
        else:
            rows.append((oid, oid * 3, None, -oid * 5, len(state), state, None))
    return rows


def statements_for(rows: list[tuple[Any, ...]], variables: int, most_bytes: int) -> int:
    """Each kind of row in statements of the most rows, a power of two up to 1,024,
    whose values fit in ``variables`` and whose states in ``most_bytes``."""
    total = 0
    for width, group in ((5, [row for row in rows if row[2] is None and row[3] is not None
                               and row[5] and row[6] is None]),
                         (6, [row for row in rows if row[2] is None and row[3] is not None
                              and row[5] and row[6] is not None]),
                         (7, [row for row in rows if row[2] is not None or row[3] is None
                              or not row[5]])):
        blob = width < 7      # one more value: the states' blob
        largest = max(size for size in (1 << bits for bits in range(11))
                      if size * width + blob <= variables)
        statements = rows_in = bytes_in = 0
        for row in group:
            size = len(row[5]) if blob else 0
            if rows_in and (rows_in == largest or bytes_in + size > most_bytes):
                statements += 1
                rows_in = bytes_in = 0
            rows_in += 1
            bytes_in += size
        total += statements + (rows_in > 0)
    return total


@pytest.mark.parametrize("count", [1, 5, 1024, 2500])
# 641: 128 rows of 5 values and the blob, exactly.
@pytest.mark.parametrize("variables", [999, 641, 640, None])
@pytest.mark.parametrize("most_bytes", [16 << 20, 20_000])
def test_staged_as_the_portable_staging_stages(storage_factory: Any, count: int,
                                               variables: int | None, most_bytes: int,
                                               monkeypatch: Any) -> None:
    monkeypatch.setattr(sqlite_mover, "STAGED_BYTES_PER_STATEMENT", most_bytes)
    storage = storage_factory.open()
    try:
        backend = storage.shared.backend
        conn = storage.shared.pool.acquire()
        try:
            if variables is not None:      # an SQLite built before 3.32, or smaller
                conn.raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, variables)
                conn.max_variables = variables
            rows = staged_rows(count)
            tables = []
            sent: list[int] = []
            for stage in (backend.mover.stage, lambda c, r: Mover.stage(backend.mover, c, r)):
                backend.mover.clear_staged(conn)
                before = conn.statements
                stage(conn, rows)
                sent.append(conn.statements - before)
                tables.append(conn.fetchall(
                    "SELECT zoid, prev_tid, data_tid, checksum, state_size, state, refs"
                    " FROM temp_store ORDER BY zoid"))
            assert tables[0] == tables[1] == [tuple(row) for row in rows]
            assert sent[0] == statements_for(rows, variables or conn.max_variables,
                                              most_bytes)
            assert sent[1] == 1
        finally:
            conn.rollback()
            storage.shared.pool.release(conn)
    finally:
        storage.close()


def written_rows(count: int) -> list[tuple[Any, ...]]:
    """``count`` rows a commit writes at vote (no deletion, no copy), in descending oid
    order as ZODB stores new objects: plain, referring, empty and large states."""
    return [row for row in reversed(staged_rows(count))
            if row[5] is not None and row[2] is None]


@pytest.mark.parametrize("count", [1, 1100, 2500])
@pytest.mark.parametrize("most_bytes", [16 << 20, 20_000])
def test_written_at_vote_as_staging_and_its_move_write(storage_factory: Any, count: int,
                                                       most_bytes: int,
                                                       monkeypatch: Any) -> None:
    """``write_states`` leaves object_state (and current_object) as staging the same
    rows and moving them under the same tid does, over rows already there (history-
    free: replaced, references dropped where the new revision has none)."""
    monkeypatch.setattr(sqlite_mover, "STAGED_BYTES_PER_STATEMENT", most_bytes)
    storage = storage_factory.open()
    try:
        backend = storage.shared.backend
        keep_history = storage_factory.param.keep_history
        older = [(oid, 0, None, 7, 3, b"old", "[1,2]") for oid in range(1, count + 1, 3)]
        rows = written_rows(count)
        assert rows and len({row[0] for row in rows}) == len(rows)
        conn = storage.shared.pool.acquire()
        tables = []
        try:
            for write in ("at vote", "staged"):
                conn.begin_write()
                backend.mover.write_states(conn, 5, older)
                if write == "at vote":
                    backend.mover.write_states(conn, 9, rows)
                else:
                    backend.mover.clear_staged(conn)
                    backend.mover.stage(conn, rows)
                    backend.mover.move_staged(conn, 9, blobs=False)
                states = conn.fetchall("SELECT * FROM object_state ORDER BY zoid, tid")
                current = (conn.fetchall("SELECT zoid, tid FROM current_object ORDER BY zoid")
                           if keep_history else [])
                tables.append((states, current))
                conn.rollback()
        finally:
            conn.rollback()
            storage.shared.pool.release(conn)
        assert tables[0] == tables[1]
        states, current = tables[0]
        written = {row[0] for row in rows}
        kept_older = [row for row in older if keep_history or row[0] not in written]
        assert len(states) == len(rows) + len(kept_older)
        if keep_history:
            assert current == sorted({(row[0], 9) for row in rows}
                                     | {(row[0], 5) for row in older if row[0] not in written})
    finally:
        storage.close()
