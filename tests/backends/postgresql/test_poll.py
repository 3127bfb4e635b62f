"""A history-free transaction start on PostgreSQL: its BEGIN and poll go as one query."""
from __future__ import annotations

import logging
from typing import Any, Iterator

import pytest
import transaction
from ZODB.tests.MinPO import MinPO
from ZODB.tests.StorageTestBase import zodb_pickle
from ZODB.utils import z64

from tests.databases import BACKENDS, Param, PostgreSQLFactory
from zodbsql.backends.base import trace
from zodbsql.backends.base.poller import Poller
from zodbsql.backends.postgresql.connections import BEGIN_READ
from zodbsql.backends.postgresql.poller import PostgreSQLPoller
from zodbsql.errors import ConnectionLost, DatabaseError

pytestmark = pytest.mark.skipif(
    "postgresql" not in BACKENDS,
    reason="postgresql is not in ZODBSQL_TEST_BACKENDS")


@pytest.fixture
def factory() -> Iterator[PostgreSQLFactory]:
    made = PostgreSQLFactory(Param("postgresql", False))
    yield made
    made.cleanup()


def commit(storage: Any, changes: dict[bytes, tuple[bytes, int]]) -> bytes:
    """Store ``{oid: (previous tid, value)}`` in one transaction; return its tid."""
    txn = transaction.Transaction()
    storage.tpc_begin(txn)
    for oid, (serial, value) in changes.items():
        storage.store(oid, serial, zodb_pickle(MinPO(value)), "", txn)
    storage.tpc_vote(txn)
    return storage.tpc_finish(txn)


def test_a_start_is_one_statement_after_the_rollback(factory: PostgreSQLFactory,
                                                     caplog: pytest.LogCaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "SHOWN", 2000)     # the poll's whole text in the log
    storage = factory.open(sql_trace=True)
    oid = storage.new_oid()
    commit(storage, {oid: (z64, 1)})
    storage.poll_invalidations()
    before = storage.statement_count()
    with caplog.at_level(logging.DEBUG, logger="zodbsql.sql"):
        storage.poll_invalidations()
    sent = [record.getMessage().split(": ", 1)[1] for record in caplog.records
            if record.name == "zodbsql.sql"]
    assert [statement.split(";")[0] for statement in sent] == ["ROLLBACK (0 parameters)",
                                                               BEGIN_READ]
    polled, gone = storage._polled, storage._gone_seen
    assert (f"FROM object_state WHERE tid > {polled}"
            " AND tid <= (SELECT last_tid FROM commit_row) LIMIT 100001) AS changed"
            " GROUP BY tid UNION ALL") in sent[1]
    assert sent[1].endswith(f"FROM gone_oids WHERE seq > {gone} AND tid >= 0"
                            " (0 parameters)")
    assert storage.statement_count() - before == 2
    assert storage._load is not None and storage._load.in_transaction and storage._read_txn


def test_the_snapshot_is_the_polls(factory: PostgreSQLFactory) -> None:
    """A commit after the poll is not seen by the loads of that start; the next sees it."""
    reader = factory.open()
    writer = factory.open()
    oid = writer.new_oid()
    first = commit(writer, {oid: (z64, 1)})
    reader.poll_invalidations()
    assert reader.load(oid)[1] == first
    reader.poll_invalidations()                  # a start: the read transaction begins
    second = commit(writer, {oid: (first, 2)})
    reader.shared.cache.clear()                  # the load goes to the database
    assert reader.load(oid)[1] == first          # the snapshot is the poll's
    assert reader.poll_invalidations() == [oid]
    assert reader.load(oid)[1] == second


def test_the_poll_finds_what_the_two_statements_found(factory: PostgreSQLFactory) -> None:
    storage = factory.open()
    oids = [storage.new_oid() for _ in range(3)]
    first = commit(storage, {oid: (z64, 0) for oid in oids})
    commit(storage, {oids[1]: (first, 1)})
    poller = storage.shared.backend.poller
    assert isinstance(poller, PostgreSQLPoller)
    conn = storage.shared.connect()
    try:
        for since in (None, 0, int.from_bytes(first, "big")):
            polled, sent = [], []
            for begin_and_poll in (Poller.begin_and_poll, PostgreSQLPoller.begin_and_poll):
                before = conn.statements
                polled.append(begin_and_poll(poller, conn, since, None, False, 0))
                sent.append(conn.statements - before)
                assert conn.in_transaction
                conn.rollback()
            assert polled[0] == polled[1], since
            assert sent == [2, 1]
    finally:
        conn.close()


def test_a_failed_query_leaves_the_transaction_to_roll_back(factory: PostgreSQLFactory) -> None:
    storage = factory.open()
    conn = storage.shared.connect()
    try:
        before = conn.statements
        with pytest.raises(DatabaseError) as raised:
            getattr(conn, "begin_read_fetchall")("SELECT 1 / 0", end_first=False)
        # BEGIN ran, the query failed: as after begin_read and a failed fetchall.
        assert "division by zero" in str(raised.value)
        assert conn.in_transaction and not conn.broken
        assert conn.statements - before == 1
        conn.rollback()
        assert conn.raw.info.transaction_status.name == "IDLE"
        # Text the server can't parse fails whole: BEGIN never ran.
        with pytest.raises(DatabaseError):
            getattr(conn, "begin_read_fetchall")("SELEC 1", end_first=False)
        assert not conn.in_transaction
        assert conn.raw.info.transaction_status.name == "IDLE"
        assert getattr(conn, "begin_read_fetchall")("SELECT 7", end_first=False) == [(7,)]
    finally:
        conn.close()


def test_a_start_on_a_lost_connection_reconnects_at_the_next(factory: PostgreSQLFactory) -> None:
    storage = factory.open()
    oid = storage.new_oid()
    tid = commit(storage, {oid: (z64, 1)})
    storage.poll_invalidations()
    storage._end_read_txn()
    assert storage._load is not None
    factory.admin.execute("SELECT pg_terminate_backend(%s)",
                          (storage._load.raw.info.backend_pid,))
    with pytest.raises(ConnectionLost):
        storage.poll_invalidations()
    assert storage._load.broken
    assert storage.poll_invalidations() == []
    assert storage.load(oid)[1] == tid
