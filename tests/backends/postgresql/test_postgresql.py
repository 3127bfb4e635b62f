"""What only the PostgreSQL backend has: row locks, parallel commits, server errors."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Any, Callable, Iterator

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.tests.MinPO import MinPO
from ZODB.tests.StorageTestBase import zodb_pickle
from ZODB.POSException import ConflictError, POSKeyError
from ZODB.utils import u64, z64

from tests.databases import BACKENDS, POSTGRESQL_DSN, Param, PostgreSQLFactory
from zodbsql.api import open_storage, parse_url
from zodbsql.backends.postgresql.connections import SESSION_IDENTITY
from zodbsql.backends.postgresql.mover import bigint_array
from zodbsql.backends.postgresql.options import PostgreSQLOptions
from zodbsql.errors import (CommitLockTimeout, ConfigurationError, ConnectionLost,
                            DatabaseError, RowLockTimeout, SchemaError)

pytestmark = pytest.mark.skipif(
    "postgresql" not in BACKENDS,
    reason="postgresql is not in ZODBSQL_TEST_BACKENDS")


@pytest.fixture(params=[True, False], ids=["hp", "hf"])
def factory(request):
    made = PostgreSQLFactory(Param("postgresql", request.param))
    yield made
    made.cleanup()


def begin(storage, note=""):
    txn = transaction.Transaction()
    txn.note(note)
    storage.tpc_begin(txn)
    return txn


def store(storage, txn, oid, serial, value):
    storage.store(oid, serial, zodb_pickle(MinPO(value)), "", txn)


def make_objects(storage, count):
    """Commit ``count`` new objects; return [(oid, tid)]."""
    oids = [storage.new_oid() for _ in range(count)]
    txn = begin(storage, "create")
    for oid in oids:
        store(storage, txn, oid, z64, 0)
    storage.tpc_vote(txn)
    tid = storage.tpc_finish(txn)
    return [(oid, tid) for oid in oids]


def test_disjoint_commits_run_in_parallel(factory):
    """B votes and finishes while A holds its row locks: no database-wide lock in vote."""
    a = factory.open(commit_lock_timeout=5)
    b = factory.open(commit_lock_timeout=5)
    (oid1, tid1), (oid2, tid2) = make_objects(a, 2)

    txn_a = begin(a, "A")
    store(a, txn_a, oid1, tid1, 1)
    a.tpc_vote(txn_a)                      # A now holds the row lock on oid1

    txn_b = begin(b, "B")
    store(b, txn_b, oid2, tid2, 2)
    b.tpc_vote(txn_b)                      # would time out if A's vote locked globally
    tid_b = b.tpc_finish(txn_b)            # B commits first although A voted first

    tid_a = a.tpc_finish(txn_a)
    assert u64(tid_b) < u64(tid_a)         # tids follow the order of finish
    assert a.load(oid1)[1] == tid_a
    assert a.load(oid2)[1] == tid_b
    # Nothing is left idle in a transaction in either storage's pool.
    for storage in (a, b):
        for conn in list(storage.shared.pool._idle.queue):
            assert not conn.in_transaction
            assert conn.raw.info.transaction_status.name == "IDLE"


@pytest.mark.parametrize("size", [1, 10_000], ids=["inline", "binary"])
def test_conflicting_commit_waits_then_times_out(factory, size):
    """Both ways a vote begins: a small commit's BEGIN goes inline with its states, a
    large one's (over INLINE_BYTES) before them; each names the wait it gave up on."""
    a = factory.open(commit_lock_timeout=5)
    b = factory.open(row_lock_timeout=0.3)
    [(oid, tid)] = make_objects(a, 1)

    txn_a = begin(a, "A")
    store(a, txn_a, oid, tid, 1)
    a.tpc_vote(txn_a)

    txn_b = begin(b, "B")
    store(b, txn_b, oid, tid, b"2" * size)
    with pytest.raises(RowLockTimeout) as raised:
        b.tpc_vote(txn_b)
    b.tpc_abort(txn_b)
    # A conflict with A (what code that retries conflicts catches) and a lock timeout.
    assert isinstance(raised.value, ConflictError)
    assert isinstance(raised.value, CommitLockTimeout)
    assert str(raised.value).startswith(
        "another commit held the row lock of an object this one changes for longer than"
        " row-lock-timeout (default: commit-lock-timeout; 0.3s); the transaction can be"
        " retried")

    tid_a = a.tpc_finish(txn_a)            # A was not disturbed
    assert a.load(oid)[1] == tid_a


def test_sessions_compile_no_statement_to_machine_code(factory):
    """JIT is off in every session: the prefetch's walking statement, estimated at
    millions of rows on a large table, was compiled on each run (400 ms of a 1 ms
    statement: a cold read of a 40,000-document catalog took 34 s instead of 0.9)."""
    storage = factory.open()
    conn = storage.shared.backend.connect()
    try:
        assert conn.fetchone("SHOW jit")[0] == "off"
    finally:
        conn.close()


def test_what_each_session_is_set_to(factory):
    """Generic plans, the storage's schema first, the pid and start that name the
    session after a lost COMMIT, nothing counted; read-only sessions refuse writes at
    the server, whatever statement a bug might send."""
    factory.open().close()
    for read_only in (False, True):
        storage = factory.open(read_only=read_only)
        conn = storage.shared.backend.connect()
        try:
            assert conn.statements == 0
            assert conn.fetchone("SHOW plan_cache_mode")[0] == "force_generic_plan"
            assert conn.fetchone("SELECT current_schema()")[0] == factory.path
            assert conn.fetchone("SHOW default_transaction_read_only")[0] == (
                "on" if read_only else "off")
            assert (conn.session_id, conn.session_started) == conn.fetchone(SESSION_IDENTITY)
        finally:
            conn.close()
        storage.close()
    storage = factory.open(read_only=True)
    conn = storage.shared.backend.connect()
    try:
        with pytest.raises(DatabaseError, match="read-only transaction"):
            conn.execute("UPDATE zodbsql_meta SET value = value")
    finally:
        conn.close()



