"""MySQL/MariaDB specifics: size limits, parallel commits, lock timeouts, lost sessions,
bad logins, both drivers, URLs and ZConfig.

These run against the server named by ZODBSQL_MYSQL_* (see tests/databases.py); with
CI=true an unreachable server fails them.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
from typing import Any, Iterator

import pytest
import ZODB
import ZODB.config
from persistent.mapping import PersistentMapping
from transaction.interfaces import TransientError
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import ConflictError
from ZODB.utils import z64

import zodbsql
from zodbsql.api import parse_url
from zodbsql.backends.base.schema import MIGRATABLE_VERSION
from zodbsql.backends.mysql import schema as mysql_schema
from zodbsql.backends.mysql.locker import CLOSE_PACK_GATE
from zodbsql.backends.mysql.options import MySQLOptions
from zodbsql.backends.mysql.schema import SCHEMA_LOCK
from zodbsql.backends.mysql.connections import DRIVERS, MySQLConnection, load_driver
from zodbsql.errors import (CommitLockTimeout, ConnectionLost, DatabaseError, DeadlockError,
                            DriverNotFound, RowLockTimeout, SchemaError)
from tests.databases import BACKENDS, MYSQL_SERVER, MySQLFactory, Param, mysql_admin

pytestmark = pytest.mark.skipif(
    "mysql" not in BACKENDS, reason="mysql is not in ZODBSQL_TEST_BACKENDS")


def _available_drivers() -> list[str]:
    found = []
    for name, module in DRIVERS:
        try:
            importlib.import_module(module)
            found.append(name)
        except ImportError:
            pass
    return found


DRIVERS_PRESENT = _available_drivers()


@pytest.fixture(params=DRIVERS_PRESENT)
def driver(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=[True, False], ids=["hp", "hf"])
def factory(request: pytest.FixtureRequest, tmp_path: Any, driver: str) -> Iterator[MySQLFactory]:
    f = MySQLFactory(Param("mysql", request.param), tmp_path, driver=driver)
    yield f
    f.cleanup()


def _populate(factory: MySQLFactory, count: int) -> list[bytes]:
    """``count`` objects under the root, committed through a DB of its own; their oids."""
    db = ZODB.DB(factory.open())
    try:
        with db.transaction() as conn:
            root = conn.root()
            for i in range(count):
                root[i] = PersistentMapping(value=0)
        with db.transaction() as conn:
            return [conn.root()[i]._p_oid for i in range(count)]
    finally:
        db.close()


def _begin_store(storage: Any, values: dict[bytes, bytes]) -> TransactionMetaData:
    """tpc_begin and store ``{oid: state}`` against the current serials, on ``storage``."""
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    for oid, state in values.items():
        _, serial = storage.load(oid)
        storage.store(oid, serial, state, "", txn)
    return txn


def _state(value: Any) -> bytes:
    from ZODB.tests.MinPO import MinPO
    from ZODB.tests.StorageTestBase import zodb_pickle
    return zodb_pickle(MinPO(value))


def test_both_drivers_are_tested() -> None:
    # PyMySQL is a dependency; mysqlclient comes with the `mysql` extra, which CI (and
    # scripts/test) installs: there every driver-parametrized test runs on both.
    if "mysqlclient" not in DRIVERS_PRESENT and os.environ.get("CI", "").lower() != "true":
        pytest.skip("mysqlclient is not installed (the `mysql` extra): only PyMySQL is tested")
    assert DRIVERS_PRESENT == [name for name, _ in DRIVERS] == ["mysqlclient", "pymysql"]


def test_driver_not_found_lists_each_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def refuse(name: str, *args: Any) -> Any:
        if name in ("MySQLdb", "pymysql"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)
    monkeypatch.setattr(importlib, "import_module", refuse)
    with pytest.raises(DriverNotFound) as info:
        load_driver("auto")
    message = str(info.value)
    assert "mysqlclient" in message and "MySQLdb" in message and "pymysql" in message


def test_commit_and_reload(factory: MySQLFactory, driver: str) -> None:
    storage = factory.open()
    assert getattr(storage.shared.backend, "driver_name") == driver
    oids = _populate(factory, 3)
    assert len(storage) == 4
    # What another storage stored, read back through this one (this driver): the root's
    # links and each object's value.
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            root = conn.root()
            assert [root[i]._p_oid for i in range(3)] == oids
            assert [dict(root[i]) for i in range(3)] == [{"value": 0}] * 3
    finally:
        db.close()


def test_a_commit_truncates_its_staging_tables_before_its_transaction(
        factory: MySQLFactory, caplog: pytest.LogCaptureFixture) -> None:
    """InnoDB keeps what DELETE removes from a TEMPORARY table: emptied that way, the
    staging tables grew by every commit's rows (a loader's DELETE of its staged
    references went from 1.5 to 20 ms a commit in a minute).  TRUNCATE ends the transaction it runs in,
    so it must come before START TRANSACTION."""
    storage = factory.open(sql_trace=True)
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["m"] = PersistentMapping()
        with caplog.at_level(logging.DEBUG, logger="zodbsql.sql"):
            with db.transaction() as conn:
                conn.root()["m"]["x"] = PersistentMapping()
    finally:
        db.close()
    sent = [r.getMessage().split(" ms: ", 1)[1] for r in caplog.records
            if r.name == "zodbsql.sql" and "[commit " in r.getMessage()]
    begin = next(i for i, sql in enumerate(sent) if sql.startswith("START TRANSACTION"))
    assert [sql.split(" (")[0] for sql in sent[begin - 1:begin]] == [
        "TRUNCATE TABLE temp_store"]
    assert not any(sql.startswith("DELETE FROM temp_") for sql in sent)


def test_staging_tables_emptied_inside_a_transaction_keep_it_open(
        factory: MySQLFactory) -> None:
    """TRUNCATE would commit a transaction that is already open: inside one,
    ``clear_staged`` deletes the staged rows instead, and what the transaction did
    before is still rolled back with it."""
    storage = factory.open()
    try:
        backend = storage.shared.backend
        conn = storage.shared.pool.acquire()
        try:
            conn.begin_write()
            conn.execute("INSERT INTO temp_store (zoid, prev_tid, state_size) VALUES (1, 0, 0)")
            conn.execute("INSERT INTO temp_blob (zoid, content_hash) VALUES (1, %s)",
                         (b"h" * 32,))
            backend.mover.clear_staged(conn)
            assert conn.in_transaction
            assert conn.fetchall("SELECT zoid FROM temp_store") == []
            conn.rollback()
            # The row staged before the call went with the rollback: no implicit commit.
            assert conn.fetchall("SELECT zoid FROM temp_blob") == []
        finally:
            storage.shared.pool.release(conn)
    finally:
        storage.close()


def test_state_larger_than_max_allowed_packet(factory: MySQLFactory) -> None:
    storage = factory.open()
    (small,) = _populate(factory, 1)
    last = storage.lastTransaction()
    before = storage.load(small)
    cursor = mysql_admin().cursor()
    cursor.execute("SELECT @@max_allowed_packet")
    packet = int(cursor.fetchone()[0])
    big = b"x" * (packet + 1024)
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    storage.store(small, before[1], _state(1), "", txn)
    storage.store(storage.new_oid(), z64, big, "", txn)
    with pytest.raises(DatabaseError) as info:
        storage.tpc_vote(txn)
    storage.tpc_abort(txn)
    message = str(info.value)
    assert "max_allowed_packet" in message
    assert str(len(big)) in message and str(packet) in message
    assert f" is {len(big)} bytes, larger than the {(packet - 64 * 1024) // 2} bytes " in message
    assert message.endswith(
        f" accepts in one statement (the server's max_allowed_packet is {packet} bytes and a"
        " state is sent escaped, up to twice its size; raise max_allowed_packet); nothing of"
        " this transaction was written"), message
    assert "nothing of this transaction was written" in message
    assert storage.lastTransaction() == last
    assert storage.load(small) == before
    # The storage still commits.
    _populate(factory, 1)
    assert storage.lastTransaction() > last


def test_large_state_below_the_limit(factory: MySQLFactory) -> None:
    storage = factory.open()
    (oid,) = _populate(factory, 1)
    data = bytes(range(256)) * (2 * 1024 * 4)  # 2 MB, every byte value (escapes)
    txn = _begin_store(storage, {oid: data})
    storage.tpc_vote(txn)
    storage.tpc_finish(txn)
    assert storage.load(oid)[0] == data


def test_staging_of_a_commit_larger_than_a_packet_takes_several_statements(
        factory: MySQLFactory, driver: str, caplog: pytest.LogCaptureFixture) -> None:
    """mysqlclient stages the rows as multi-row INSERTs the mover builds, each below
    max_allowed_packet: 320 states of 64 KB (every byte value, escaped up to twice
    their size) take more than one 16 MB packet, and each comes back byte for byte."""
    storage = factory.open(sql_trace=True)
    cursor = mysql_admin().cursor()
    cursor.execute("SELECT @@max_allowed_packet")
    packet = int(cursor.fetchone()[0])
    states = {storage.new_oid(): bytes([i % 256]) + bytes(range(256)) * 256
              for i in range(320)}
    assert sum(map(len, states.values())) > packet
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    for oid, data in states.items():
        storage.store(oid, z64, data, "", txn)
    with caplog.at_level(logging.DEBUG, logger="zodbsql.sql"):
        storage.tpc_vote(txn)
    storage.tpc_finish(txn)
    staged = [record.getMessage() for record in caplog.records
              if record.name == "zodbsql.sql" and "INSERT INTO temp_store" in
              record.getMessage()]
    if driver == "mysqlclient":
        counts = []
        for line in staged:
            found = re.search(r"\((\d+) rows\)", line)
            assert found is not None, line
            counts.append(int(found.group(1)))
        assert len(counts) > 1 and sum(counts) == len(states), staged
        assert not [line for line in staged if "\\x" in line or "_binary" in line]
    for oid, data in states.items():
        assert storage.load(oid)[0] == data


def test_staging_statements_stay_below_the_packet() -> None:
    """The split itself: each statement shorter than the packet less its margin, and as
    full as that allows (one more row would not fit); every row once, in order; NULLs
    (a deletion's state, no references) and numbers as written."""
    from zodbsql.backends.mysql.mover import PACKET_MARGIN, STAGE_ROWS, staging_statements

    def quote(value: bytes) -> bytes:
        return b"'" + value + b"'"
    rows = [(oid, 0, None if oid % 2 else 7, -oid * 3, 10,
             None if oid == 5 else b"s" * 10, "[1,2]" if oid % 3 else None)
            for oid in range(1, 101)]
    row_text = [b"(%d,0,%s,%d,10,%s,%s)" % (
        oid, b"NULL" if oid % 2 else b"7", -oid * 3,
        b"NULL" if oid == 5 else b"'ssssssssss'", b"'[1,2]'" if oid % 3 else b"NULL")
        for oid in range(1, 101)]
    for room in range(len(STAGE_ROWS) + 60, len(STAGE_ROWS) + 400, 7):
        limit = room
        made = list(staging_statements(rows, quote, PACKET_MARGIN + limit))
        assert b",".join(statement[len(STAGE_ROWS):] for statement, _ in made) == \
            b",".join(row_text)
        assert sum(count for _, count in made) == len(rows)
        taken = 0
        for statement, count in made:
            assert len(statement) < limit
            taken += count
            if taken < len(rows):
                assert len(statement) + 1 + len(row_text[taken]) >= limit
    [(one, count)] = list(staging_statements(rows, quote, 0))
    assert count == len(rows) and one == STAGE_ROWS + b",".join(row_text)


def test_parallel_commits_of_disjoint_objects(factory: MySQLFactory) -> None:
    a = factory.open(commit_lock_timeout=5)
    oids = _populate(factory, 2)
    b = factory.open(commit_lock_timeout=5)
    txn_a = _begin_store(a, {oids[0]: _state("a")})
    a.tpc_vote(txn_a)            # A holds the row lock of oids[0] from here to finish
    txn_b = _begin_store(b, {oids[1]: _state("b")})
    b.tpc_vote(txn_b)            # B's rows are disjoint: it doesn't wait for A
    tid_b = b.tpc_finish(txn_b)
    tid_a = a.tpc_finish(txn_a)
    assert tid_b < tid_a         # tids follow the order of finishing
    check = factory.open()
    assert check.load(oids[0]) == (_state("a"), tid_a)
    assert check.load(oids[1]) == (_state("b"), tid_b)


def test_overlapping_commit_times_out(factory: MySQLFactory) -> None:
    a = factory.open(commit_lock_timeout=5)
    oids = _populate(factory, 1)
    b = factory.open(commit_lock_timeout=1)
    txn_a = _begin_store(a, {oids[0]: _state("a")})
    a.tpc_vote(txn_a)
    txn_b = _begin_store(b, {oids[0]: _state("b")})
    with pytest.raises(RowLockTimeout) as info:
        b.tpc_vote(txn_b)
    b.tpc_abort(txn_b)
    assert isinstance(info.value, ConflictError)     # a conflict with A, retried as one
    assert "commit-lock-timeout" in str(info.value)
    assert str(info.value).startswith(
        "another commit held the row lock of an object this one changes for longer"
        " than row-lock-timeout (default: commit-lock-timeout; 1s, applied as"
        " innodb_lock_wait_timeout); the transaction can be retried")
    tid_a = a.tpc_finish(txn_a)
    assert factory.open().load(oids[0]) == (_state("a"), tid_a)
    # B retries and now sees A's commit as a conflict to resolve or report, not a hang.
    txn_b = _begin_store(b, {oids[0]: _state("b2")})
    b.tpc_vote(txn_b)
    assert b.tpc_finish(txn_b) > tid_a


def test_a_pack_batch_holding_the_gate_times_out_a_vote(factory: MySQLFactory) -> None:
    """A vote waits for the pack gate a deleting pack batch holds, as long as
    row-lock-timeout allows, and then says so; once the batch ends it commits."""
    oids = _populate(factory, 1)
    storage = factory.open(commit_lock_timeout=1)
    batch = mysql_admin()
    cursor = batch.cursor()
    cursor.execute(f"USE `{factory.path}`")
    cursor.execute("START TRANSACTION")
    cursor.execute("SELECT value FROM zodbsql_meta WHERE name = 'pack_gate' FOR UPDATE")
    assert cursor.fetchall()        # the row every database opened for writing has
    try:
        txn = _begin_store(storage, {oids[0]: _state("x")})
        with pytest.raises(CommitLockTimeout) as info:
            storage.tpc_vote(txn)
        storage.tpc_abort(txn)
        assert not isinstance(info.value, ConflictError)   # a pack, not another commit
        assert str(info.value).startswith(
            "a pack batch held the pack gate for longer than row-lock-timeout (default:"
            " commit-lock-timeout); the transaction can be retried")
    finally:
        cursor.execute("ROLLBACK")
        batch.close()
    txn = _begin_store(storage, {oids[0]: _state("x")})
    storage.tpc_vote(txn)
    assert storage.load(oids[0])[1] < storage.tpc_finish(txn)


def test_killed_connection_between_vote_and_finish(factory: MySQLFactory) -> None:
    storage = factory.open()
    oids = _populate(factory, 2)
    last = storage.lastTransaction()
    before = [storage.load(oid) for oid in oids]
    txn = _begin_store(storage, {oids[0]: _state("x"), oids[1]: _state("y")})
    storage.tpc_vote(txn)
    assert storage._pending is not None
    conn = storage._pending.conn
    assert isinstance(conn, MySQLConnection)
    admin = mysql_admin()
    admin.cursor().execute(f"KILL {conn.connection_id}")
    admin.close()
    with pytest.raises(ConnectionLost):
        storage.tpc_finish(txn)
    storage.tpc_abort(txn)
    other = factory.open()
    assert other.lastTransaction() == last
    assert [other.load(oid) for oid in oids] == before
    # The next transaction works (the pool replaced the dead session).
    txn = _begin_store(storage, {oids[0]: _state("z")})
    storage.tpc_vote(txn)
    tid = storage.tpc_finish(txn)
    assert other.load(oids[0]) == (_state("z"), tid)


def test_bad_credentials(factory: MySQLFactory) -> None:
    options = factory.backend_options()
    bad = MySQLOptions(host=options.host, port=options.port, unix_socket=options.unix_socket,
                       db=options.db, user="zodbsql_no_such_user", passwd="wrong",
                       driver=options.driver)
    with pytest.raises(DatabaseError) as info:
        zodbsql.open_storage(bad)
    message = str(info.value)
    where = f"MySQL database {bad.db!r} on " + (
        f"unix socket {bad.unix_socket}" if bad.unix_socket else f"{bad.host}:{bad.port}")
    assert message.startswith(f"cannot log in to {where} as user 'zodbsql_no_such_user': ")
    assert "Access denied for user 'zodbsql_no_such_user'" in message     # the server's
    assert message.endswith(" (check user and passwd, and the hosts the user may connect from)")
    assert "'wrong'" not in message  # the password is never shown


def test_missing_database(factory: MySQLFactory) -> None:
    options = factory.backend_options("zodbsql_test_does_not_exist")
    with pytest.raises(DatabaseError) as info:
        zodbsql.open_storage(options)
    message = str(info.value)
    assert message.startswith("MySQL database 'zodbsql_test_does_not_exist' on ")
    assert message.endswith(" (create it with CREATE DATABASE; zodbsql creates tables, not"
                            " databases)") and " does not exist: " in message


def test_unix_socket(factory: MySQLFactory) -> None:
    cursor = mysql_admin().cursor()
    cursor.execute("SELECT @@socket")
    socket_path = cursor.fetchone()[0]
    o = factory.backend_options()
    _populate(factory, 1)
    # A host beside the socket (as a copied configuration may have): the socket wins.
    storage = zodbsql.open_storage(
        MySQLOptions(unix_socket=socket_path, host="127.0.0.1", db=o.db, user=o.user,
                     passwd=o.passwd, driver=o.driver), keep_history=factory.param.keep_history)
    try:
        assert storage.sortKey().startswith("zodbsql:mysql:" + socket_path)
        assert len(storage) == 2
        backend = storage.shared.backend
        assert backend.describe() == f"MySQL database {o.db!r} on unix socket {socket_path}"
        # Through the socket, not TCP to the options' host (libmysqlclient takes the
        # socket only for host "localhost"): the server sees the session's host as that.
        conn = backend.connect()
        try:
            assert conn.fetchone("SELECT host FROM information_schema.processlist"
                                 " WHERE id = CONNECTION_ID()") == ("localhost",)
        finally:
            conn.close()
    finally:
        storage.close()


def test_an_unreachable_server_is_retryable_and_says_so(factory: MySQLFactory) -> None:
    options = factory.backend_options()
    nowhere = MySQLOptions(host="127.0.0.1", port=1, db=options.db, user=options.user,
                           driver=options.driver)
    with pytest.raises(ConnectionLost) as info:
        zodbsql.open_storage(nowhere)
    message = str(info.value)
    assert message.startswith(
        f"cannot reach the MySQL server for MySQL database {options.db!r} on 127.0.0.1:1: (")
    assert message.endswith(" (a retried transaction reconnects once the server is back)")


def test_a_backend_keeps_what_it_is_given(factory: MySQLFactory) -> None:
    options = factory.backend_options()
    backend = options.create_backend(False, 7.5, True)
    assert (backend.keep_history, backend.lock_timeout, backend.read_only) == (False, 7.5, True)
    assert options.create_backend(True, 2.0).read_only is False
    assert backend.describe() == f"MySQL database {options.db!r} on {options.host}:{options.port}"


def test_a_commit_session_and_the_database_size(factory: MySQLFactory) -> None:
    storage = factory.open()
    _populate(factory, 3)
    backend = storage.shared.backend
    conn = backend.connect_for_commit(3.0)
    assert isinstance(conn, MySQLConnection)
    try:
        assert conn.statements == 0 and conn.client_address
        assert conn.fetchone("SELECT @@SESSION.innodb_lock_wait_timeout") == (3,)
        row = conn.fetchone("SELECT SUM(data_length + index_length) FROM"
                            " information_schema.tables WHERE table_schema = %s",
                            (factory.backend_options().db,))
        assert row is not None and row[0] > 0
        assert backend.database_size(conn) == int(row[0])
    finally:
        conn.close()


def test_statements_per_commit(factory: MySQLFactory) -> None:
    storage = factory.open()
    db = ZODB.DB(storage)
    try:
        counts = {}
        for n in (1, 1000):
            with db.transaction() as conn:
                conn.root()[f"batch{n}"] = PersistentMapping()
            pool_conn = storage.shared.pool.acquire()
            storage.shared.pool.release(pool_conn)
            before = pool_conn.statements
            with db.transaction() as conn:
                batch = conn.root()[f"batch{n}"]
                for i in range(n):
                    batch[i] = PersistentMapping(value=i)
            pool_conn2 = storage.shared.pool.acquire()
            storage.shared.pool.release(pool_conn2)
            assert pool_conn2 is pool_conn
            counts[n] = pool_conn.statements - before
        print(f"statements per commit ({'hp' if factory.param.keep_history else 'hf'}):"
              f" {counts}")
        assert counts[1] <= 15 and counts[1000] <= 40, counts
    finally:
        db.close()


def test_url_and_zconfig(factory: MySQLFactory) -> None:
    o = factory.backend_options()
    url = (f"zodbsql+mysql://{o.user}@{o.host}:{o.port}/{o.db}"
           f"?driver={o.driver}&keep_history={'true' if factory.param.keep_history else 'false'}")
    options, storage_options = parse_url(url)
    assert options == o
    db = ZODB.DB(zodbsql.open_storage(url))
    try:
        with db.transaction() as conn:
            conn.root.answer = 42
    finally:
        db.close()
    text = f"""
%import zodbsql
<zodb>
  <zodbsql>
    keep-history {'true' if factory.param.keep_history else 'false'}
    <mysql>
      host {o.host}
      port {o.port}
      db {o.db}
      user {o.user}
      driver {o.driver}
    </mysql>
  </zodbsql>
</zodb>
"""
    db = ZODB.config.databaseFromString(text)
    try:
        with db.transaction() as conn:
            assert conn.root.answer == 42
    finally:
        db.close()


@pytest.mark.parametrize("number,kind,words", [
    (1205, CommitLockTimeout, ["commit-lock-timeout", "innodb_lock_wait_timeout"]),
    (1213, DeadlockError, ["deadlock", "retried"]),
    (3572, CommitLockTimeout, ["commit-lock-timeout"]),
    (2006, ConnectionLost, ["lost"]),
    (2013, ConnectionLost, ["lost"]),
    (1153, DatabaseError, ["max_allowed_packet", "bytes"]),
    (1146, DatabaseError, ["statement: SELECT 1"]),
])
def test_error_translation(factory: MySQLFactory, number: int, kind: type, words: list[str]) -> None:
    storage = factory.open()
    conn = storage.shared.pool.acquire()
    try:
        exc = getattr(conn, "module").OperationalError(number, "server says no")
        error = getattr(conn, "translate_error")(exc, "SELECT 1")
        assert isinstance(error, kind), error
        if kind in (CommitLockTimeout, DeadlockError, ConnectionLost):
            assert isinstance(error, TransientError)
        assert all(word in str(error) for word in words), str(error)
    finally:
        storage.shared.pool.release(conn)


def test_reconnect_while_the_server_is_down_is_retryable(factory: MySQLFactory) -> None:
    from tests.relay import Relay, check_outage
    o = factory.backend_options()
    if o.unix_socket:
        pytest.skip("the test server is reached through a unix socket")
    relay = Relay((o.host, int(o.port)))
    via_relay = MySQLOptions(host="127.0.0.1", port=relay.port, db=o.db, user=o.user,
                             passwd=o.passwd, driver=o.driver)
    storage = zodbsql.open_storage(via_relay, keep_history=factory.param.keep_history)
    try:
        check_outage(storage, relay)
    finally:
        storage.close()
        relay.close()


def test_a_user_without_rights_on_the_database_is_told_to_grant(factory: MySQLFactory) -> None:
    o = factory.backend_options()
    cursor = mysql_admin().cursor()
    user = "zodbsql_test_norights"
    cursor.execute(f"CREATE USER IF NOT EXISTS '{user}'@'%' IDENTIFIED BY 'hunter2'")
    try:
        bad = MySQLOptions(host=o.host, port=o.port, unix_socket=o.unix_socket, db=o.db,
                           user=user, passwd="hunter2", driver=o.driver)
        with pytest.raises(DatabaseError) as info:
            zodbsql.open_storage(bad)
        message = str(info.value)
        assert "logged in but may not use" in message and f"ON {o.db}.*" in message
        assert "hunter2" not in message and not isinstance(info.value, ConnectionLost)
    finally:
        cursor.execute(f"DROP USER IF EXISTS '{user}'@'%'")


def test_a_refusal_of_no_other_kind_names_the_database_and_the_server_reason(
        factory: MySQLFactory) -> None:
    """A login the server refuses for a reason the other messages do not cover (here
    the user's max_user_connections, error 1226, taken by another session) fails with
    the database named and the server's own words; it is not retryable, and the
    password appears nowhere."""
    import uuid
    o = factory.backend_options()
    admin = mysql_admin().cursor()
    user = f"zodbsql_test_one_{uuid.uuid4().hex[:8]}"
    admin.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'hunter2'"
                  " WITH MAX_USER_CONNECTIONS 1")
    try:
        admin.execute(f"GRANT ALL ON `{o.db}`.* TO '{user}'@'%'")
        server = {**MYSQL_SERVER, "user": user, "passwd": "hunter2"}
        held = mysql_admin(o.driver, server)       # the user's one connection
        try:
            limited = MySQLOptions(host=o.host, port=o.port, unix_socket=o.unix_socket,
                                   db=o.db, user=user, passwd="hunter2", driver=o.driver)
            with pytest.raises(DatabaseError) as info:
                zodbsql.open_storage(limited)
        finally:
            held.close()
        message = str(info.value)
        assert message.startswith(f"cannot connect to MySQL database {o.db!r}"), message
        assert "max_user_connections" in message and "hunter2" not in message
        assert not isinstance(info.value, ConnectionLost)
    finally:
        admin.execute(f"DROP USER IF EXISTS '{user}'@'%'")


