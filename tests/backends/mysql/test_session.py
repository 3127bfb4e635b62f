"""MySQL's session on its own (backends/mysql/connections.py): each server error number
told as what it is, word for word (a lost connection, a lock wait, a deadlock, a Galera
certification failure or a node not ready, a packet too large), session settings sent
only when they change, statements without parameters sent literally, LAST_INSERT_ID
read from the reply, and the Galera probe.  Real sessions of the shared server, with
each driver installed, in a database of their own."""
from __future__ import annotations

import importlib
import logging
import ssl
import sys
from typing import Any, Iterator

import pytest

from tests.backends.mysql.test_mysql import DRIVERS_PRESENT
from tests.backends.sessions import TRACE_LOGGER, pooled_session, trace_lines
from tests.databases import BACKENDS, MySQLFactory, Param
from zodbsql.backends.base.trace import Tracer
from zodbsql.backends.mysql.connections import (CAUSAL_READ, DRIVERS, MySQLConnection,
                                                error_number, is_galera, load_driver,
                                                pymysql_connection_class)
from zodbsql.errors import (CommitLockTimeout, ConnectionLost, DatabaseConflict,
                            DatabaseError, DeadlockError, DriverNotFound)

pytestmark = pytest.mark.skipif(
    "mysql" not in BACKENDS, reason="mysql is not in ZODBSQL_TEST_BACKENDS")