def test_prefetch_statement_is_planned_once_a_session(factory):
    """Sessions use generic plans: PostgreSQL planned a prepared statement for its
    values at each of its first five runs, and the prefetch statement's planning (1.3 to
    4 ms) cost a fresh process reading 1,000 objects cold more than running it."""
    db = ZODB.DB(factory.open())
    with db.transaction() as conn:
        for name in ("children", "more"):
            children = conn.root()[name] = PersistentMapping()
            for i in range(300):
                children[i] = PersistentMapping({"i": i})
    db.close()
    db = ZODB.DB(factory.open())              # cold: a new state cache, new sessions
    try:
        conn = db.open()
        # Two containers: the statement runs at least twice whatever prefetch's bound
        # (a fully used batch grows it sixteenfold: one container may take one run).
        for name in ("children", "more"):
            assert sum(child["i"] for child in conn.root()[name].values()) == 44850
        session = conn._storage._reading().raw
        rows = session.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s", ("%wanted AS%",)).fetchall()
        assert len(rows) == 1
        generic, custom = rows[0]
        assert custom == 0
        assert generic >= 2                    # the root, a container, then ...
        # ... from a batch of 128 on, the client's pick among the children.
        rows = session.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s", ("%WITH ORDINALITY%",)).fetchall()
        assert len(rows) == 1
        generic, custom = rows[0]
        assert custom == 0 and generic >= 1
        conn.close()
    finally:
        db.close()

def large_states_compression(factory, method: str | None) -> tuple[str, list[str]]:
    """Commit a 20 KB compressible state with ``toast-compression`` ``method`` (None: the
    default); the session's setting, and how the server compressed the stored state."""
    options = factory.backend_options(factory.new_path())
    if method is not None:
        options = dataclasses.replace(options, toast_compression=method)
    storage = open_storage(options, keep_history=factory.param.keep_history)
    factory.opened.append(storage)
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        conn.root()["big"] = PersistentMapping(text="a catalog's node " * 1250)
    conn = storage.shared.backend.connect()
    try:
        shown = conn.fetchone("SHOW default_toast_compression")
        assert shown is not None
        setting = shown[0]
        methods = [row[0] for row in conn.fetchall(
            "SELECT pg_column_compression(state) FROM object_state WHERE state_size > 20000")]
    finally:
        conn.close()
    db.close()
    return setting, methods


def test_large_states_are_compressed_with_lz4_unless_configured_otherwise(factory):
    """A state over ~2 KB is compressed by the server: lz4 by default, several times
    faster than pglz, which was most of a growing catalog's vote (README, "lz4")."""
    assert large_states_compression(factory, None) == ("lz4", ["lz4"])
    assert large_states_compression(factory, "pglz")[0] == "pglz"
    server_default = factory.admin.execute("SHOW default_toast_compression").fetchone()[0]
    assert large_states_compression(factory, "server")[0] == server_default


def test_whether_the_server_offers_lz4_is_asked_once_per_process(factory):
    """The answer is kept for the process (a test opening 768 DBs asked it 2,307
    times): a storage opened after another takes it from there, as shown by an answer
    changed in between, which the new storage's sessions follow."""
    from zodbsql.backends.postgresql import adapter
    adapter._COMPRESSION_OFFERED.clear()
    assert large_states_compression(factory, None)[0] == "lz4"
    (key, offered), = adapter._COMPRESSION_OFFERED.items()
    assert offered is True and key[2] == "lz4"
    adapter._COMPRESSION_OFFERED[key] = False      # as if this server had no lz4
    try:
        server_default = factory.admin.execute("SHOW default_toast_compression").fetchone()[0]
        assert server_default != "lz4", "the test tells the two apart by the server's pglz"
        assert large_states_compression(factory, None)[0] == server_default
    finally:
        adapter._COMPRESSION_OFFERED.clear()


def test_an_unknown_compression_is_refused_by_name():
    with pytest.raises(ConfigurationError, match="toast-compression must be one of lz4, pglz,"
                                                 " server, got 'zstd'"):
        parse_url("postgresql://postgres@127.0.0.1:5432/test?toast-compression=zstd")


def test_the_prefetching_statement_is_prepared_at_its_first_run(factory):
    """Its parse and analysis cost the server 2 to 3 ms a run; a fresh process runs it
    a handful of times in its first reads, where psycopg would prepare it only at its
    PREPARE_THRESHOLD-th."""
    storage = factory.open()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["m"] = PersistentMapping({i: PersistentMapping() for i in range(20)})
        reader = factory.open()
        try:
            load = reader._load
            assert load.fetchall("SELECT count(*) FROM pg_prepared_statements")[0][0] == 0
            reader.poll_invalidations()
            data, tid = reader.load(z64)
            assert data
            prepared = [row[0] for row in load.fetchall(
                "SELECT statement FROM pg_prepared_statements")]
            assert len(prepared) == 1 and "target AS" in prepared[0]
        finally:
            reader.close()
    finally:
        db.close()


@pytest.mark.parametrize("seconds, shown", [(5.0, "5s"), (0.3, "300ms"), (0.0001, "1ms")])
def test_a_commit_bounds_its_lock_waits_to_the_millisecond(factory, seconds, shown):
    """begin_commit sets the transaction's lock_timeout from the timeout given, in whole
    milliseconds and at least one (0 would mean no bound at all)."""
    storage = factory.open()
    backend = storage.shared.backend
    conn = backend.connect()
    try:
        backend.locker.begin_commit(conn, seconds)
        assert conn.fetchone("SHOW lock_timeout")[0] == shown
        conn.rollback()
    finally:
        conn.close()


def test_commit_lock_timeout_names_its_setting(factory):
    storage = factory.open(commit_lock_timeout=0.3)
    [(oid, tid)] = make_objects(storage, 1)
    import psycopg
    holder = psycopg.connect(factory.dsn, options=f"-c search_path={factory.path}")
    try:
        holder.execute("SELECT last_tid FROM commit_row FOR UPDATE")  # the commit lock
        txn = begin(storage, "waits")
        store(storage, txn, oid, tid, 1)
        storage.tpc_vote(txn)              # row locks only: not blocked
        with pytest.raises(CommitLockTimeout, match="commit-lock-timeout"):
            storage.tpc_finish(txn)
        storage.tpc_abort(txn)
    finally:
        holder.rollback()
        holder.close()
    txn = begin(storage, "after")
    store(storage, txn, oid, tid, 2)
    storage.tpc_vote(txn)
    storage.tpc_finish(txn)