def test_a_second_pack_waits_for_the_first_then_gives_up(factory: MySQLFactory) -> None:
    """One pack per database at a time (GET_LOCK): while another session holds the pack
    lock, a pack waits commit-lock-timeout and fails naming the database, deleting
    nothing; once the lock is free it packs."""
    import time
    from zodbsql.storage import pack
    storage = factory.open(commit_lock_timeout=1.0)
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        conn.root()["gone"] = PersistentMapping(v=1)
    with db.transaction() as conn:
        gone = conn.root()["gone"]._p_oid
        del conn.root()["gone"]
    holder = mysql_admin(factory.driver)
    try:
        cursor = holder.cursor()
        cursor.execute(f"SELECT GET_LOCK('zodbsql.pack.{factory.db}', 0)")
        assert cursor.fetchone()[0] == 1
        started = time.monotonic()
        with pytest.raises(DatabaseError, match=f"another process has been packing .*"
                                                f"{factory.db}.* for more than 1s"):
            pack.pack(storage, time.time())
        # It waited for the lock, commit-lock-timeout (1 s) and not twice that.
        assert 0.9 <= time.monotonic() - started < 1.9
        assert storage.load(gone)[0]                  # nothing was deleted
    finally:
        holder.close()
    pack.pack(storage, time.time())
    with pytest.raises(Exception, match="0x|POSKey"):
        storage.load(gone)
    db.close()


