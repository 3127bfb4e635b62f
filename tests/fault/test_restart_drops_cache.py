"""A MariaDB restart drops what the storage cached before it (backends/mysql/adapter.py:
``_note_start``).  InnoDB shows a commit to other sessions before its log is on disk,
so a crash can lose a commit a process already read; states cached from before the
restart could then name data the database no longer holds, and a commit based on them
would write it back.  Private server only: the test kills it."""
from __future__ import annotations

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping

from tests.fault.conftest import MakeScratch
from tests.fault.servers import PrivateServer
from tests.fault.targets import private_address
from zodbsql.api import open_storage
from zodbsql.backends.mysql.serverstart import ServerStart
from zodbsql.errors import ConnectionLost

pytestmark = pytest.mark.fault


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
def test_a_restart_drops_what_was_cached_before(keep_history: bool,
                                                request: pytest.FixtureRequest,
                                                make_scratch: MakeScratch) -> None:
    server: PrivateServer = request.getfixturevalue("private_mariadb")
    server.ensure_running()
    scratch = make_scratch("mysql", private_address(server))
    db = ZODB.DB(open_storage(scratch.url(keep_history)))
    try:
        tm = transaction.TransactionManager()
        conn = db.open(tm)
        conn.root()["item"] = PersistentMapping(value=1)
        tm.commit()
        shared = db.storage.shared
        generation, resets = shared.backend.server_generation, shared.resets
        assert len(shared.cache) > 0
        # (Down long enough that the new start is certainly after the old one, even
        # for a server the fixture has just started: ``Uptime`` counts whole seconds.)
        server.restart(down_seconds=3.0)
        # The first statement on a connection from before fails (ConnectionLost, which
        # a retry loop retries); the new connection finds the server restarted.
        for _ in range(5):
            try:
                tm.begin()
                value = conn.root()["item"]["value"]
                break
            except ConnectionLost:
                tm.abort()
        else:
            pytest.fail("no transaction could start after the restart")
        assert value == 1
        assert shared.backend.server_generation == generation + 1
        assert shared.resets == resets + 1          # the cache was emptied, once
        tm.abort()
        for attempt in tm.attempts(5):      # (the commit's pooled connection is from before)
            with attempt:
                conn.root()["item"]["value"] = 3
        conn.close()
    finally:
        db.close()
    check = ZODB.DB(open_storage(scratch.url(keep_history)))
    try:
        with check.transaction() as connection:
            assert connection.root()["item"]["value"] == 3
    finally:
        check.close()


def test_only_a_start_wholly_after_the_last_one_is_a_restart(
        caplog: pytest.LogCaptureFixture) -> None:
    """A connection to the same server (overlapping start intervals, or a start read as
    a little later by a stalled client) does not count; a later start does, once."""
    from zodbsql.backends.mysql.adapter import MySQLBackend
    backend = MySQLBackend.__new__(MySQLBackend)
    import threading
    backend._started, backend._start_lock = None, threading.Lock()
    backend.server_generation = 0
    backend.describe = lambda: "MySQL database 'x'"    # type: ignore[method-assign]
    backend._note_start(ServerStart(100.0, 101.2))
    backend._note_start(ServerStart(100.4, 101.0))      # the same start, read again
    backend._note_start(ServerStart(101.5, 102.0))      # within the margin: not certain
    assert backend.server_generation == 0
    backend._note_start(ServerStart(105.0, 106.0))
    assert backend.server_generation == 1
    backend._note_start(ServerStart(105.2, 106.1))
    backend._note_start(ServerStart(50.0, 51.0))        # an older node, or a clock step back
    assert backend.server_generation == 1
    backend._note_start(ServerStart(200.0, 201.0))      # a second restart
    assert backend.server_generation == 2
    # One warning a restart, the first one's included.
    assert caplog.messages == 2 * [
        "MySQL database 'x' restarted (it started after the last connection's server did):"
        " what was read before it is dropped"]