def test_two_commits_creating_one_oid_conflict_at_the_second_finish(factory):
    """Vote finds no row of a new object to lock, and finish inserts its row without ON
    CONFLICT: a second commit creating the same oid fails, retryably, and the first
    one's state stays."""
    a = factory.open(commit_lock_timeout=5)
    b = factory.open(commit_lock_timeout=5)
    [(other, other_tid)] = make_objects(a, 1)
    oid = a.new_oid()

    txn_a = begin(a, "A")
    store(a, txn_a, oid, z64, 1)
    a.tpc_vote(txn_a)
    txn_b = begin(b, "B")
    store(b, txn_b, oid, z64, 2)
    store(b, txn_b, other, other_tid, 2)
    b.tpc_vote(txn_b)                      # no row yet: nothing to lock or conflict with
    tid_a = a.tpc_finish(txn_a)
    with pytest.raises(ConflictError) as raised:
        b.tpc_finish(txn_b)
    message = str(raised.value)
    assert message.startswith("another commit created an object this one creates, after"
                              " this one's vote (")
    assert "duplicate key" in message and message.endswith("; the transaction can be retried")
    b.tpc_abort(txn_b)
    assert b.load(oid) == a.load(oid) and a.load(oid)[1] == tid_a
    assert b.load(other)[1] == other_tid   # nothing of B's commit was written


def test_a_restore_over_existing_objects_replaces_them(factory):
    """A restore stages prev_tid 0 for objects that exist: vote's lock, not prev_tid,
    tells finish which rows to replace, in one commit with new objects."""
    storage = factory.open()
    made = make_objects(storage, 3)
    fresh = storage.new_oid()
    txn = begin(storage, "restore")
    for oid, _ in made + [(fresh, None)]:
        storage.restore(oid, z64, zodb_pickle(MinPO(7)), "", None, txn)
    storage.tpc_vote(txn)
    tid = storage.tpc_finish(txn)
    for oid, _ in made + [(fresh, None)]:
        state, serial = storage.load(oid)
        assert serial == tid and state == zodb_pickle(MinPO(7))
    reopened = factory.open()
    assert [reopened.load(oid)[1] for oid, _ in made] == [tid] * 3


def test_read_current_conflicts_after_a_concurrent_commit(factory):
    a = factory.open()
    b = factory.open()
    (oid1, tid1), (oid2, tid2) = make_objects(a, 2)
    txn_b = begin(b, "B changes oid1")
    store(b, txn_b, oid1, tid1, 5)
    b.tpc_vote(txn_b)
    b.tpc_finish(txn_b)

    from ZODB.POSException import ReadConflictError
    txn_a = begin(a, "A read oid1 at its old tid")
    a.checkCurrentSerialInTransaction(oid1, tid1, txn_a)
    store(a, txn_a, oid2, tid2, 6)
    with pytest.raises(ReadConflictError):
        a.tpc_vote(txn_a)
    a.tpc_abort(txn_a)


def test_wrong_history_mode_is_refused(factory):
    factory.open().close()
    other = not factory.param.keep_history
    with pytest.raises(SchemaError, match="keep-history"):
        factory.open(keep_history=other)


def test_lost_connection_is_reported_then_reopened(factory):
    storage = factory.open()
    pid = storage._load.raw.info.backend_pid
    factory.admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(ConnectionLost):
        storage.load(z64)
    with pytest.raises(POSKeyError):      # a new session answers: there is no root yet
        storage.load(z64)


def test_unreachable_server_gives_a_clear_error():
    options = PostgreSQLOptions(dsn="host=127.0.0.1 port=1 user=postgres dbname=test"
                                " connect_timeout=2")
    with pytest.raises(DatabaseError, match="cannot connect to PostgreSQL database test"
                                            " at 127.0.0.1:1"):
        open_storage(options)


def test_malformed_dsn_gives_a_clear_error():
    with pytest.raises(ConfigurationError, match="invalid postgresql dsn"):
        open_storage(PostgreSQLOptions(dsn="this is not a dsn"))
    with pytest.raises(ConfigurationError, match="needs a dsn"):
        PostgreSQLOptions(dsn="")
    with pytest.raises(ConfigurationError, match="driver"):
        PostgreSQLOptions(dsn=POSTGRESQL_DSN, driver="odbc")


def test_ci_makes_an_unreachable_server_fail(monkeypatch):
    dsn = "host=127.0.0.1 port=1 user=postgres dbname=test connect_timeout=2"
    monkeypatch.setenv("CI", "true")
    with pytest.raises(RuntimeError, match="CI=true"):
        PostgreSQLFactory(Param("postgresql", True), dsn=dsn)
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        PostgreSQLFactory(Param("postgresql", True), dsn=dsn)


def test_url_is_split_into_dsn_schema_and_options():
    options, storage_options = parse_url(
        "zodbsql+postgresql://postgres@127.0.0.1:5432/test"
        "?schema=zodb&keep_history=false&sslmode=disable&commit_lock_timeout=3")
    assert options == PostgreSQLOptions(
        dsn="postgresql://postgres@127.0.0.1:5432/test?sslmode=disable", schema="zodb")
    assert storage_options.keep_history is False
    assert storage_options.commit_lock_timeout == 3
    plain, _ = parse_url("postgresql://postgres@127.0.0.1/test")
    assert plain.dsn == "postgresql://postgres@127.0.0.1/test" and plain.schema is None


def test_url_takes_backend_settings_with_dashes_or_underscores():
    """As the storage's own settings: ``replica-max-lag`` was passed on to libpq, which
    refused it as an unknown parameter of the DSN."""
    for name in ("replica-max-lag", "replica_max_lag"):
        options, _ = parse_url(f"postgresql://postgres@127.0.0.1/test?{name}=2.5"
                               "&toast-compression=pglz&sslmode=disable")
        assert (options.replica_max_lag, options.toast_compression) == (2.5, "pglz")
        assert options.dsn == "postgresql://postgres@127.0.0.1/test?sslmode=disable"


def test_url_config_and_zodburi_open_the_same_database(factory):
    import ZODB.config
    import zodburi
    from tests.cli.urls import url_for
    schema = factory.path
    mode = "true" if factory.param.keep_history else "false"
    # The server of ZODBSQL_TEST_POSTGRESQL_DSN, as a URL.
    url = "zodbsql+" + url_for("postgresql", schema, keep_history=factory.param.keep_history)
    storage_factory, dbkw = zodburi.resolve_uri(url)
    storage = storage_factory()
    try:
        db = __import__("ZODB").DB(storage)
        with db.transaction() as conn:
            conn.root()["x"] = 1
        db.close()
    finally:
        storage.close()
    db = ZODB.config.databaseFromString(f"""
        %import zodbsql
        <zodb>
          <zodbsql>
            keep-history {mode}
            <postgresql>
              dsn {POSTGRESQL_DSN}
              schema {schema}
            </postgresql>
          </zodbsql>
        </zodb>
    """)
    try:
        with db.transaction() as conn:
            assert conn.root()["x"] == 1
    finally:
        db.close()