class _Certification:
    """``execute_insert_id`` failing as Galera fails a statement that lost
    certification (error 1213, nothing applied) ``failures`` times, then the server's."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        real = MySQLConnection.execute_insert_id

        def execute_insert_id(conn: MySQLConnection, sql: str, params: Any) -> int:
            self.calls += 1
            if self.calls <= self.failures:
                raise DeadlockError("Deadlock found when trying to get lock (1213)")
            return real(conn, sql, params)
        self.method = execute_insert_id


def test_an_oid_block_that_lost_certification_is_asked_for_again(
        factory: MySQLFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a transaction the counter's UPDATE is sent again until it passes (up to
    ``ATTEMPTS`` times); inside a commit's transaction, which the failure rolled back,
    it is raised at once for the commit to be retried whole.  Either way no oid is
    handed out twice."""
    from zodbsql.backends.mysql.oidalloc import ATTEMPTS
    storage = factory.open()
    oids = storage.backend.oids
    conn = storage.backend.connect()
    try:
        before = oids.allocate(conn, 16)
        failing = _Certification(ATTEMPTS - 1)
        monkeypatch.setattr(MySQLConnection, "execute_insert_id", failing.method)
        after = oids.allocate(conn, 16)
        assert failing.calls == ATTEMPTS
        assert after == list(range(before[-1] + 1, before[-1] + 17))

        failing = _Certification(ATTEMPTS)
        monkeypatch.setattr(MySQLConnection, "execute_insert_id", failing.method)
        with pytest.raises(DeadlockError):
            oids.allocate(conn, 16)
        assert failing.calls == ATTEMPTS

        failing = _Certification(1)
        monkeypatch.setattr(MySQLConnection, "execute_insert_id", failing.method)
        conn.begin_write()
        with pytest.raises(DeadlockError):
            oids.allocate(conn, 16)
        assert failing.calls == 1
        conn.rollback()
        monkeypatch.undo()
        assert oids.allocate(conn, 16)[0] == after[-1] + 1
    finally:
        conn.close()


