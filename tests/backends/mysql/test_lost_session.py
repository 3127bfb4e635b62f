"""After a lost COMMIT, MySQL's settle ends the old session and no other (txncontrol.py).

Each test opens its own sessions on the test server and kills none but its own: the
committing session whose COMMIT is taken as lost, and, as the session a restart could
have given the same id, another one of its own that must survive.
"""
from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

from tests.databases import BACKENDS, MySQLFactory, Param
from zodbsql.backends.mysql import serverstart
from zodbsql.backends.mysql.connections import MySQLConnection
from zodbsql.backends.mysql.serverstart import ServerStart

pytestmark = pytest.mark.skipif(
    "mysql" not in BACKENDS, reason="mysql is not in ZODBSQL_TEST_BACKENDS")

ALIVE = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s"


@pytest.fixture
def backend(tmp_path: Any) -> Iterator[Any]:
    factory = MySQLFactory(Param("mysql", True), tmp_path)
    storage = factory.open()
    yield storage.shared.backend
    factory.cleanup()


def _alive(probe: Any, session: int) -> bool:
    row = probe.fetchone(ALIVE, (session,))
    return bool(row and int(row[0]))


def test_a_settle_kills_the_session_whose_commit_was_lost(backend: Any) -> None:
    old = backend.connect_for_commit(5.0)
    probe = backend.connect()
    try:
        assert isinstance(old, MySQLConnection) and old.client_address
        session = old.session_id
        assert session is not None
        assert _alive(probe, session)
        assert backend.txncontrol.settle_session(probe, old, time.monotonic() + 10)
        assert not _alive(probe, session)
    finally:
        probe.close()


def test_a_clock_that_jumps_while_the_start_is_read_is_no_restart(
        backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client stalled (or its clock stepped) between asking the server's uptime and
    getting it: the start it reads is wide, not later, and the old session is killed."""
    old = backend.connect_for_commit(5.0)
    probe = backend.connect()
    try:
        session = old.session_id
        readings = iter([time.time(), time.time() + 30.0])
        monkeypatch.setattr(serverstart, "wall_clock", lambda: next(readings))
        assert backend.txncontrol.settle_session(probe, old, time.monotonic() + 10)
        assert not _alive(probe, session)
    finally:
        probe.close()


def test_a_session_given_the_old_id_by_another_client_is_not_killed(backend: Any) -> None:
    """As after a restart the check could not tell: the id the old session had now
    names another client's session, which lives on."""
    old = backend.connect_for_commit(5.0)
    other = backend.connect()
    probe = backend.connect()
    try:
        old.close()
        old.session_id = other.connection_id      # the id, given to someone else
        assert backend.txncontrol.settle_session(probe, old, time.monotonic() + 10)
        assert _alive(probe, other.connection_id)
        assert other.fetchone("SELECT 1") == (1,)
    finally:
        other.close()
        probe.close()


def test_a_restart_is_a_start_wholly_after_the_one_seen() -> None:
    seen = ServerStart(100.0, 101.2)
    assert seen.certainly_before(ServerStart(102.3, 103.0))
    assert not seen.certainly_before(ServerStart(102.1, 103.0))   # within the margin
    assert not seen.certainly_before(ServerStart(99.0, 140.0))    # a stalled reading
    assert not ServerStart(-float("inf"), float("inf")).certainly_before(seen)