def test_two_schemas_are_separate_databases(factory):
    first = factory.open()
    second = factory.open_other()
    make_objects(first, 3)
    assert len(first) == 3 and len(second) == 0
    assert first.getSize() > 0
    assert first.shared.backend.sort_key() != second.shared.backend.sort_key()


def _terminate(factory, conn):
    factory.admin.execute("SELECT pg_terminate_backend(%s)", (conn.raw.info.backend_pid,))


@pytest.mark.parametrize("when", ["vote", "finish"])
def test_connection_killed_mid_commit_leaves_nothing_half_done(factory, when):
    storage = factory.open()
    observer = factory.open()
    (oid, tid), = make_objects(storage, 1)
    before = observer.lastTransaction()
    txn = begin(storage, "doomed")
    store(storage, txn, oid, tid, 1)
    new_oid = storage.new_oid()
    store(storage, txn, new_oid, z64, 2)
    if when == "vote":
        # The pooled commit connection the vote will take dies first.
        idle = storage.shared.pool._idle.queue[-1]
        _terminate(factory, idle)
        with pytest.raises(ConnectionLost) as raised:
            storage.tpc_vote(txn)
    else:
        storage.tpc_vote(txn)
        _terminate(factory, storage._pending.conn)
        with pytest.raises(ConnectionLost) as raised:
            storage.tpc_finish(txn)
    storage.tpc_abort(txn)
    # What was raised is retryable: transaction's attempts() loop retries it.
    assert isinstance(raised.value, transaction.interfaces.TransientError)
    # Nothing of the doomed commit is visible to anyone.
    assert observer.lastTransaction() == before
    with pytest.raises(POSKeyError):
        observer.load(new_oid)
    assert observer.load(oid)[1] == tid
    # The storage reconnects: the next commit works.
    txn = begin(storage, "retry")
    store(storage, txn, oid, tid, 3)
    storage.tpc_vote(txn)
    assert u64(storage.tpc_finish(txn)) > u64(tid)


def test_connection_killed_during_blob_upload_leaves_no_partial_blob(factory, tmp_path):
    """pg_terminate_backend of the commit connection while vote uploads a blob's chunks."""
    import hashlib
    import os

    from ZODB.blob import Blob

    storage = factory.open(blob_dir=str(tmp_path / "cache"), blob_chunk_size=4096)
    blobs = storage.backend.blobs
    real_upload = blobs.upload
    data = os.urandom(10 * 4096)

    def upload_then_die(conn, content_hash, size, chunks):
        def first_chunks_then_kill():
            for num, chunk in enumerate(chunks):
                if num == 3:
                    _terminate(factory, conn)
                yield chunk
        return real_upload(conn, content_hash, size, first_chunks_then_kill())

    blobs.upload = upload_then_die
    db = ZODB.DB(storage)
    try:
        conn = db.open()
        conn.root()["big"] = Blob(data)
        with pytest.raises(ConnectionLost):
            transaction.commit()
        transaction.abort()
        # Nothing of the upload is visible: no content, no chunk, no reference.
        for table in ("blob_content", "blob_chunk", "blob_ref"):
            assert factory.admin.execute(
                f'SELECT COUNT(*) FROM "{factory.path}".{table}').fetchone()[0] == 0
        blobs.upload = real_upload
        conn.root()["big"] = Blob(data)
        transaction.commit()  # the next commit works (the pool reconnects)
        incomplete = factory.admin.execute(
            f'SELECT COUNT(*) FROM "{factory.path}".blob_content c WHERE c.chunks <>'
            f' (SELECT COUNT(*) FROM "{factory.path}".blob_chunk k'
            f'  WHERE k.content_hash = c.content_hash)').fetchone()[0]
        assert incomplete == 0
        conn2 = db.open(transaction_manager=transaction.TransactionManager())
        storage.shared.blob_files.cache.evict(
            hashlib.sha256(data).digest())
        with conn2.root()["big"].open() as f:
            assert f.read() == data
    finally:
        blobs.upload = real_upload
        db.close()


def test_reconnect_while_the_server_is_down_is_retryable(factory):
    import psycopg

    from tests.relay import Relay, check_outage
    params = psycopg.conninfo.conninfo_to_dict(POSTGRESQL_DSN)
    if str(params.get("host", "")).startswith("/"):
        pytest.skip("the test server is reached through a unix socket")
    relay = Relay((str(params.get("host") or "localhost"), int(params.get("port") or 5432)))
    # Trust authentication ignores the password; it must show nowhere.
    dsn = psycopg.conninfo.make_conninfo(POSTGRESQL_DSN, host="127.0.0.1",
                                         port=str(relay.port), password="hunter2")
    storage = open_storage(PostgreSQLOptions(dsn=dsn, schema=factory.path),
                           keep_history=factory.param.keep_history)
    try:
        check_outage(storage, relay, secret="hunter2")
    finally:
        storage.close()
        relay.close()


def test_a_port_where_nothing_listens_is_retryable_and_named():
    import psycopg

    from tests.relay import free_port
    port = free_port()
    dsn = psycopg.conninfo.make_conninfo(POSTGRESQL_DSN, host="127.0.0.1", port=str(port),
                                         password="hunter2", connect_timeout="5")
    with pytest.raises(ConnectionLost) as info:
        open_storage(PostgreSQLOptions(dsn=dsn))
    assert f"127.0.0.1:{port}" in str(info.value) and "hunter2" not in str(info.value)


def test_a_refused_login_is_not_retryable(factory):
    import psycopg
    dsn = psycopg.conninfo.make_conninfo(POSTGRESQL_DSN, dbname="zodbsql_no_such_database")
    with pytest.raises(DatabaseError) as info:
        open_storage(PostgreSQLOptions(dsn=dsn))
    assert not isinstance(info.value, ConnectionLost)
    assert "zodbsql_no_such_database" in str(info.value)


