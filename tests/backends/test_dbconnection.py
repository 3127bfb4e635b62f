"""The DB-API session every driver's connection builds on (backends/base/connections.py).

SQLite's and MySQL's connections are this class with a few calls specialised; here it is
the plain class over a real ``sqlite3`` connection (the embedded database, no server),
so that what it promises every driver is checked on its own: each statement counted on
the session and its storage's tally, its rows and changed-row counts, the driver's
error translated with the statement that failed (a lost connection marking the session
broken), each statement traced once with how it ended, COMMIT and ROLLBACK, and the
pool of commit connections.
"""
from __future__ import annotations

import logging
import pathlib
import sqlite3
import threading
from typing import Any

import pytest

from tests.backends.sessions import TRACE_LOGGER, trace_lines
from zodbsql.backends.base.connections import ConnectionPool, DBConnection, StatementTally
from zodbsql.backends.base.trace import Tracer
from zodbsql.errors import ConnectionLost, DatabaseError


class Session(DBConnection):
    """The base session, its SQL's ``%s`` converted to sqlite3's ``?``; a driver error
    whose words say "gone" translates to a lost connection."""

    driver_name = "plain"

    def __init__(self, raw: Any) -> None:
        super().__init__(raw)
        self.converted: list[str] = []

    def convert_sql(self, sql: str) -> str:
        self.converted.append(sql)
        return sql.replace("%s", "?")

    def translate_error(self, exc: Exception, sql: str | None) -> Exception:
        if "gone" in str(exc):
            return ConnectionLost(f"lost: {exc}", sql)
        return super().translate_error(exc, sql)


@pytest.fixture
def path(tmp_path: pathlib.Path) -> pathlib.Path:
    database = tmp_path / "session.sqlite"
    raw = sqlite3.connect(database)
    raw.executescript(
        "CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT);"
        "CREATE TABLE child (id INTEGER PRIMARY KEY,"
        " item INTEGER REFERENCES item (id) DEFERRABLE INITIALLY DEFERRED);")
    raw.close()
    return database


def open_session(path: pathlib.Path) -> Session:
    return Session(sqlite3.connect(path, isolation_level=None, check_same_thread=False))


def names(path: pathlib.Path) -> list[str]:
    raw = sqlite3.connect(path)
    try:
        return [row[0] for row in raw.execute("SELECT name FROM item ORDER BY id")]
    finally:
        raw.close()


def test_each_statement_is_counted_on_the_session_and_on_its_tally(path):
    session = open_session(path)
    tally = StatementTally()
    assert tally.total == 0
    session.tally = tally
    assert not session.in_transaction and not session.broken
    session.rollback()                      # a new session has no transaction to end
    assert (session.statements, tally.total) == (0, 0)
    session.begin_write()
    session.executemany("INSERT INTO item (name) VALUES (%s)", [("a",), ("b",)])
    session.execute("UPDATE item SET name = %s WHERE name = %s", ("c", "b"))
    session.fetchall("SELECT name FROM item")
    session.fetchone("SELECT name FROM item WHERE id = %s", (1,))
    session.execute_script("SELECT 1")
    session.commit()
    assert (session.statements, tally.total) == (7, 7)
    session.rollback()                      # no transaction: nothing sent
    assert (session.statements, tally.total) == (7, 7)
    session.begin_read()
    session.rollback()
    assert (session.statements, tally.total) == (9, 9)
    session.statements = 0                  # the session's count restarts ...
    assert (session.statements, tally.total) == (0, 9)
    session.statements = 4                  # ... and what it grows by is added
    assert (session.statements, tally.total) == (4, 13)


def test_results_and_changed_rows_come_as_the_driver_gives_them(path):
    session = open_session(path)
    session.executemany("INSERT INTO item (name) VALUES (%s)", [("a",), ("b",), ("c",)])
    assert session.execute("UPDATE item SET name = name || %s WHERE id > %s", ("!", 1)) == 2
    expected = [(1, "a"), (2, "b!"), (3, "c!")]
    query = "SELECT id, name FROM item WHERE id >= %s ORDER BY id"
    assert session.fetchall(query, (1,)) == expected
    assert session.fetchall(query, (1,), binary=True) == expected
    assert session.fetchall(query, (1,), prepare=True) == expected
    assert session.fetchone(query, (2,)) == (2, "b!")
    assert session.fetchone(query, (9,)) is None
    assert session.execute("DELETE FROM item WHERE id = %s", (9,)) == 0
    # Each statement's text is converted once, then taken from the session's memo.
    assert sorted(session.converted) == sorted(set(session.converted))
    assert query in session.converted


def test_a_transaction_begun_is_committed_or_rolled_back(path):
    session = open_session(path)
    session.begin_write()
    assert session.in_transaction
    session.execute("INSERT INTO item (name) VALUES (%s)", ("kept",))
    session.commit()
    assert not session.in_transaction
    assert names(path) == ["kept"]
    session.begin_read()
    assert session.in_transaction
    session.execute("INSERT INTO item (name) VALUES (%s)", ("dropped",))
    session.rollback()
    assert not session.in_transaction and not session.broken
    assert names(path) == ["kept"]