@contextlib.contextmanager
def session_of(factory: MySQLFactory) -> Iterator[Any]:
    """A plain session on the factory's database, as another process has."""
    conn = factory.backend().connect()
    try:
        yield conn
    finally:
        conn.close()


def test_a_storage_opens_while_a_pack_batch_holds_the_gate(factory: MySQLFactory) -> None:
    """A writable open of a current database writes nothing: the pack gate's row is
    there, so it is not added again (which would wait for the batch's lock)."""
    db = ZODB.DB(factory.open())
    with db.transaction() as conn:
        conn.root()["opened"] = True
    db.close()
    with session_of(factory) as pack:
        pack.begin_write()
        pack.fetchall(CLOSE_PACK_GATE)
        db = ZODB.DB(factory.open(commit_lock_timeout=1))   # (its commits wait)
        try:
            with db.transaction() as conn:
                assert conn.root()["opened"] is True
        finally:
            db.close()
        pack.rollback()


@contextlib.contextmanager
def schema_lock_taken(factory: MySQLFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Another session holds the database's schema lock (a process creating or
    migrating the schema); the wait for it is made one second."""
    monkeypatch.setattr(mysql_schema, "SCHEMA_WAIT", 1)
    with session_of(factory) as other:
        assert other.fetchone(SCHEMA_LOCK, (0,)) == (1,)
        yield


def where(factory: MySQLFactory) -> str:
    return str(factory.backend().describe())


def test_an_empty_database_waits_for_the_schema_lock_then_names_it(
        factory: MySQLFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    with schema_lock_taken(factory, monkeypatch), pytest.raises(SchemaError) as info:
        factory.open()
    assert str(info.value) == (f"{where(factory)}: another process held the schema lock"
                               " for 1s (it creates or migrates the schema); nothing was"
                               " changed")
    with session_of(factory) as conn:
        assert conn.fetchall("SHOW TABLES") == []


def test_a_version_1_database_waits_for_the_schema_lock_then_names_it(
        factory: MySQLFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    factory.open().close()
    with session_of(factory) as conn:
        conn.begin_write()
        conn.execute(f"UPDATE zodbsql_meta SET value = '{MIGRATABLE_VERSION}'"
                     " WHERE name = 'schema_version'")
        conn.commit()
    for create_schema in (True, False):   # the lock taken by prepare, or by migrate
        with schema_lock_taken(factory, monkeypatch), pytest.raises(SchemaError) as info:
            factory.open(create_schema=create_schema)
        assert str(info.value) == (f"{where(factory)}: another process held the schema"
                                   " lock for 1s (it creates or migrates the schema);"
                                   " nothing was changed")
    with session_of(factory) as conn:
        assert conn.fetchone("SELECT value FROM zodbsql_meta WHERE name = 'schema_version'"
                             ) == (str(MIGRATABLE_VERSION),)


def test_a_read_only_open_does_not_wait_for_the_schema_lock(
        factory: MySQLFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    factory.open().close()
    with schema_lock_taken(factory, monkeypatch):
        factory.open(read_only=True).close()