def test_options_repr_masks_the_password():
    options = PostgreSQLOptions(dsn="host=db user=zodb password=hunter2 dbname=zodb")
    assert "hunter2" not in repr(options) and "password=***" in repr(options)


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
def test_commits_are_logged_and_old_entries_go(keep_history: bool) -> None:
    """commit_log holds each commit (tid and nonce) for an hour of tids."""
    made = PostgreSQLFactory(Param("postgresql", keep_history))
    try:
        db = ZODB.DB(made.open())
        for n in range(3):
            with db.transaction() as conn:
                conn.root()["n"] = n
        last = u64(db.storage.lastTransaction())
        schema = made.path
        logged = made.admin.execute(
            f'SELECT tid, nonce FROM "{schema}".commit_log ORDER BY tid').fetchall()
        assert len(logged) == 4 and logged[-1][0] == last  # the root's creation too
        assert len({nonce for _, nonce in logged}) == 4
        # An entry an hour of tids older than a new commit is pruned by it.
        made.admin.execute(f'INSERT INTO "{schema}".commit_log VALUES (%s, 1)',
                           (last - (61 << 32),))
        with db.transaction() as conn:
            conn.root()["n"] = 4
        tids = [row[0] for row in made.admin.execute(
            f'SELECT tid FROM "{schema}".commit_log').fetchall()]
        assert len(tids) == 5 and min(tids) >= logged[0][0]
        db.close()
    finally:
        made.cleanup()


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
def test_a_database_made_before_commit_log_gets_it(keep_history: bool) -> None:
    made = PostgreSQLFactory(Param("postgresql", keep_history))
    try:
        made.open().close()
        schema = made.path
        # As a database made by an older zodbsql: no commit_log, the older procedures.
        made.admin.execute(f'DROP TABLE "{schema}".commit_log')
        made.admin.execute(f'DROP FUNCTION "{schema}".zodbsql_commit_log_window()')
        read_only = made.open(read_only=True)  # can't install anything, still reads
        read_only.close()
        db = ZODB.DB(made.open())
        try:
            with db.transaction() as conn:
                conn.root()["x"] = 1
            count = made.admin.execute(
                f'SELECT count(*) FROM "{schema}".commit_log').fetchone()
            assert count == (2,)  # the root, then x
        finally:
            db.close()  # before cleanup drops the schema, which an open session blocks
    finally:
        made.cleanup()


@contextlib.contextmanager
def made_older(keep_history: bool, *older: str) -> Iterator[tuple[PostgreSQLFactory, Any]]:
    """A database this zodbsql made, turned by the ``older`` statements (``{schema}``
    names its schema) into what an older zodbsql made, then opened again and committed
    to (``x``, a mapping): the factory and the open DB."""
    made = PostgreSQLFactory(Param("postgresql", keep_history))
    try:
        made.open().close()
        for statement in older:
            made.admin.execute(statement.format(schema=made.path))
        db = ZODB.DB(made.open())
        try:
            with db.transaction() as conn:
                conn.root()["x"] = PersistentMapping(a=1)
            yield made, db
        finally:
            db.close()  # before cleanup drops the schema, which an open session blocks
    finally:
        made.cleanup()


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
def test_a_database_made_before_stage_and_lock_gets_it(keep_history: bool) -> None:
    # As a database made by an older zodbsql: vote staged, then locked, in two calls.
    with made_older(keep_history,
                    'DROP FUNCTION "{schema}".zodbsql_stage_and_lock(BIGINT[], BIGINT[],'
                    ' BIGINT[], BIGINT[], BIGINT[], BYTEA[], TEXT[], BIGINT[], BIGINT[])'
                    ) as (made, db):
        installed = made.admin.execute(
            "SELECT count(*) FROM information_schema.routines WHERE routine_schema = %s"
            " AND routine_name = 'zodbsql_stage_and_lock'", (made.path,)).fetchone()
        assert installed == (1,)
        with db.transaction() as conn:
            assert conn.root()["x"]["a"] == 1


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
def test_a_database_made_before_generation_8_gets_its_procedures(keep_history: bool) -> None:
    """Procedures whose bodies changed (same signatures) come with a new generation
    marker; a database without it gets every body installed again at open, and loses
    the older marker."""
    # As a database made by an older zodbsql: generation 4's marker, vote's older body.
    with made_older(keep_history,
                    'DROP FUNCTION "{schema}".zodbsql_procedures_8()',
                    'CREATE FUNCTION "{schema}".zodbsql_procedures_4() RETURNS INTEGER'
                    " LANGUAGE sql IMMUTABLE AS 'SELECT 4'",
                    'CREATE OR REPLACE FUNCTION "{schema}".zodbsql_lock_objects('
                    'p_read_oids BIGINT[], p_read_tids BIGINT[]) RETURNS TABLE (zoid BIGINT,'
                    ' expected BIGINT, actual BIGINT, kind "char") LANGUAGE sql AS'
                    " 'SELECT 0::BIGINT, 0::BIGINT, 0::BIGINT, ''w''::\"char\" WHERE false'"
                    ) as (made, db):
        bodies: dict[str, str] = dict(made.admin.execute(
            "SELECT proname, prosrc FROM pg_proc p JOIN pg_namespace n"
            " ON n.oid = p.pronamespace WHERE n.nspname = %s"
            " AND p.proname IN ('zodbsql_lock_objects', 'zodbsql_finish')",
            (made.path,)).fetchall())
        assert "ANY(v_zoids)" in bodies["zodbsql_lock_objects"]
        assert "LEFT JOIN found" in bodies["zodbsql_lock_objects"]
        assert "zodbsql.existing" in bodies["zodbsql_lock_objects"]
        assert "zodbsql.existing" in bodies["zodbsql_finish"]
        markers = made.admin.execute(
            "SELECT proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = %s AND p.proname LIKE 'zodbsql_procedures_%%'",
            (made.path,)).fetchall()
        assert markers == [("zodbsql_procedures_8",)]
        with db.transaction() as conn:  # the new bodies commit
            conn.root()["y"] = PersistentMapping()
        with db.transaction() as conn:
            assert conn.root()["x"]["a"] == 1 and len(conn.root()["y"]) == 0

#: Objects in the database of the test below: enough that reading every row costs the
#: planner more than a few index lookups, few enough to make in a second or two.
SCANNED_OBJECTS = 20_000


