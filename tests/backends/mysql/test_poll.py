"""MySQL's poll sends a commit's oids as one JSON array (backends/mysql/poller.py): every
session lifts the cut MariaDB makes at group_concat_max_len, and a poll whose array was
cut all the same is taken as everything changed, never as the objects it listed."""
from __future__ import annotations

import logging
from typing import Any, Iterator

import pytest
from ZODB.utils import u64

from tests.databases import BACKENDS, MySQLFactory, Param
from tests.storage.test_poll_limit import _commit

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
        assert backend.driver_name == driver
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
        assert "raise max_allowed_packet" in caplog.text
        conn.rollback()
    finally:
        conn.close()
