"""SQLite's errors as zodbsql reports them: each one SQLite itself raises (a full
database, a read-only file, a held lock, a bad statement, a failed COMMIT, a value the
driver refuses), through the connection a storage uses, must come out as the zodbsql
error of its kind with a message that names the file, what happened and what to do,
and the statement that failed."""
from __future__ import annotations

import pathlib
import sqlite3
import time
from typing import Iterator

import pytest

from tests.backends.sqlite.test_writer_queue import _hold_file
from zodbsql.backends.base.connections import StatementTally
from zodbsql.backends.sqlite.connections import SQLiteConnection, result_code
from zodbsql.backends.sqlite.writers import queue_for
from zodbsql.errors import CommitLockTimeout, DatabaseError

INSERT = "INSERT INTO filler (data) VALUES (%s)"


def _connection(path: pathlib.Path, lock_timeout: float = 0.2,
                uri: str | None = None) -> SQLiteConnection:
    raw = sqlite3.connect(uri or str(path), uri=uri is not None, isolation_level=None,
                          timeout=lock_timeout, check_same_thread=False)
    return SQLiteConnection(raw, str(path), lock_timeout)


@pytest.fixture
def database(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A WAL database with one table, as a storage's file is."""
    path = tmp_path / "errors.sqlite"
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode = WAL")
    setup.execute("CREATE TABLE filler (data BLOB)")
    setup.close()
    yield path


def test_a_full_database_says_the_disk_is_full_and_nothing_was_written(
        database: pathlib.Path) -> None:
    conn = _connection(database)
    # SQLite answers SQLITE_FULL at its page limit exactly as on a full disk.
    conn.execute("PRAGMA max_page_count = 8")
    with pytest.raises(DatabaseError) as info:
        for _ in range(100):
            conn.execute(INSERT, (b"x" * 4000,))
    message = str(info.value)
    assert message.startswith(
        f"the disk holding SQLite database {database} is full (database or disk is full);"
        " nothing of this transaction was written. Free space and retry\n"), message
    assert info.value.statement == INSERT
    assert message.endswith(f"statement: {INSERT}")
    conn.close()


def test_a_file_this_process_may_not_write_is_named_with_the_way_out(
        database: pathlib.Path) -> None:
    conn = _connection(database, uri=f"file:{database}?mode=ro")
    with pytest.raises(DatabaseError) as info:
        conn.execute(INSERT, (b"x",))
    assert str(info.value) == (
        f"SQLite database {database} is read-only for this process (attempt to write a"
        " readonly database); open the storage with read-only true or fix the file's"
        f" permissions\n  statement: {INSERT}")
    assert info.value.statement == INSERT
    conn.close()


def test_a_lock_held_elsewhere_is_a_timeout_the_transaction_can_retry(
        database: pathlib.Path) -> None:
    holder = _hold_file(str(database))
    conn = _connection(database, lock_timeout=0.1)
    try:
        with pytest.raises(CommitLockTimeout) as info:
            conn.execute("BEGIN IMMEDIATE")
        assert str(info.value) == (
            f"SQLite database {database} stayed locked for 0.1s (commit-lock-timeout);"
            " the transaction can be retried")
    finally:
        holder.rollback()
        holder.close()
        conn.close()


def test_a_writer_locked_out_behind_this_process_says_so_at_its_timeout(
        database: pathlib.Path) -> None:
    """Another writer of this process has the file's turn: the queue is waited on for
    what is left of the timeout, no longer, and the error says the transaction can be
    retried."""
    writers = queue_for(str(database))
    assert writers.acquire(0)
    conn = _connection(database, lock_timeout=0.2)
    try:
        started = time.monotonic()
        with pytest.raises(CommitLockTimeout) as info:
            conn.begin_write()
        waited = time.monotonic() - started
        # The whole wait is the 0.2 s timeout (a second's wait is another bound).
        assert 0.2 <= waited < 0.9, waited
        assert str(info.value) == (
            f"SQLite database {database} stayed locked by another writer for 0.2s"
            " (commit-lock-timeout); the transaction can be retried")
        assert not conn.in_transaction
    finally:
        writers.release()
        conn.close()
    assert not writers.crowded()


def test_a_statement_sqlite_refuses_names_the_file_the_reason_and_the_statement(
        database: pathlib.Path) -> None:
    conn = _connection(database)
    statement = "SELEC data FROM filler"
    with pytest.raises(DatabaseError) as info:
        conn.fetchall(statement)
    assert str(info.value) == (
        f'sqlite3 error on {database}: near "SELEC": syntax error\n'
        f"  statement: {statement}")
    assert info.value.statement == statement
    conn.close()


def test_fetchone_counts_one_statement_and_names_the_one_that_failed(
        database: pathlib.Path) -> None:
    """The connection's own ``fetchone`` (the load by oid's): one statement counted a
    call, on the connection and in its storage's tally, and a refused statement named
    as ``fetchall``'s is."""
    conn = _connection(database)
    conn.tally = StatementTally()
    conn.execute(INSERT, (b"x",))
    before, counted = conn.statements, conn.tally.total
    assert conn.fetchone("SELECT data FROM filler WHERE data = %s", (b"x",)) == (b"x",)
    assert conn.fetchone("SELECT data FROM filler WHERE data = %s", (b"y",)) is None
    assert (conn.statements - before, conn.tally.total - counted) == (2, 2)
    statement = "SELEC data FROM filler"
    with pytest.raises(DatabaseError) as info:
        conn.fetchone(statement)
    assert info.value.statement == statement
    assert str(info.value).endswith(f"  statement: {statement}")
    conn.close()


def test_a_value_the_driver_refuses_is_a_database_error_too(
        database: pathlib.Path) -> None:
    """The driver's own refusals carry no SQLite result code: still a zodbsql error
    naming the file, not an error from the translation."""
    conn = _connection(database)
    with pytest.raises(DatabaseError) as info:
        conn.execute(INSERT, (1 << 70,))
    assert str(info.value) == (
        f"sqlite3 error on {database}: Python int too large to convert to SQLite"
        f" INTEGER\n  statement: {INSERT}")
    assert result_code(OverflowError("no code")) is None
    conn.close()


def test_a_failed_commit_names_commit_and_ends_the_writers_turn(
        database: pathlib.Path) -> None:
    """A COMMIT SQLite refuses (a deferred constraint checked at COMMIT): the error
    names the COMMIT, and the turn of this process's writers ends with it."""
    conn = _connection(database)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
    conn.execute("CREATE TABLE child (parent_id INTEGER REFERENCES parent (id)"
                 " DEFERRABLE INITIALLY DEFERRED)")
    writers = queue_for(str(database))
    assert writers.acquire(0)
    conn._writing = True            # as begin_write leaves it after a queued turn
    conn.execute("BEGIN IMMEDIATE")
    conn.in_transaction = True
    conn.execute("INSERT INTO child (parent_id) VALUES (1)")
    with pytest.raises(DatabaseError) as info:
        conn.commit()
    assert str(info.value) == (
        f"sqlite3 error on {database}: FOREIGN KEY constraint failed\n"
        "  statement: COMMIT")
    assert info.value.statement == "COMMIT"
    assert not writers.crowded()
    conn.raw.execute("ROLLBACK")
    conn.close()