def table_counts(made: PostgreSQLFactory, tables: list[str],
                 columns: list[str]) -> list[list[int]]:
    """``columns`` of ``pg_stat_user_tables`` (counters named in the tests, never
    input) for each of the schema's ``tables``, counted by the server so far, read after
    the sessions that made them closed: a session's counts reach the statistics when it
    ends, a moment after the client closed it, so the figures are read until they stay
    the same for a second (at most 12 s)."""
    def read() -> list[list[int]]:
        made.admin.execute("SELECT pg_stat_clear_snapshot()")
        rows = {row[0]: [int(value) for value in row[1:]] for row in made.admin.execute(
            f"SELECT relname, {', '.join(columns)} FROM pg_stat_user_tables"
            " WHERE schemaname = %s", (made.path,)).fetchall()}
        return [rows[table] for table in tables]
    seen, since, deadline = read(), time.monotonic(), time.monotonic() + 12
    while time.monotonic() < deadline and time.monotonic() - since < 1.0:
        time.sleep(0.2)
        now = read()
        if now != seen:
            seen, since = now, time.monotonic()
    return seen


def sequential_scans(made: PostgreSQLFactory, tables: list[str]) -> list[int]:
    """Sequential scans of the schema's ``tables`` so far (``table_counts``)."""
    return [scans for scans, in table_counts(made, tables, ["seq_scan"])]


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
def test_a_small_commit_reads_no_table_through(keep_history: bool) -> None:
    """Vote locks the rows of the objects a commit changes, and a history-free finish
    replaces their states, through the primary keys.  Written as joins with the
    staging tables, which have no statistics, the planner guessed 810 staged rows and
    scanned the whole table instead: 7.8 ms of every commit at 97,000 objects
    (against 0.14 ms), which made a loading site slow down as it grew (the soak)."""
    made = PostgreSQLFactory(Param("postgresql", keep_history))
    try:
        db = ZODB.DB(made.open())
        try:
            with db.transaction() as conn:
                root = conn.root()
                for i in range(SCANNED_OBJECTS):
                    root[i] = PersistentMapping(a=i)
        finally:
            db.close()
        for table in ("object_state", "current_object"):
            if keep_history or table != "current_object":
                made.admin.execute(f'ANALYZE "{made.path}".{table}')
        # History-preserving, the polls of the commits read object_state by tid.
        tables = ["current_object", "object_state"] if keep_history else ["object_state"]

        def scans() -> list[int]:
            return sequential_scans(made, tables)

        before = scans()
        made.open(prefetch_count=0).close()     # what opening and closing scan
        opened = scans()
        # Loads one by one: a prefetch's walk may read the references through (its
        # plans are the planner's to choose); what is counted here is the commits'.
        db = ZODB.DB(made.open(prefetch_count=0))
        try:
            for round in range(3):
                with db.transaction() as conn:
                    for i in (5, 500, 5000):
                        conn.root()[i]["a"] = -round
        finally:
            db.close()
        after = scans()
        # Opening may scan (it counts); the commits themselves add nothing.
        assert [a - o for a, o in zip(after, opened)] == [o - b for o, b in zip(opened, before)]
    finally:
        made.cleanup()


#: Rows the test below puts in object_state: enough for PostgreSQL 15 to plan a
#: parallel sequential scan of "tid > x" on a table without statistics.
UNANALYZED_ROWS = 500_000


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
def test_the_poll_reads_revisions_by_index_before_any_statistics(keep_history: bool) -> None:
    """A table just filled has no statistics until autovacuum's ANALYZE: "tid > x" was
    then estimated at a third of object_state, and every poll scanned all of it (68 ms
    at 1,000,000 objects; the bench's empty commits at two processes fell from 921 to
    199 a second).  Closed above by the last tid, the range is read through the index.
    (The table is filled by SQL, with revisions older than any commit: the polls after
    a tid never name them.)"""
    made = PostgreSQLFactory(Param("postgresql", keep_history))
    try:
        db = ZODB.DB(made.open(prefetch_count=0))
        try:
            with db.transaction() as conn:
                for i in range(3):
                    conn.root()[i] = PersistentMapping(a=i)
            table = f'"{made.path}".object_state'
            made.admin.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            made.admin.execute(
                f"INSERT INTO {table} (zoid, tid, checksum, state_size, state)"
                " SELECT 1000000000 + g, 1 + g / 1000, 0, 1, '\\x00'::bytea"
                " FROM generate_series(0, %s) g", (UNANALYZED_ROWS - 1,))
            assert made.admin.execute(
                "SELECT last_analyze, last_autoanalyze FROM pg_stat_user_tables"
                " WHERE schemaname = %s AND relname = 'object_state'",
                (made.path,)).fetchone() == (None, None)
            other = ZODB.DB(made.open(prefetch_count=0))   # opening may scan
            before = tuples_scanned(made, "object_state")
            try:
                for round in range(3):
                    with db.transaction() as conn:
                        conn.root()[round]["a"] = -1
                    with other.transaction() as conn:   # polls past the commit
                        assert conn.root()[round]["a"] == -1
            finally:
                other.close()
        finally:
            db.close()
        # What sequential scans read: a poll that scanned the table read all its rows.
        assert tuples_scanned(made, "object_state") - before < UNANALYZED_ROWS
    finally:
        made.cleanup()


def tuples_scanned(made: PostgreSQLFactory, table: str) -> int:
    """The rows of ``table`` read by sequential scans so far (``table_counts``)."""
    return table_counts(made, [table], ["seq_tup_read"])[0][0]


def test_current_object_has_no_index_but_its_key_and_room_for_hot_updates() -> None:
    """A commit updates current_object's row of every object it changes: with no index
    on tid (the poll reads object_state's) and a fillfactor that leaves room on each
    page, the update is HOT (no index entry); counted here by the server."""
    made = PostgreSQLFactory(Param("postgresql", True))
    try:
        db = ZODB.DB(made.open())
        try:
            with db.transaction() as conn:
                for i in range(200):
                    conn.root()[i] = PersistentMapping(a=i)
            indexes = [name for name, in made.admin.execute(
                "SELECT indexname FROM pg_indexes WHERE schemaname = %s"
                " AND tablename = 'current_object'", (made.path,))]
            assert indexes == ["current_object_pkey"]
            row = made.admin.execute(
                "SELECT reloptions FROM pg_class c JOIN pg_namespace n"
                " ON n.oid = c.relnamespace WHERE n.nspname = %s"
                " AND c.relname = 'current_object'", (made.path,)).fetchone()
            assert row is not None
            options = row[0]
            assert options == ["fillfactor=70"]
            for round in range(3):
                with db.transaction() as conn:
                    for i in range(0, 200, 4):
                        conn.root()[i]["a"] = -round
        finally:
            db.close()
        updated, hot = updates(made, "current_object")
        assert updated >= 150 and hot == updated, (updated, hot)
    finally:
        made.cleanup()


