"""PostgreSQL's session on its own (backends/postgresql/connections.py): the driver it
loads, a statement sent ahead in pipeline mode (its rows, its failure, its trace line),
and a COMMIT of a transaction the server had already failed.  Real sessions of the
shared server, in a schema of their own."""
from __future__ import annotations

import logging
import re
import sys
from typing import Iterator

import psycopg
import pytest

from tests.backends.sessions import TRACE_LOGGER as LOGGER, pooled_session, trace_lines
from tests.databases import BACKENDS, Param, PostgreSQLFactory
from zodbsql.backends.base.trace import Tracer
from zodbsql.backends.postgresql.connections import PostgreSQLConnection, load_driver
from zodbsql.errors import ConfigurationError, DatabaseError, DriverNotFound

pytestmark = pytest.mark.skipif(
    "postgresql" not in BACKENDS,
    reason="postgresql is not in ZODBSQL_TEST_BACKENDS")

@pytest.fixture
def session() -> Iterator[PostgreSQLConnection]:
    """A session of a new storage's pool, traced at DEBUG, given back afterwards."""
    with pooled_session(PostgreSQLFactory(Param("postgresql", True))) as conn:
        assert isinstance(conn, PostgreSQLConnection)
        conn.tracer = Tracer(every=True, slow=None, explain=False, storage="traced")
        yield conn


def took_ms(line: str) -> float:
    found = re.search(r"\] ([0-9.]+) ms", line)
    assert found, line
    return float(found.group(1))


# -- the driver -------------------------------------------------------------------------

def test_an_unknown_driver_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_driver("psycopg2")
    assert str(caught.value) == (
        "postgresql driver must be one of auto, psycopg, psycopg-c, psycopg-binary,"
        " psycopg-python, got 'psycopg2'")


def test_the_driver_s_own_implementation_is_taken() -> None:
    assert load_driver() is psycopg
    assert load_driver("psycopg") is psycopg
    loaded = psycopg.pq.__impl__
    assert load_driver(f"psycopg-{loaded}") is psycopg


def test_another_implementation_than_the_loaded_one_is_named() -> None:
    loaded = psycopg.pq.__impl__
    other = "python" if loaded != "python" else "binary"
    with pytest.raises(DriverNotFound) as caught:
        load_driver(f"psycopg-{other}")
    assert str(caught.value) == (
        f"postgresql driver 'psycopg-{other}' was requested but psycopg loaded its"
        f" {loaded!r} implementation; set PSYCOPG_IMPL={other} before starting Python,"
        " or use driver auto")


def test_a_missing_driver_says_what_was_tried_and_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)    # import psycopg fails
    with pytest.raises(DriverNotFound) as caught:
        load_driver()
    message = str(caught.value)
    assert message.startswith(
        "no PostgreSQL driver could be loaded. Tried psycopg 3 (its C extension"
        " psycopg-c, then the binary wheel psycopg-binary, then pure Python over the"
        " system libpq): ")
    assert "psycopg" in message.split("system libpq): ", 1)[1]
    assert message.endswith(". Install it with: pip install 'psycopg[binary]'")
    assert isinstance(caught.value.__cause__, ImportError)


# -- a statement sent ahead -------------------------------------------------------------

SERIES = "SELECT generate_series(1, %s)"

#: Statements sent ahead need libpq's pipeline mode (libpq 14 and later).
needs_pipeline = pytest.mark.skipif(not psycopg.Pipeline.is_supported(),
                                    reason="this libpq has no pipeline mode")


@needs_pipeline
def test_a_statement_sent_ahead_is_counted_once_and_traced_when_taken(
        session: PostgreSQLConnection, caplog: pytest.LogCaptureFixture) -> None:
    before = session.statements
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        sent = session.send_fetchall(SERIES, [3])
        assert session.read_ahead is sent
        assert session.statements == before + 1
        assert trace_lines(caplog) == []          # traced when its rows come
        assert sent.rows() == [(1,), (2,), (3,)]
        assert sent.rows() == [(1,), (2,), (3,)]  # taken once, kept
    assert session.read_ahead is None and not session.broken
    assert session.statements == before + 1
    [line] = trace_lines(caplog)
    assert line.startswith("traced via ")
    assert line.endswith(": SELECT generate_series(1, %s) (1 parameters)")
    assert " failed" not in line
    assert 0 <= took_ms(line) < 60_000            # timed from its sending


