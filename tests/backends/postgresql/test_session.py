"""PostgreSQL's session on its own (backends/postgresql/connections.py): the driver it
loads, a statement sent ahead in pipeline mode (its rows, its failure, its trace line),
and a COMMIT of a transaction the server had already failed.  Real sessions of the
shared server, in a schema of their own."""
from __future__ import annotations

import logging
import re
import sys
from typing import Iterator

import pytest

from tests.databases import BACKENDS, Param, PostgreSQLFactory
from zodbsql.backends.base.trace import Tracer
from zodbsql.backends.postgresql.connections import PostgreSQLConnection, load_driver
from zodbsql.errors import ConfigurationError, DatabaseError, DriverNotFound

pytestmark = pytest.mark.skipif(
    "postgresql" not in BACKENDS,
    reason="postgresql is not in ZODBSQL_TEST_BACKENDS")

LOGGER = "zodbsql.sql"


@pytest.fixture
def session() -> Iterator[PostgreSQLConnection]:
    """A session of a new storage's pool, traced at DEBUG, given back afterwards."""
    factory = PostgreSQLFactory(Param("postgresql", True))
    try:
        storage = factory.open()
        pool = storage.shared.pool
        conn = pool.acquire()
        assert isinstance(conn, PostgreSQLConnection)
        conn.tracer = Tracer(every=True, slow=None, explain=False, storage="traced")
        try:
            yield conn
        finally:
            conn.tracer = None
            if conn.broken:
                conn.close()
            else:
                pool.release(conn)
    finally:
        factory.cleanup()


def trace_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


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
    import psycopg
    assert load_driver() is psycopg
    assert load_driver("psycopg") is psycopg
    loaded = psycopg.pq.__impl__
    assert load_driver(f"psycopg-{loaded}") is psycopg


def test_another_implementation_than_the_loaded_one_is_named() -> None:
    import psycopg
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


def test_a_statement_sent_ahead_is_counted_once_and_traced_when_taken(
        session: PostgreSQLConnection, caplog: pytest.LogCaptureFixture) -> None:
    if not session.sends_ahead():
        pytest.skip("this libpq has no pipeline mode")
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


def test_another_statement_takes_the_rows_sent_ahead_first(
        session: PostgreSQLConnection, caplog: pytest.LogCaptureFixture) -> None:
    if not session.sends_ahead():
        pytest.skip("this libpq has no pipeline mode")
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        sent = session.send_fetchall(SERIES, [2])
        assert session.fetchone("SELECT 41 + %s", [1]) == (42,)
        assert session.read_ahead is None
        assert sent.rows() == [(1,), (2,)]
    lines = trace_lines(caplog)
    assert [line.rsplit(": ", 1)[1] for line in lines] == [
        "SELECT generate_series(1, %s) (1 parameters)", "SELECT 41 + %s (1 parameters)"]


def test_a_statement_sent_ahead_that_fails_raises_at_its_rows_and_breaks_the_session(
        session: PostgreSQLConnection, caplog: pytest.LogCaptureFixture) -> None:
    if not session.sends_ahead():
        pytest.skip("this libpq has no pipeline mode")
    bad = "SELECT * FROM zodbsql_no_such_table WHERE 1 = %s"
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        sent = session.send_fetchall(bad, [1])
        with pytest.raises(DatabaseError) as caught:
            sent.rows()
        with pytest.raises(DatabaseError) as again:   # the failure is kept
            sent.rows()
    assert session.broken and session.read_ahead is None
    assert caught.value.statement == bad and again.value.statement == bad
    assert str(caught.value).startswith(f"psycopg error on {session.where}: ")
    assert "zodbsql_no_such_table" in str(caught.value).split("\n")[0]
    assert type(caught.value.__cause__).__name__ == "UndefinedTable"
    [line] = trace_lines(caplog)
    assert " failed: UndefinedTable: " in line and line.endswith(f": {bad} (1 parameters)")


def test_a_statement_refused_before_it_is_sent_leaves_the_session_usable(
        session: PostgreSQLConnection, caplog: pytest.LogCaptureFixture) -> None:
    """psycopg refuses a statement whose parameters do not match before sending it:
    the pipeline is left, nothing is waiting, and the session works on."""
    if not session.sends_ahead():
        pytest.skip("this libpq has no pipeline mode")
    bad = "SELECT %s, %s"
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        with pytest.raises(DatabaseError) as caught:
            session.send_fetchall(bad, [1])
    assert caught.value.statement == bad
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