def updates(made: PostgreSQLFactory, table: str) -> tuple[int, int]:
    """The rows of ``table`` updated so far, and of those the HOT ones (``table_counts``)."""
    updated, hot = table_counts(made, [table], ["n_tup_upd", "n_tup_hot_upd"])[0]
    return updated, hot


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
def test_vote_checks_read_current_objects_through_the_primary_key(keep_history: bool) -> None:
    """A session's vote plans its statements once (PL/pgSQL caches them), while the
    table may still be small.  Joined with unnest, the check of the objects read-current
    was planned as a scan of the whole table then and kept scanning as the table grew:
    a loading process's vote went from 2 to 11 ms in 45 s.  Here the plans are made at
    a handful of objects, the table grows to SCANNED_OBJECTS in another session, and
    the same session's vote must still read no table through."""
    import psycopg
    from zodbsql.backends.postgresql.mover import CREATE_TEMP_TABLES
    made = PostgreSQLFactory(Param("postgresql", keep_history))
    session = None
    try:
        db = ZODB.DB(made.open())
        try:
            with db.transaction() as conn:
                conn.root()["small"] = PersistentMapping()
            session = psycopg.connect(made.dsn, autocommit=True)
            session.execute(f'SET search_path TO "{made.path}"')
            for statement in CREATE_TEMP_TABLES:
                session.execute(statement)
            current = "current_object" if keep_history else "object_state"
            oids, tids = zip(*session.execute(
                f"SELECT zoid, tid FROM {current} ORDER BY zoid").fetchall())

            def seq_scans() -> int:
                row = session.execute(
                    "SELECT seq_scan FROM pg_stat_xact_user_tables"
                    " WHERE schemaname = %s AND relname = %s",
                    (made.path, current)).fetchone()
                return int(row[0]) if row else 0

            def vote_scans() -> int:
                # Counted from within the transaction: PostgreSQL 15 shows a session's
                # counts not yet sent to the statistics (the SELECT above, up to 10 s
                # before) in pg_stat_xact_* too.
                with session.transaction(force_rollback=True):
                    before = seq_scans()
                    session.execute("SELECT * FROM zodbsql_lock_objects(%s, %s)",
                                    (list(oids), list(tids))).fetchall()
                    return seq_scans() - before

            for _ in range(8):          # past PL/pgSQL's five custom plans
                vote_scans()
            with db.transaction() as conn:
                for i in range(SCANNED_OBJECTS):
                    conn.root()[i] = PersistentMapping(a=i)
            assert vote_scans() == 0
        finally:
            db.close()
    finally:
        if session is not None:
            session.close()
        made.cleanup()


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
def test_an_empty_commit_whose_answer_is_lost(keep_history: bool, applied: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty commit is one statement in autocommit, its own transaction: when its
    answer is lost, commit_log says whether it happened, and gives its tid."""
    from ZODB.Connection import TransactionMetaData

    from tests.storage.test_commit_outcome import LoseCommit
    made = PostgreSQLFactory(Param("postgresql", keep_history))
    try:
        storage = made.open()
        try:
            before = storage.lastTransaction()
            lost = LoseCommit(monkeypatch, storage, applied=applied)
            txn = TransactionMetaData(description=b"nothing stored")
            storage.tpc_begin(txn)
            storage.tpc_vote(txn)
            if applied:
                tid = storage.tpc_finish(txn)
                assert lost.left == 0, "the fault was never injected"
                assert u64(tid) > u64(before) and storage.lastTransaction() == tid
                logged = made.admin.execute(
                    f'SELECT count(*) FROM "{made.path}".commit_log WHERE tid = %s',
                    (u64(tid),)).fetchone()
                assert logged == (1,)
                if keep_history:
                    found = [t.description for t in storage.iterator(tid, tid)]
                    assert found == [b"nothing stored"]
            else:
                with pytest.raises(ConnectionLost, match="confirms was not committed"):
                    storage.tpc_finish(txn)
                storage.tpc_abort(txn)
                assert lost.left == 0, "the fault was never injected"
                last = made.admin.execute(
                    f'SELECT last_tid FROM "{made.path}".commit_row').fetchone()
                assert last == (u64(before),)
        finally:
            storage.close()
    finally:
        made.cleanup()


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
def test_a_small_commit_sends_its_states_inline_byte_for_byte(keep_history: bool) -> None:
    """A small commit's vote goes with BEGIN as one query, its states as SQL literals:
    every byte value, quotes and backslashes included, must come back as it was."""
    made = PostgreSQLFactory(Param("postgresql", keep_history))
    try:
        db = ZODB.DB(made.open())
        try:
            every_byte = bytes(range(256)) + b"'\\\"{},NULL" + bytes(range(255, -1, -1))
            with db.transaction() as conn:
                conn.root()["data"] = PersistentMapping(raw=every_byte, text="é'\\")
            storage = db.storage
            before = storage.statement_count()
            with db.transaction() as conn:
                conn.root()["data"]["again"] = every_byte[::3]
            if keep_history:    # the vote's one query and finish's; no poll after them
                assert storage.statement_count() - before == 2
        finally:
            db.close()
        fresh = ZODB.DB(made.open())
        try:
            with fresh.transaction() as conn:
                data = conn.root()["data"]
                assert (data["raw"], data["text"]) == (every_byte, "é'\\")
                assert data["again"] == every_byte[::3]
        finally:
            fresh.close()
    finally:
        made.cleanup()


def traced_votes(caplog: pytest.LogCaptureFixture, storage: Any,
                 commit: Callable[[Any], None]) -> list[str]:
    """The SQL trace's lines of the votes ``commit(storage)`` sends (``sql-trace``)."""
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="zodbsql.sql"):
        commit(storage)
    return [record.getMessage() for record in caplog.records
            if record.name == "zodbsql.sql" and "zodbsql_stage_and_lock" in
            record.getMessage()]


def commit_state_of(size: int) -> Callable[[Any], None]:
    """A commit of one new object whose stored state takes exactly ``size`` bytes."""
    def commit(storage: Any) -> None:
        length = size
        while len(zodb_pickle(MinPO(b"x" * length))) > size:
            length -= 1
        data = zodb_pickle(MinPO(b"x" * length))
        assert len(data) == size
        txn = begin(storage)
        storage.store(storage.new_oid(), z64, data, "", txn)
        storage.tpc_vote(txn)
        storage.tpc_finish(txn)
    return commit