@pytest.mark.parametrize("call", ["execute", "executemany", "fetchall", "fetchone",
                                  "execute_script"])
def test_a_failing_statement_is_raised_with_its_words_and_its_statement(path, call):
    session = open_session(path)
    sql = "INSERT INTO nowhere (name) VALUES ('x')"
    run = {"execute": lambda: session.execute(sql),
           "executemany": lambda: session.executemany(sql, [()]),
           "fetchall": lambda: session.fetchall(sql),
           "fetchone": lambda: session.fetchone(sql),
           "execute_script": lambda: session.execute_script(sql)}[call]
    with pytest.raises(DatabaseError) as raised:
        run()
    error = raised.value
    assert type(error) is DatabaseError
    assert str(error) == f"plain: no such table: nowhere\n  statement: {sql}"
    assert error.statement == sql
    assert isinstance(error.__cause__, sqlite3.OperationalError)
    assert not session.broken
    assert session.statements == 1


def test_a_script_is_reported_as_what_it_is_shown_as(path):
    session = open_session(path)
    with pytest.raises(DatabaseError) as raised:
        session.execute_script("INSERT INTO nowhere VALUES ('secret')", shown="the setup")
    assert raised.value.statement == "the setup"
    assert "secret" not in str(raised.value)


def test_a_lost_connection_marks_the_session_broken(path):
    session = open_session(path)
    with pytest.raises(ConnectionLost) as raised:
        session.execute("SELECT 'gone' FROM nowhere_gone")
    assert str(raised.value).startswith("lost: no such table: nowhere_gone")
    assert isinstance(raised.value.__cause__, sqlite3.OperationalError)
    assert session.broken


def test_a_failed_commit_is_raised_and_ends_the_transaction(path):
    session = open_session(path)
    session.execute("PRAGMA foreign_keys = ON")
    session.begin_write()
    session.execute("INSERT INTO child (item) VALUES (%s)", (42,))   # checked at COMMIT
    with pytest.raises(DatabaseError) as raised:
        session.commit()
    assert raised.value.statement == "COMMIT"
    assert "FOREIGN KEY constraint failed" in str(raised.value)
    assert isinstance(raised.value.__cause__, sqlite3.IntegrityError)
    assert not session.in_transaction
    assert session.statements == 4


def test_a_rollback_on_a_gone_connection_marks_it_broken_without_raising(path):
    session = open_session(path)
    session.begin_write()
    session.raw.close()
    session.rollback()
    assert session.broken and not session.in_transaction
    assert session.statements == 2
    session.close()                 # closing a closed connection raises nothing either


def test_a_statement_sent_ahead_is_settled_before_any_other(path):
    session = open_session(path)
    settled: list[int] = []

    class Ahead:
        def settle(self) -> None:
            settled.append(session.statements)
    session.read_ahead = Ahead()
    session.execute("SELECT 1")
    session.executemany("INSERT INTO item (name) VALUES (%s)", [("a",)])
    session.fetchall("SELECT 1")
    session.fetchone("SELECT 1")
    session.execute_script("SELECT 1")
    # Each before its own statement was counted: settling comes first.
    assert settled == [0, 1, 2, 3, 4]


@pytest.fixture
def traced(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger=TRACE_LOGGER)
    return caplog


def test_every_statement_is_traced_once_with_how_it_ended(path, traced):
    session = open_session(path)
    session.tracer = Tracer(every=True, slow=None, explain=False, storage="site")
    session.where = "the file"
    session.begin_write()
    session.executemany("INSERT INTO item (name) VALUES (%s)", [("a",)])
    session.execute("UPDATE item SET name = %s WHERE id = %s", ("a", 1))
    session.fetchall("SELECT name FROM item WHERE id = %s", (1,))
    session.fetchone("SELECT name FROM item WHERE id = %s AND name = %s", (1, "a"))
    session.execute_script("SELECT 'value'", shown="a script")
    session.commit()
    session.begin_read()
    session.rollback()
    with pytest.raises(DatabaseError):
        session.fetchone("SELECT * FROM nowhere WHERE id = %s", (1,))
    with pytest.raises(DatabaseError):
        session.executemany("INSERT INTO nowhere VALUES (%s)", [(1,)])
    with pytest.raises(DatabaseError):
        session.fetchall("SELECT * FROM nowhere WHERE id > %s AND id < %s", (1, 2))
    with pytest.raises(DatabaseError):
        session.execute("DELETE FROM nowhere WHERE id = %s", (1,))
    shown = trace_lines(traced)
    assert len(shown) == 13, shown
    assert all(line.startswith("site via the file [") for line in shown)
    # Each timed from its own start: milliseconds, not the process's age.
    took = [float(line.split("] ", 1)[1].split(" ms", 1)[0]) for line in shown]
    assert all(0 <= each < 5000 for each in took), took
    tails = [line.split(": ", 1)[1] if "failed" not in line else line.split(" ms ", 1)[1]
             for line in shown]
    assert tails == [
        "BEGIN (0 parameters)",
        "INSERT INTO item (name) VALUES (%s) (0 parameters)",
        "UPDATE item SET name = %s WHERE id = %s (2 parameters)",
        "SELECT name FROM item WHERE id = %s (1 parameters)",
        "SELECT name FROM item WHERE id = %s AND name = %s (2 parameters)",
        "a script (0 parameters)",
        "COMMIT (0 parameters)",
        "BEGIN (0 parameters)",
        "ROLLBACK (0 parameters)",
        "failed: OperationalError: SELECT * FROM nowhere WHERE id = %s (1 parameters)",
        "failed: OperationalError: INSERT INTO nowhere VALUES (%s) (0 parameters)",
        "failed: OperationalError: SELECT * FROM nowhere WHERE id > %s AND id < %s"
        " (2 parameters)",
        "failed: OperationalError: DELETE FROM nowhere WHERE id = %s (1 parameters)"]


