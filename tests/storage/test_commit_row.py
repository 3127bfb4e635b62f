"""The one row of ``commit_row`` (the last tid) gone: every read of it says so.

Read as tid 0, a lost row showed a new process an empty database (ZODB then failed
creating a root that exists, with a retryable-looking ConflictError) and let a commit
number its transaction from nothing.  tests/cli/test_doctor.py restores it."""
from __future__ import annotations

from typing import Any

import pytest

from tests.storage.test_verify import run_sql
from zodbsql.backends.base.poller import Poller
from zodbsql.backends.mysql.poller import MySQLPoller
from zodbsql.backends.postgresql.poller import PostgreSQLPoller
from zodbsql.backends.sqlite.poller import SQLitePoller
from zodbsql.errors import SchemaError

MESSAGE = ("the schema is damaged: table commit_row has no row, so the last transaction"
           " can't be read (zodbsql doctor gives the statement that restores it)")


@pytest.mark.parametrize("rows", [[], [(2, 0, 0), (3, 0, 0)], [(1, 5, 7)]])
def test_a_poll_without_the_last_tid_row_is_refused(rows: list[Any]) -> None:
    # PostgreSQL's rows carry their third column as an array, a commit's its oids.
    arrayed = [(5 if kind == 1 else kind, value, [tid]) for kind, value, tid in rows]
    # MySQL's as text, a commit's its oids as JSON.
    text = [(5, value, "[7]") if kind == 1 else (kind, value, str(tid))
            for kind, value, tid in rows]
    for parse, given in ((Poller.parse_poll, rows), (SQLitePoller.parse_poll, rows),
                         (PostgreSQLPoller.parse_poll, arrayed),
                         (MySQLPoller.parse_poll, text)):
        with pytest.raises(SchemaError) as raised:
            parse(given)
        assert str(raised.value) == MESSAGE


def test_the_last_tid_row_gone_is_named_by_every_reader(storage_factory: Any) -> None:
    storage = storage_factory.open()
    poller = storage.backend.poller
    conn = storage.backend.connect()
    try:
        assert poller.last_tid(conn) == 0              # a new database: the row, at 0
    finally:
        conn.rollback()
        conn.close()
    run_sql(storage, "DELETE FROM commit_row", ())
    conn = storage.backend.connect()                 # a snapshot after the DELETE
    try:
        with pytest.raises(SchemaError) as raised:
            poller.last_tid(conn)
        assert str(raised.value) == MESSAGE
        with pytest.raises(SchemaError) as raised:
            poller.poll(conn, None)
        assert str(raised.value) == MESSAGE
    finally:
        conn.rollback()
        conn.close()
