"""MySQL's poll sends a commit's oids as one JSON array (backends/mysql/poller.py): every
session lifts the cut MariaDB makes at group_concat_max_len, and a poll whose array was
cut all the same is taken as everything changed, never as the objects it listed."""
from __future__ import annotations

import logging
from typing import Any, Iterator

import pytest
from ZODB.utils import u64

from tests.databases import BACKENDS, MySQLFactory, Param
from tests.model.nodes import node_state
from tests.storage.test_gone import ROOT, _garbage as garbage, _pack as pack
from tests.storage.test_gone import _commit as gone_commit
from tests.storage.test_poll_limit import _commit
from zodbsql.backends.mysql.adapter import MySQLBackend
from zodbsql.backends.mysql.connections import CAUSAL_READ, MySQLConnection
from zodbsql.backends.mysql.poller import CUT_ARRAY

pytestmark = pytest.mark.skipif(
    "mysql" not in BACKENDS, reason="mysql is not in ZODBSQL_TEST_BACKENDS")


@pytest.fixture(params=[True, False], ids=["history-preserving", "history-free"])
def factory(request: Any, tmp_path: Any) -> Iterator[MySQLFactory]:
    made = MySQLFactory(Param("mysql", request.param), tmp_path)
    yield made
    made.cleanup()


@pytest.mark.parametrize("driver", ["mysqlclient", "pymysql"])
def test_every_session_lifts_the_cut_at_group_concat_max_len(driver: str,
                                                             tmp_path: Any) -> None:
    made = MySQLFactory(Param("mysql", True), tmp_path, driver=driver)
    try:
        backend = made.open().shared.backend
        assert isinstance(backend, MySQLBackend) and backend.driver_name == driver
        conn = backend.connect()
        try:
            assert conn.fetchone("SELECT @@SESSION.group_concat_max_len") == (1 << 30,)
        finally:
            conn.close()
    finally:
        made.cleanup()


def test_a_cut_array_is_taken_as_everything_changed(factory: MySQLFactory,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    storage = factory.open()
    since = u64(storage.lastTransaction())
    oids = [storage.new_oid() for _ in range(40)]
    tid = u64(_commit(storage, {oid: b"state" for oid in oids}))
    poller = storage.shared.backend.poller
    conn = storage.shared.backend.connect()
    try:
        polled = poller.poll(conn, since)
        assert sorted(polled.changes) == sorted((u64(oid), tid) for oid in oids)
        conn.rollback()
        # 40 oids of a byte or more and their commas: past 60 bytes.
        conn.execute("SET SESSION group_concat_max_len = 60")
        with caplog.at_level(logging.WARNING, logger="zodbsql.backends.mysql.poller"):
            polled = poller.poll(conn, since)
        assert (polled.upto, polled.changes, polled.truncated) == (tid, [], True)
        assert caplog.messages == [CUT_ARRAY]
        conn.rollback()
    finally:
        conn.close()


def test_a_causal_poll_reads_what_the_plain_one_reads(factory: MySQLFactory) -> None:
    """On a Galera node a history-preserving poll waits for the cluster's commits first
    (``conn.causal``).  A single MariaDB server takes the same prefix (wsrep_sync_wait
    is its variable too, unused): the poll sent with it gives the plain poll's answer,
    after packs that recorded deletions and pruned the first record (as in
    tests/storage/test_gone.py), for each deletion number and limit; the first poll,
    without a tid, reads the last tid alone."""
    storage = factory.open()
    writer = storage.new_instance()
    gone_commit(writer, {ROOT: node_state(0, set())})
    garbage(writer, 1)
    since = u64(writer.lastTransaction())
    pack(storage)
    for value in (100, 200):
        garbage(writer, value)
        pack(storage)
    gone_commit(writer, {writer.new_oid(): node_state(value, set()) for value in (5, 6)})
    poller = storage.shared.backend.poller
    plain = storage.shared.backend.connect()
    causal = storage.shared.backend.connect()
    assert isinstance(causal, MySQLConnection)
    causal.causal = CAUSAL_READ
    sent: list[str] = []
    fetchall = causal.fetchall

    def recorded(sql: str, params: Any = ()) -> Any:
        sent.append(sql)
        return fetchall(sql, params)
    causal.fetchall = recorded   # type: ignore[method-assign,assignment]
    try:
        polls = {}
        for gone_since, limit in ((None, 0), (2, 0), (None, 1), (2, 1)):
            expected = poller.poll(plain, since, gone_since, limit)
            found = poller.poll(causal, since, gone_since, limit)
            # (An array's order is the server's.)
            assert found._replace(changes=sorted(found.changes)) == expected._replace(
                changes=sorted(expected.changes))
            polls[gone_since, limit] = found
            plain.rollback()
            causal.rollback()
        # The answers differ as the arguments do: the first record pruned makes the
        # poll by tid incomplete, the records after number 2 are one of two.
        assert (polls[None, 0].complete, polls[2, 0].complete) == (False, True)
        assert (len(polls[None, 0].gone), len(polls[2, 0].gone)) == (2, 1)
        assert polls[None, 1].truncated and not polls[None, 0].truncated
        # The prefix where the snapshot is the poll's tid: history-preserving.
        assert all(sql.startswith(CAUSAL_READ) for sql in sent) == factory.param.keep_history
        assert all(sql.count(CAUSAL_READ) <= 1 for sql in sent)
        assert poller.poll(causal, None) == poller.poll(plain, None)
    finally:
        plain.close()
        causal.close()
