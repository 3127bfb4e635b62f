"""MySQL: before a lost COMMIT's outcome is asked, the old session is ended, and only
it: not another client's session that has its id after a server restart, nor one with
its id from another client address; a session gone before its KILL is fine, another
KILL error is not.  (The lingering session itself: test_commit_outcome_table.py.)"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import pytest

from zodbsql.backends.mysql import txncontrol as mysql_txncontrol
from zodbsql.backends.mysql.serverstart import ServerStart
from zodbsql.errors import DatabaseError

storage_backends = ("mysql",)
storage_backends_reason = "MySQL's settling of a session (KILL); the others look the commit up"


class Sessions:
    """A storage's shared connections: ``lingering()`` is a session whose close does
    nothing (the server has not noticed its client is gone)."""

    def __init__(self, storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.storage = storage
        self.shared = storage.shared
        self.control = self.shared.backend.txncontrol
        self.monkeypatch = monkeypatch
        self.opened: list[Any] = []

    def connect(self) -> Any:
        conn = self.shared.connect()
        self.opened.append(conn)
        return conn

    def lingering(self) -> Any:
        """A commit's connection (it knows its client address)."""
        old = self.shared.counted(self.shared.backend.connect_for_commit(5.0))
        self.opened.append(old)
        old.fetchone("SELECT 1")
        self.monkeypatch.setattr(old, "close", lambda: None)
        return old

    def settle(self, old: Any, seconds: float = 30.0) -> bool:
        answer: bool = self.control.settle_session(self.connect(), old,
                                                   time.monotonic() + seconds)
        return answer


@pytest.fixture
def sessions(storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sessions]:
    storage = storage_factory.open()
    made = Sessions(storage, monkeypatch)
    yield made
    for conn in made.opened:
        try:
            conn.raw.close()
        except Exception:
            pass
    storage.close()


def alive(conn: Any) -> bool:
    try:
        return bool(conn.fetchone("SELECT 1")[0] == 1)
    except Exception:
        return False


def on_kill(conn: Any, monkeypatch: pytest.MonkeyPatch,
            answer: Callable[[str, Callable[..., Any]], Any]) -> None:
    """``conn``'s KILL statements go to ``answer(sql, the real execute)``."""
    real_execute = conn.execute

    def execute(sql: str, *args: Any) -> Any:
        if sql.startswith("KILL"):
            return answer(sql, lambda: real_execute(sql, *args))
        return real_execute(sql, *args)

    monkeypatch.setattr(conn, "execute", execute)


def test_the_old_session_is_found_by_its_id_and_address(sessions: Sessions) -> None:
    old = sessions.lingering()
    assert old.session_id is not None and old.client_address
    assert old.server_started is not None
    assert sessions.settle(old) is True
    assert not alive(old)                          # killed


def test_a_session_of_another_address_is_not_killed(sessions: Sessions) -> None:
    old = sessions.lingering()
    old.client_address = "192.0.2.1:1"             # the id is now another client's
    assert sessions.settle(old) is True
    assert alive(old)


def test_without_an_address_the_id_alone_names_it(sessions: Sessions) -> None:
    old = sessions.lingering()
    old.client_address = None
    assert sessions.settle(old) is True
    assert not alive(old)


def test_after_a_restart_the_id_is_not_killed(sessions: Sessions) -> None:
    """The old session's server started long before this one's: it ended with that
    server, and its id may be someone else's now."""
    old = sessions.lingering()
    old.server_started = ServerStart(earliest=1_000_000.0, latest=1_000_001.0)
    assert sessions.settle(old) is True
    assert alive(old)


def test_the_same_server_is_not_taken_for_a_restart(sessions: Sessions) -> None:
    old = sessions.lingering()
    started = old.server_started
    # The same start seen over a wider interval (a slow client): not a restart.
    old.server_started = ServerStart(started.earliest - 5, started.latest + 5)
    assert sessions.settle(old) is True
    assert not alive(old)


def test_what_cant_be_settled(sessions: Sessions) -> None:
    old = sessions.lingering()
    old.server_started = None                      # never learnt: no answer
    assert sessions.settle(old) is False
    old = sessions.lingering()
    old.session_id = None
    assert sessions.settle(old) is False
    assert alive(old)


def test_a_session_gone_before_its_kill_is_settled(sessions: Sessions,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import MySQLdb  # type: ignore[import-untyped]
    old = sessions.lingering()
    conn = sessions.connect()
    kills: list[str] = []

    def gone_first(sql: str, kill: Callable[[], Any]) -> Any:
        kills.append(sql)
        kill()                                     # it is gone now: as if already gone
        cause = MySQLdb.OperationalError(mysql_txncontrol.UNKNOWN_THREAD,
                                         "Unknown thread id")
        raise DatabaseError("KILL failed") from cause

    on_kill(conn, monkeypatch, gone_first)
    assert sessions.control.settle_session(conn, old, time.monotonic() + 30) is True
    assert kills == [f"KILL CONNECTION {int(old.session_id)}"]
    assert not alive(old)


@pytest.mark.parametrize("cause", ["other error", "no cause"])
def test_another_kill_error_is_raised(sessions: Sessions, monkeypatch: pytest.MonkeyPatch,
                                      cause: str) -> None:
    import MySQLdb  # type: ignore[import-untyped]
    old = sessions.lingering()
    conn = sessions.connect()

    def refused(sql: str, kill: Callable[[], Any]) -> Any:
        error = DatabaseError("KILL refused")
        if cause == "other error":
            raise error from MySQLdb.OperationalError(1095, "You are not owner")
        raise error

    on_kill(conn, monkeypatch, refused)
    with pytest.raises(DatabaseError, match="KILL refused"):
        sessions.control.settle_session(conn, old, time.monotonic() + 30)
    assert alive(old)


def test_a_session_that_outlives_its_kill_is_waited_for_until_the_deadline(
        sessions: Sessions, monkeypatch: pytest.MonkeyPatch) -> None:
    old = sessions.lingering()
    conn = sessions.connect()
    kills: list[str] = []

    def ignored(sql: str, kill: Callable[[], Any]) -> Any:
        kills.append(sql)                          # as a session busy in InnoDB: slow
        return None

    on_kill(conn, monkeypatch, ignored)
    started = time.monotonic()
    assert sessions.control.settle_session(conn, old, started + 0.5) is False
    assert 0.5 <= time.monotonic() - started < 5
    assert len(kills) == 1                         # killed once, then waited for
    assert alive(old)


def test_the_own_address_is_host_and_port(sessions: Sessions) -> None:
    conn = sessions.lingering()
    address = mysql_txncontrol.client_address(conn)
    assert address is not None and address == conn.client_address
    host, port = address.rsplit(":", 1)
    assert host == "127.0.0.1" and port.isdigit()   # the tests reach it over TCP