def test_a_failed_commit_is_traced_as_failed(path, traced):
    session = open_session(path)
    session.execute("PRAGMA foreign_keys = ON")
    session.tracer = Tracer(every=True, slow=None, explain=False, storage="site")
    session.begin_write()
    session.execute("INSERT INTO child (item) VALUES (%s)", (42,))
    with pytest.raises(DatabaseError):
        session.commit()
    assert trace_lines(traced)[-1].endswith("failed: IntegrityError: COMMIT (0 parameters)")
    # Without a place of its own, a session is named by its driver.
    assert trace_lines(traced)[-1].startswith("site via plain [")


def test_a_slow_statement_is_logged_with_its_plan(path, traced):
    session = open_session(path)
    session.tracer = Tracer(every=False, slow=0.0, explain=True, storage="site")
    session.where = "site"
    rows = session.fetchall("SELECT name FROM item WHERE id = %s", (1,))
    assert rows == []
    [line] = trace_lines(traced)
    head, *plan = line.split("\n    ")
    assert head.startswith("slow statement (over 0 s): site [")
    assert head.endswith(": SELECT name FROM item WHERE id = %s (1 parameters)")
    # The plan is the driver's EXPLAIN of the statement with its parameters, a line a
    # row, each row's values joined; asking for it is counted.
    raw = sqlite3.connect(path)
    expected = [" | ".join(str(value) for value in row) for row in
                raw.execute("EXPLAIN SELECT name FROM item WHERE id = ?", (1,))]
    raw.close()
    assert plan == expected and len(plan) > 3
    assert session.statements == 2


def test_the_pool_hands_out_at_most_its_size_and_reuses_what_comes_back(path):
    opened: list[Session] = []

    def open_one() -> Session:
        opened.append(open_session(path))
        return opened[-1]
    pool = ConnectionPool(open_one, 2)
    assert (pool.max_size, pool.in_use) == (2, 0)
    first, second = pool.acquire(), pool.acquire()
    assert (len(opened), pool.in_use) == (2, 2)
    with pytest.raises(DatabaseError) as raised:
        pool.acquire(timeout=0.05)
    assert str(raised.value) == ("all 2 pooled connections stayed busy for 0.05s"
                                 " (raise the pool size or find the long commits)")
    first.begin_write()
    first.execute("INSERT INTO item (name) VALUES (%s)", ("left over",))
    pool.release(first)                     # rolled back on its way in
    assert pool.in_use == 1 and not first.in_transaction
    assert names(path) == []
    assert pool.acquire(timeout=0.05) is first
    # A broken connection is closed, not handed out again.
    second.broken = True
    pool.release(second)
    with pytest.raises(sqlite3.ProgrammingError):
        second.raw.execute("SELECT 1")
    third = pool.acquire(timeout=0.05)
    assert third is not second and len(opened) == 3
    pool.release(first)
    pool.release(third)
    assert pool.in_use == 0
    pool.close()
    for each in (first, third):
        with pytest.raises(sqlite3.ProgrammingError):
            each.raw.execute("SELECT 1")


def test_the_pool_waits_without_a_timeout_until_one_comes_back(path):
    pool = ConnectionPool(lambda: open_session(path), 1)
    held = pool.acquire()
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and got == []
    pool.release(held)
    waiter.join(5)
    assert got == [held]
    pool.release(held)
    pool.close()


def test_a_connection_the_pool_could_not_open_frees_its_slot(path):
    attempts: list[int] = []

    def open_or_fail() -> Session:
        attempts.append(1)
        if len(attempts) == 1:
            raise DatabaseError("the server said no")
        return open_session(path)
    pool = ConnectionPool(open_or_fail, 1)
    with pytest.raises(DatabaseError, match="the server said no"):
        pool.acquire(timeout=0.05)
    assert pool.in_use == 0
    conn = pool.acquire(timeout=0.05)     # the slot was given back
    pool.release(conn)
    pool.close()
