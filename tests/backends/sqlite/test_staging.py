"""SQLite stages a commit's states in multi-row INSERTs (backends/sqlite/mover.py):
whatever the mix of rows and the number of them, temp_store holds what the portable
staging (one INSERT a row, executemany) put there."""
from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from zodbsql.backends.base.mover import Mover
from zodbsql.backends.sqlite.mover import (STAGE_ANY, STAGE_PLAIN, STAGE_REFERRING,
                                           staging_groups, staging_statement,
                                           statement_rows)

storage_backends = ("sqlite",)
storage_backends_reason = "SQLite's own staging statements"


def test_statement_rows() -> None:
    assert statement_rows(0, 1024) == []
    assert statement_rows(1, 1024) == [1]
    assert statement_rows(3, 1024) == [4]
    assert statement_rows(1000, 1024) == [1024]
    assert statement_rows(1024, 1024) == [1024]
    assert statement_rows(1025, 1024) == [1024, 1]
    assert statement_rows(2100, 1024) == [1024, 1024, 64]
    assert statement_rows(200, 128) == [128, 128]


def test_rows_are_grouped_by_the_nulls_they_have() -> None:
    plain = (1, 0, None, 11, 3, b"abc", None)
    referring = (2, 5, None, 12, 3, b"def", "[1]")
    deleted = (3, 5, None, None, 0, None, None)
    copied = (4, 5, 99, 13, 3, b"ghi", None)
    unchecked = (5, 0, None, None, 3, b"jkl", None)
    groups = staging_groups([plain, referring, deleted, copied, unchecked])
    assert groups == [
        (STAGE_PLAIN, 5, [(1, 0, 11, 3, b"abc")]),
        (STAGE_REFERRING, 6, [(2, 5, 12, 3, b"def", "[1]")]),
        (STAGE_ANY, 7, [deleted, copied, unchecked]),
    ]


def test_padding_rows_are_not_inserted() -> None:
    sql = staging_statement(STAGE_PLAIN, 2, 4)
    assert sql.count("(%s,%s)") == 4 and sql.endswith("WHERE column1 IS NOT NULL")


def staged_rows(count: int) -> list[tuple[Any, ...]]:
    """``count`` rows of every kind, mixed."""
    rows: list[tuple[Any, ...]] = []
    for oid in range(1, count + 1):
        kind = oid % 7
        state = bytes([oid % 251]) * (oid % 13 + 1)
        if kind == 1:
            rows.append((oid, oid * 3, None, oid * 5, len(state), state, f"[{oid + 1}]"))
        elif kind == 2:
            rows.append((oid, oid * 3, None, None, 0, None, None))
        elif kind == 3:
            rows.append((oid, oid * 3, oid * 2, oid * 5, len(state), state, None))
        else:
            rows.append((oid, oid * 3, None, -oid * 5, len(state), state, None))
    return rows


def statements_for(rows: list[tuple[Any, ...]], variables: int) -> int:
    """Each kind of row in statements of the most rows, a power of two up to 1,024,
    whose values fit in ``variables``."""
    total = 0
    for width, count in ((5, sum(1 for row in rows if row[2] is None and row[3] is not None
                                 and row[5] is not None and row[6] is None)),
                         (6, sum(1 for row in rows if row[2] is None and row[3] is not None
                                 and row[5] is not None and row[6] is not None)),
                         (7, sum(1 for row in rows if row[2] is not None or row[3] is None
                                 or row[5] is None))):
        largest = max(size for size in (1 << bits for bits in range(11))
                      if size * width <= variables)
        total += -(-count // largest)
    return total


@pytest.mark.parametrize("count", [1, 5, 1024, 2500])
@pytest.mark.parametrize("variables", [999, 640, None])
def test_staged_as_the_portable_staging_stages(storage_factory: Any, count: int,
                                               variables: int | None) -> None:
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
            assert sent[0] == statements_for(rows, variables or conn.max_variables)
            assert sent[1] == 1
        finally:
            conn.rollback()
            storage.shared.pool.release(conn)
    finally:
        storage.close()