@pytest.fixture(params=DRIVERS_PRESENT)
def session(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[MySQLConnection]:
    """A commit session of a new storage's pool, given back afterwards."""
    with pooled_session(MySQLFactory(Param("mysql", True), tmp_path,
                                     driver=request.param)) as conn:
        assert isinstance(conn, MySQLConnection)
        yield conn


def told(session: MySQLConnection, number: int) -> Exception:
    return session.translate_error(session.module.OperationalError(number, "server says no"),
                                   "SELECT 1")


def test_each_error_number_is_told_word_for_word(session):
    where, cause = session.where, "(%d, 'server says no')"
    assert where and session.lock_timeout is not None
    lost = (f"the connection to {where} was lost ({cause});"
            " the transaction can be retried\n  statement: SELECT 1")
    waited = (f"a row or commit lock on {where} was not granted within"
              f" {session.lock_timeout}s (commit-lock-timeout, applied as the session's"
              " innodb_lock_wait_timeout); the transaction can be retried")
    too_large = (f"a statement to {where} was larger than the server's max_allowed_packet"
                 f" ({session.max_allowed_packet} bytes): {cause}. Raise"
                 " max_allowed_packet on the server\n  statement: SELECT 1")
    expected = {**dict.fromkeys((2006, 2013, 2055, 1927, 4031), (ConnectionLost, lost)),
                **dict.fromkeys((1205, 3572), (CommitLockTimeout, waited)),
                **dict.fromkeys((1153, 1301, 2020), (DatabaseError, too_large))}
    for number, (kind, words) in expected.items():
        error = told(session, number)
        assert type(error) is kind, number
        assert str(error) == (words % number if "%d" in words else words)
    error = told(session, 1213)
    assert type(error) is DeadlockError
    assert str(error) == (f"InnoDB deadlock on {where}; the transaction was rolled back"
                          f" and can be retried ({cause % 1213})")
    assert session.max_allowed_packet > 0
    # A node that is not ready is only Galera's answer; elsewhere an error like others.
    for number in (1047, 1146):
        error = told(session, number)
        assert type(error) is DatabaseError
        assert session.driver_name in {name for name, _ in DRIVERS}
        assert str(error) == (f"{session.driver_name} error on {where}: {cause % number}"
                              "\n  statement: SELECT 1")
    # The driver's interface errors (a closed connection) say the session is gone.
    gone = session.translate_error(session.module.InterfaceError(0, ""), "SELECT 2")
    assert type(gone) is ConnectionLost and gone.statement == "SELECT 2"


def test_a_galera_node_tells_certification_failures_and_unready_nodes(session):
    session.galera = True
    where, cause = session.where, "(%d, 'server says no')"
    error = told(session, 1213)
    assert type(error) is DatabaseConflict
    assert str(error) == (
        f"Galera rolled this transaction back on {where}: a transaction committed on"
        " another node changed the same rows first (certification failure or"
        f" brute-force abort); it can be retried ({cause % 1213})")
    error = told(session, 1047)
    assert type(error) is ConnectionLost
    assert str(error) == (
        f"the Galera node {where} is not ready for queries (joining, donating or outside"
        f" the primary component: {cause % 1047}); the transaction can be retried, on"
        " this node once it has synced or on another\n  statement: SELECT 1")


def test_an_unknown_lock_timeout_is_said_as_unknown(session):
    session.lock_timeout = None
    assert "within ?s (commit-lock-timeout" in str(told(session, 1205))


def test_error_numbers_are_read_from_the_first_argument_only_when_a_number():
    assert error_number(ValueError(1205, "x")) == 1205
    assert error_number(ValueError("1205")) is None
    assert error_number(ValueError()) is None


def test_session_settings_are_sent_only_when_they_change(session):
    session.set_isolation("REPEATABLE READ")
    session.set_lock_timeout(7.4)
    sent = session.statements
    session.set_isolation("REPEATABLE READ")
    session.set_lock_timeout(6.6)           # 7 seconds either way: nothing sent
    assert session.statements == sent
    assert session.fetchone("SELECT @@SESSION.innodb_lock_wait_timeout") == (7,)
    session.set_lock_timeout(0.2)            # at least a second
    assert session.lock_timeout == 1
    assert session.fetchone("SELECT @@SESSION.innodb_lock_wait_timeout") == (1,)
    session.set_isolation("READ COMMITTED")
    assert session.isolation == "READ COMMITTED"
    assert session.fetchone("SELECT @@SESSION.tx_isolation") == ("READ-COMMITTED",)


def test_a_statement_without_parameters_is_sent_as_written(session):
    # The format paramstyle would read "%" as a placeholder if handed any parameters.
    assert session.fetchone("SELECT '100%'") == ("100%",)
    assert session.fetchall("SELECT '100%' UNION ALL SELECT '5%'") == [("100%",), ("5%",)]
    assert session.execute("DO '100%'") == 0
    assert session.fetchone("SELECT %s", ("50%",)) == ("50%",)


def test_a_read_transaction_is_one_snapshot_begun_as_the_causal_setting_says(session,
                                                                             caplog):
    session.begin_read()
    assert session.in_transaction
    assert session.fetchone("SELECT @@in_transaction") == (1,)
    with pytest.raises(DatabaseError, match="READ ONLY"):
        session.execute("UPDATE commit_row SET last_tid = last_tid")
    session.rollback()
    caplog.set_level(logging.DEBUG, logger=TRACE_LOGGER)
    session.tracer = Tracer(every=True, slow=None, explain=False, storage="s")
    session.causal = "/* causal */ "
    session.begin_read()
    lines = trace_lines(caplog)
    assert lines[-1].endswith(": /* causal */ START TRANSACTION WITH CONSISTENT SNAPSHOT,"
                              " READ ONLY (0 parameters)")
    session.rollback()
    session.begin_write()
    assert session.in_transaction
    assert session.execute("UPDATE commit_row SET last_tid = last_tid") in (0, 1)
    session.rollback()
    assert CAUSAL_READ.endswith("FOR ")


def test_last_insert_id_comes_from_the_reply_counted_and_traced(session, caplog):
    session.execute("CREATE TEMPORARY TABLE t_ids (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
                    " v INT)")
    caplog.set_level(logging.DEBUG, logger=TRACE_LOGGER)
    session.tracer = Tracer(every=True, slow=None, explain=False, storage="s")
    sent = session.statements
    assert session.execute_insert_id("INSERT INTO t_ids (v) VALUES (%s)", (5,)) == 1
    assert session.execute_insert_id(
        "UPDATE t_ids SET id = LAST_INSERT_ID(id + 40) WHERE v = %s", (5,)) == 41
    assert session.statements == sent + 2
    lines = trace_lines(caplog)
    assert [line.split(": ", 1)[1] for line in lines] == [
        "INSERT INTO t_ids (v) VALUES (%s) (0 parameters)",
        "UPDATE t_ids SET id = LAST_INSERT_ID(id + 40) WHERE v = %s (0 parameters)"]
    with pytest.raises(DatabaseError) as raised:
        session.execute_insert_id("INSERT INTO t_nowhere (v) VALUES (%s)", (1,))
    assert raised.value.statement == "INSERT INTO t_nowhere (v) VALUES (%s)"
    assert "t_nowhere' doesn't exist" in str(raised.value).split("\n")[0]
    assert not session.broken


def test_a_companion_session_is_closed_with_its_session(session, tmp_path):
    factory = MySQLFactory(Param("mysql", True), tmp_path, driver=session.driver_name)
    try:
        other = factory.open().shared.pool.acquire()
        assert isinstance(other, MySQLConnection)
        session.companion = other
        session.close()
        assert session.companion is None
        with pytest.raises(DatabaseError):
            other.fetchone("SELECT 1")
        session.broken = True          # closed: the fixture must not hand it back
    finally:
        factory.cleanup()


@pytest.mark.parametrize("rows,galera", [
    ([("wsrep_on", "ON"), ("wsrep_provider", "/usr/lib/galera/libgalera_smm.so")], True),
    ([("WSREP_ON", "on"), ("WSREP_PROVIDER", " libgalera.so ")], True),
    ([("wsrep_on", "OFF"), ("wsrep_provider", "/usr/lib/galera/libgalera_smm.so")], False),
    ([("wsrep_on", "ON"), ("wsrep_provider", "none")], False),
    ([("wsrep_on", "ON"), ("wsrep_provider", " ")], False),
    ([("wsrep_on", "ON")], False),
    ([], False),
])
def test_galera_is_on_only_with_wsrep_on_and_a_provider(rows, galera):
    assert is_galera(rows) is galera


# -- the driver -------------------------------------------------------------------------
def test_each_driver_is_chosen_by_its_own_name():
    modules = dict(DRIVERS)
    for name in DRIVERS_PRESENT:
        assert load_driver(name) == (name, importlib.import_module(modules[name]))
    assert load_driver("auto")[0] == DRIVERS_PRESENT[0]  # the first installed, in order
    with pytest.raises(DriverNotFound) as raised:
        load_driver("MySQLdb")                           # a module's name is no choice
    assert str(raised.value) == (
        "unknown MySQL driver 'MySQLdb': expected auto, mysqlclient or pymysql")


def test_no_driver_found_says_what_was_tried_and_how_to_install_one(monkeypatch):
    monkeypatch.setitem(sys.modules, "MySQLdb", None)
    monkeypatch.setitem(sys.modules, "pymysql", None)
    with pytest.raises(DriverNotFound) as raised:
        load_driver("auto")
    assert str(raised.value) == (
        "no MySQL driver could be loaded; tried mysqlclient (import MySQLdb): import of"
        " MySQLdb halted; None in sys.modules; pymysql (import pymysql): import of"
        " pymysql halted; None in sys.modules. Install PyMySQL (pip install PyMySQL) or"
        " mysqlclient (pip install 'zodbsql[mysql]', which needs the MySQL client"
        " headers)")


def test_pymysql_sessions_share_one_default_tls_context(tmp_path):
    """PyMySQL builds a TLS context for every connection it may use TLS on (about 20 ms
    each, the system's CA store loaded): without TLS options, one is built for all."""
    import pymysql  # type: ignore[import-untyped]
    factory = MySQLFactory(Param("mysql", True), tmp_path, driver="pymysql")
    try:
        storage = factory.open()
        first, second = storage.shared.pool.acquire(), storage.shared.pool.acquire()
        assert isinstance(first.raw, pymysql.connections.Connection)
        assert isinstance(first.raw.ctx, ssl.SSLContext) and first.raw.ctx is second.raw.ctx
        assert type(first.raw) is type(second.raw) is pymysql_connection_class(pymysql)
        # Explicit TLS options still get a context of their own.
        bare = type(first.raw).__new__(type(first.raw))
        own = bare._create_ssl_ctx({"check_hostname": False, "verify_mode": False})
        assert isinstance(own, ssl.SSLContext) and own is not first.raw.ctx
        assert bare._create_ssl_ctx({}) is first.raw.ctx
        storage.shared.pool.release(first)
        storage.shared.pool.release(second)
    finally:
        factory.cleanup()


def test_a_session_made_on_its_own_is_a_plain_servers(session):
    """What a session is before the backend's connect sets it up for the primary (a
    standby's session stays so): no Galera, no causal wait, no setting known."""
    plain = MySQLConnection(session.raw, session.driver_name, "somewhere", session.module)
    assert plain.driver_name in {name for name, _ in DRIVERS}
    assert (plain.galera, plain.causal, plain.isolation, plain.lock_timeout) == (
        False, "", None, None)
    assert (plain.server_started, plain.client_address, plain.max_allowed_packet) == (
        None, None, 0)
    assert type(told(plain, 1213)) is DeadlockError
    assert str(told(plain, 1205)).startswith(
        "a row or commit lock on somewhere was not granted within ?s")
    assert plain.session_id == plain.connection_id == session.connection_id
    sent = plain.statements
    plain.set_isolation("REPEATABLE READ")      # nothing known: sent
    assert plain.statements == sent + 1


@pytest.mark.parametrize("driver", DRIVERS_PRESENT)
def test_a_new_session_as_connect_leaves_it(driver: str, tmp_path: Any) -> None:
    """Repeatable read said explicitly (a server whose default is another level must not
    change what a history-free snapshot sees), the server's limits read, nothing counted."""
    factory = MySQLFactory(Param("mysql", False), tmp_path, driver=driver)
    try:
        factory.open().close()     # the database and its schema
        conn = factory.backend().connect()
        try:
            assert conn.statements == 0
            assert conn.isolation == "REPEATABLE READ"
            packet, wait, version = conn.fetchone(
                "SELECT @@max_allowed_packet, @@SESSION.innodb_lock_wait_timeout, @@version")
            assert conn.max_allowed_packet == packet
            assert conn.lock_timeout == int(float(wait))
            assert conn.max_state_size == (packet - 64 * 1024) // 2
            assert conn.share_lock_nowait == (
                "LOCK IN SHARE MODE NOWAIT" if "MariaDB" in version else "FOR SHARE NOWAIT")
            assert conn.fetchone("SELECT @@SESSION.tx_isolation") == ("REPEATABLE-READ",)
            # The primary's session: probed for Galera (not here, so no causal wait),
            # and its server's start read (a restart, a lost COMMIT's session).
            assert (conn.galera, conn.causal) == (False, "")
            assert conn.server_started is not None
        finally:
            conn.close()
    finally:
        factory.cleanup()