@pytest.mark.parametrize("seconds, millis", [(2.0, 2000), (0.0004, 1)])
def test_a_small_commits_lock_wait_is_its_setting_in_milliseconds(
        caplog: pytest.LogCaptureFixture, seconds: float, millis: int) -> None:
    """The inline vote's BEGIN bounds the row locks' wait at row-lock-timeout, in whole
    milliseconds and never 0 (which would be no bound at all)."""
    made = PostgreSQLFactory(Param("postgresql", True))
    try:
        storage = made.open(sql_trace=True, row_lock_timeout=seconds)
        [vote] = traced_votes(caplog, storage, commit_state_of(100))
        assert f": BEGIN; SET LOCAL lock_timeout = {millis}; SELECT" in vote, vote
    finally:
        made.cleanup()


@pytest.mark.parametrize("size, inline", [(8192, True), (8193, False)])
def test_commits_up_to_inline_bytes_go_inline_with_begin(
        caplog: pytest.LogCaptureFixture, size: int, inline: bool) -> None:
    """INLINE_BYTES is the largest commit sent inline: its states as literals with BEGIN
    in one query; one byte more and BEGIN goes first, the states in binary after it."""
    from zodbsql.backends.postgresql.locker import INLINE_BYTES
    assert INLINE_BYTES == 8192
    made = PostgreSQLFactory(Param("postgresql", True))
    try:
        storage = made.open(sql_trace=True)
        [vote] = traced_votes(caplog, storage, commit_state_of(size))
        assert ("BEGIN; SET LOCAL lock_timeout" in vote) == inline, vote
    finally:
        made.cleanup()


def test_a_small_commits_vote_is_traced_without_its_values(
        caplog: pytest.LogCaptureFixture) -> None:
    """The inline vote carries the states as literals in its text; the SQL trace shows
    the statement with its placeholders and the number of its parameters, never them."""
    from zodbsql.backends.postgresql.locker import STAGE_AND_LOCK
    made = PostgreSQLFactory(Param("postgresql", True))
    try:
        db = ZODB.DB(made.open(sql_trace=True))
        try:
            marker = "zz-marker-of-the-state"
            with caplog.at_level(logging.DEBUG, logger="zodbsql.sql"):
                with db.transaction() as conn:
                    conn.root()["traced"] = PersistentMapping(text=marker)
        finally:
            db.close()
        lines = [record.getMessage() for record in caplog.records
                 if record.name == "zodbsql.sql"]
        votes = [line for line in lines if "zodbsql_stage_and_lock" in line]
        assert len(votes) == 1
        assert votes[0].endswith(f"; {STAGE_AND_LOCK} (9 parameters)"), votes[0]
        assert ": BEGIN; SET LOCAL lock_timeout = " in votes[0]
        assert not [line for line in lines if marker in line]
    finally:
        made.cleanup()



def test_integer_arrays_reach_the_server_as_they_are(factory):
    """The staging call's integer columns travel as array text (``bigint_array``): each
    value as it is, NULL where a value is None (a deletion's checksum, a state that
    copies no older one), whatever the others hold."""
    storage = factory.open()
    conn = storage.shared.backend.connect()
    try:
        for values in ([1, None, -2, 2**63 - 1], [None, None], [5, 7], []):
            (back,), = conn.fetchall("SELECT %t::BIGINT[]", [bigint_array(values)])
            assert back == values
    finally:
        conn.close()
        storage.close()


def test_a_schema_is_dropped_past_a_session_left_in_it(factory):
    """The test factories' cleanup: a session a test left holding a lock in its schema
    (an open read transaction) is ended, with a warning, and the schema dropped; it
    stalled DROP SCHEMA for ever."""
    import psycopg

    from tests.databases import drop_postgresql_schema
    schema = factory.new_path()
    storage = factory.open(schema)
    storage.close()
    left = psycopg.connect(POSTGRESQL_DSN)          # a transaction left open
    left.execute(f'SELECT count(*) FROM "{schema}".object_state').fetchone()
    with pytest.warns(UserWarning, match="1 session"):
        drop_postgresql_schema(factory.admin, schema)
    found = factory.admin.execute(
        "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    assert found == (0,)
    with pytest.raises(psycopg.OperationalError):
        left.execute("SELECT 1")                    # it was ended
    left.close()


def where(options: PostgreSQLOptions) -> str:
    return str(options.create_backend(True, 10.0).describe())


def test_a_schema_that_does_not_exist_is_named_and_not_made() -> None:
    """zodbsql makes tables, not schemas: a missing one is named, as is a search_path
    that names none that exists; nothing is created."""
    factory = PostgreSQLFactory(Param("postgresql", True))
    try:
        missing = f"{factory.path}_missing"
        options = PostgreSQLOptions(dsn=POSTGRESQL_DSN, schema=missing)
        with pytest.raises(SchemaError) as info:
            open_storage(options)
        assert str(info.value) == (
            f"{where(options)}: schema {missing!r} does not exist; create it first"
            " (CREATE SCHEMA), zodbsql creates tables, not schemas")
        on_path = PostgreSQLOptions(dsn=f"{POSTGRESQL_DSN} options='-c search_path={missing}'")
        with pytest.raises(SchemaError) as info:
            open_storage(on_path)
        assert str(info.value) == (
            f"{where(on_path)}: no schema of the search_path exists; create one first"
            " (CREATE SCHEMA), zodbsql creates tables, not schemas")
        made = factory.admin.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s",
                                     (missing,)).fetchone()
        assert made == (0,)
    finally:
        factory.cleanup()


def test_a_history_free_database_made_before_commit_log_loses_its_older_finish() -> None:
    """Its finish function took no nonce; the new one (commit_log's) does. The older
    one is dropped when the procedures are installed again, not left as an overload."""
    older_finish = (
        'CREATE FUNCTION "{schema}".zodbsql_finish(BIGINT, BIGINT, BYTEA, BYTEA, BYTEA,'
        " BOOLEAN, INTEGER, BOOLEAN) RETURNS BIGINT LANGUAGE sql AS 'SELECT 0::BIGINT'")
    with made_older(False, 'DROP FUNCTION "{schema}".zodbsql_commit_log_window()',
                    older_finish) as (made, db):
        arguments = made.admin.execute(
            "SELECT pronargs FROM pg_proc WHERE proname = 'zodbsql_finish' AND pronamespace"
            " = (SELECT oid FROM pg_namespace WHERE nspname = %s)", (made.path,)).fetchall()
        assert arguments == [(9,)]
        with db.transaction() as conn:
            assert conn.root()["x"]["a"] == 1