@needs_pipeline
def test_another_statement_takes_the_rows_sent_ahead_first(
        session: PostgreSQLConnection, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        sent = session.send_fetchall(SERIES, [2])
        assert session.fetchone("SELECT 41 + %s", [1]) == (42,)
        assert session.read_ahead is None
        assert sent.rows() == [(1,), (2,)]
    lines = trace_lines(caplog)
    assert [line.rsplit(": ", 1)[1] for line in lines] == [
        "SELECT generate_series(1, %s) (1 parameters)", "SELECT 41 + %s (1 parameters)"]


@needs_pipeline
def test_a_statement_sent_ahead_that_fails_raises_at_its_rows_and_breaks_the_session(
        session: PostgreSQLConnection, caplog: pytest.LogCaptureFixture) -> None:
    # Fails as it runs, after a pause: its error comes after the sending is over.
    bad = "SELECT pg_sleep(0.05), 1 / (%s - 1)"
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        sent = session.send_fetchall(bad, [1])
        with pytest.raises(DatabaseError) as caught:
            sent.rows()
        with pytest.raises(DatabaseError) as again:   # the failure is kept
            sent.rows()
    assert session.broken and session.read_ahead is None
    assert caught.value.statement == bad and again.value.statement == bad
    assert str(caught.value).startswith(f"psycopg error on {session.where}: ")
    assert "division by zero" in str(caught.value).split("\n")[0]
    assert type(caught.value.__cause__).__name__ == "DivisionByZero"
    [line] = trace_lines(caplog)
    assert " failed: DivisionByZero: " in line and line.endswith(f": {bad} (1 parameters)")


@needs_pipeline
def test_a_statement_refused_before_it_is_sent_leaves_the_session_usable(
        session: PostgreSQLConnection, caplog: pytest.LogCaptureFixture) -> None:
    """psycopg refuses a statement whose parameters do not match before sending it:
    the pipeline is left, nothing is waiting, and the session works on."""
    bad = "SELECT %s, %s"
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        with pytest.raises(DatabaseError) as caught:
            session.send_fetchall(bad, [1])
    assert caught.value.statement == bad
    assert "placeholders" in str(caught.value)           # psycopg's own words
    assert session.read_ahead is None and not session.broken
    assert session.fetchone("SELECT 1") == (1,)
    assert session.raw.pgconn.pipeline_status == 0        # PQ_PIPELINE_OFF
    lines = trace_lines(caplog)
    assert " failed: ProgrammingError: " in lines[0]
    assert lines[0].endswith(f": {bad} (1 parameters)")


# -- COMMIT after a failure -------------------------------------------------------------

def test_a_commit_of_a_failed_transaction_is_refused_and_rolled_back(
        session: PostgreSQLConnection) -> None:
    session.begin_write()
    with pytest.raises(DatabaseError):
        session.execute("SELECT * FROM zodbsql_no_such_table")
    assert session.in_transaction
    before = session.statements
    with pytest.raises(DatabaseError) as caught:
        session.commit()
    assert str(caught.value) == (
        f"{session.where}: the transaction had failed and was rolled back\n"
        "  statement: COMMIT")
    assert session.statements == before + 1
    assert not session.in_transaction and not session.broken
    from psycopg.pq import TransactionStatus
    assert session.raw.pgconn.transaction_status == TransactionStatus.IDLE
    assert session.fetchone("SELECT 1") == (1,)


# -- errors, word for word --------------------------------------------------------------

def _translated(session: PostgreSQLConnection, state: str) -> Exception:
    return session.translate_error(psycopg.errors.lookup(state)("the server says no"),
                                   "SELECT 1")


def test_each_error_says_what_happened_where_and_that_it_can_be_retried(
        session: PostgreSQLConnection) -> None:
    where = session.where
    assert where.startswith("PostgreSQL database test at 127.0.0.1:5432")
    lost = _translated(session, "57P01")
    assert (str(lost), lost.statement) == (  # type: ignore[attr-defined]
        f"the connection to {where} was lost (the server says no); the transaction can"
        " be retried\n  statement: SELECT 1", "SELECT 1")
    timeout = _translated(session, "55P03")
    assert str(timeout) == (
        f"a lock on {where} was not granted within {session.lock_timeout:g}s"
        " (commit-lock-timeout; PostgreSQL lock_timeout): the server says no. The"
        " transaction can be retried")
    deadlock = _translated(session, "40P01")
    assert str(deadlock) == (
        f"{where} detected a deadlock and cancelled this transaction (the server says"
        " no); it can be retried")
    serialization = _translated(session, "40001")
    assert str(serialization) == (
        f"{where} cancelled this transaction on a serialization failure (the server"
        " says no); it can be retried")
    other = _translated(session, "42P01")
    assert (str(other), other.statement) == (  # type: ignore[attr-defined]
        f"psycopg error on {where}: the server says no\n  statement: SELECT 1",
        "SELECT 1")


def test_a_statement_on_a_closed_session_is_a_lost_connection(
        session: PostgreSQLConnection) -> None:
    """Closed by the client (a pool's close, a fork's cleanup): psycopg says so with an
    OperationalError and no SQLSTATE, and the session counts as lost, never broken
    data."""
    from zodbsql.errors import ConnectionLost
    session.raw.close()
    assert session.raw.closed and not session.raw.broken
    with pytest.raises(ConnectionLost) as caught:
        session.fetchone("SELECT 1")
    assert str(caught.value).startswith(f"the connection to {session.where} was lost (")
    assert session.broken


def test_a_server_error_with_a_code_psycopg_has_no_class_for_keeps_its_code(
        session: PostgreSQLConnection) -> None:
    """An SQLSTATE of class 08 (connection exception) psycopg does not know still
    reads as a lost connection."""
    from zodbsql.errors import ConnectionLost
    with pytest.raises(ConnectionLost):
        session.execute("DO $$ BEGIN RAISE EXCEPTION 'gone elsewhere'"
                        " USING ERRCODE = '08Z99'; END $$")


# -- slow statements and their plans ----------------------------------------------------

PLANNED = "SELECT count(*) FROM generate_series(1, %s)"


def test_a_slow_statement_is_logged_with_the_server_s_plan(
        session: PostgreSQLConnection, caplog: pytest.LogCaptureFixture) -> None:
    """Every statement is slow at 0 s: its warning carries the plan the server gives
    for it with its values (EXPLAIN needs their types, so they go inline), and
    asking for the plan is counted as a statement of its own."""
    session.tracer = Tracer(every=False, slow=0.0, explain=True, storage="traced")
    before = session.statements
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert session.fetchone(PLANNED, [5]) == (5,)
    assert session.statements == before + 2
    [record] = [r for r in caplog.records if r.name == LOGGER]
    text = record.getMessage()
    assert text.startswith("slow statement (over 0 s): traced via ")
    assert f": {PLANNED} (1 parameters)\n    " in text
    plan = text.split("\n")[1:]
    assert plan and all(line.startswith("    ") for line in plan)
    assert any("Aggregate" in line for line in plan), plan
    assert any("generate_series" in line for line in plan), plan


def test_a_plan_asked_inside_a_transaction_leaves_it_as_it_was(
        session: PostgreSQLConnection, caplog: pytest.LogCaptureFixture) -> None:
    """Inside a transaction the plan is asked under a savepoint, released after: the
    transaction goes on with what it wrote, and ends as it would have."""
    session.execute("CREATE TEMPORARY TABLE planned (n int)")
    session.begin_write()
    session.tracer = Tracer(every=False, slow=0.0, explain=True, storage="traced")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        session.execute("INSERT INTO planned VALUES (%s)", [7])
        assert session.fetchone("SELECT n FROM planned WHERE n = %s", [7]) == (7,)
    plans = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(plans) == 2 and all("\n    " in text and "(no plan" not in text
                                   for text in plans), plans
    from psycopg.pq import TransactionStatus
    assert session.raw.pgconn.transaction_status == TransactionStatus.INTRANS
    session.commit()
    session.tracer = None
    assert session.fetchall("SELECT n FROM planned") == [(7,)]
    # A savepoint still open would have been an error at RELEASE or a nested level
    # left behind: the session is idle.
    assert session.raw.pgconn.transaction_status == TransactionStatus.IDLE


def test_a_query_of_several_statements_that_fails_is_named_as_shown(
        session: PostgreSQLConnection, caplog: pytest.LogCaptureFixture) -> None:
    """``simple_query`` sends values inline: its error and its trace line name the
    statement as the caller shows it, with placeholders, never the text sent."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        with pytest.raises(DatabaseError) as caught:
            session.simple_query("SELECT 1; SELECT 1 / 0", "SELECT 1; SELECT 1 / %s", 1,
                                 last=True)
        assert session.simple_query("SELECT 1; SELECT 2", "two", 0, last=True) == [(2,)]
        assert session.simple_query("SELECT 1; SELECT 2", "two", 0, last=False) == [(1,)]
    assert caught.value.statement == "SELECT 1; SELECT 1 / %s"
    assert not session.in_transaction
    failed, *done = trace_lines(caplog)
    assert " failed: DivisionByZero: " in failed
    assert failed.endswith(": SELECT 1; SELECT 1 / %s (1 parameters)")
    assert [line.rsplit(": ", 1)[1] for line in done] == ["two (0 parameters)"] * 2


def test_a_commit_is_traced_as_commit(session: PostgreSQLConnection,
                                      caplog: pytest.LogCaptureFixture) -> None:
    session.begin_write()
    assert session.in_transaction
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        session.commit()
        session.commit()                      # nothing open: nothing sent
    assert not session.in_transaction
    [line] = trace_lines(caplog)
    assert line.endswith(": COMMIT (0 parameters)") and " failed" not in line
