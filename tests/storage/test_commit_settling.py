"""What a commit says when its COMMIT failed, by outcome (storage/commit.py,
``_settle_lost_commit``): committed anyway (a warning, a normal return), certainly not
committed (the error, retryable when the connection was lost), or unknown (an error
that names the tid and says not to retry blindly), and the lookup trying again while
the database does not answer.

The failure is injected under the storage's commit connections on SQLite, which runs in
the process; the fault suite (tests/fault) cuts real server connections with a proxy.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import pytest
import transaction
import ZODB
from transaction.interfaces import TransientError
from ZODB.utils import u64

from zodbsql.errors import CommitOutcomeUnknown, ConnectionLost, DatabaseError

storage_backends = ("sqlite",)
storage_backends_reason = ("the COMMIT failure is injected under SQLite's in-process"
                           " connection; servers' connections are cut in tests/fault")


class FailingCommits:
    """The next ``armed`` COMMITs of the storage's commit connections raise ``error()``,
    after running (``ran``) or instead of it."""

    def __init__(self, storage: Any, error: Callable[[], Exception], ran: bool) -> None:
        self.error, self.ran, self.armed, self.fired = error, ran, 0, 0
        backend = storage.shared.backend
        connect = backend.connect_for_commit

        def connect_failing(*args: Any, **kwargs: Any) -> Any:
            conn = connect(*args, **kwargs)
            real_commit = conn.commit

            def commit() -> None:
                if self.armed <= 0:
                    return real_commit()
                self.armed -= 1
                self.fired += 1
                if self.ran:
                    real_commit()
                raise self.error()
            conn.commit = commit
            return conn
        backend.connect_for_commit = connect_failing
        storage.shared.pool.close()    # idle connections made before are not wrapped


def _set_balance(db: Any, value: int) -> None:
    with db.transaction() as conn:
        conn.root()["balance"] = value


def _balance(storage_factory: Any) -> tuple[int, bytes]:
    check = ZODB.DB(storage_factory.open())
    try:
        with check.transaction() as conn:
            return conn.root()["balance"], conn.root()._p_serial
    finally:
        check.close()


@pytest.fixture
def db(storage_factory: Any) -> Any:
    storage = storage_factory.open(commit_lock_timeout=0.1)
    made = ZODB.DB(storage)
    _set_balance(made, 100)
    yield made
    made.close()
    transaction.abort()


def test_a_commit_that_happened_returns_with_a_warning(
        db: Any, storage_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    storage = db.storage
    failing = FailingCommits(storage, lambda: DatabaseError("disk went away"), ran=True)
    failing.armed = 1
    with caplog.at_level(logging.WARNING, logger="zodbsql.storage.commit"):
        _set_balance(db, 70)           # no error: the transaction is in the database
    assert failing.armed == 0
    balance, tid = _balance(storage_factory)
    assert balance == 70
    assert (f"COMMIT of transaction 0x{u64(tid):016x} on {storage.backend.describe()}"
            " reported disk went away, but the transaction is in the database: it counts"
            " as committed") in caplog.text


def test_a_lost_connection_that_did_not_commit_stays_retryable(
        db: Any, storage_factory: Any) -> None:
    storage = db.storage
    failing = FailingCommits(storage, lambda: ConnectionLost("cut"), ran=False)
    failing.armed = 1
    with pytest.raises(ConnectionLost) as raised:
        _set_balance(db, 70)
    transaction.abort()
    assert isinstance(raised.value, TransientError)
    message = str(raised.value)
    assert message.startswith(f"the connection to {storage.backend.describe()} was lost"
                              " during COMMIT of transaction 0x")
    assert message.endswith(", which the database confirms was not committed; the"
                            " transaction can be retried")
    assert _balance(storage_factory)[0] == 100
    _set_balance(db, 70)               # the retry
    assert _balance(storage_factory)[0] == 70


def test_another_error_that_did_not_commit_is_raised_as_it_was(db: Any,
                                                                storage_factory: Any) -> None:
    problem = DatabaseError("disk full")
    FailingCommits(db.storage, lambda: problem, ran=False).armed = 1
    with pytest.raises(DatabaseError) as raised:
        _set_balance(db, 70)
    transaction.abort()
    assert raised.value is problem
    assert _balance(storage_factory)[0] == 100


def test_the_lookup_tries_again_while_the_database_refuses_sessions(
        db: Any, storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = db.storage
    failing = FailingCommits(storage, lambda: ConnectionLost("cut"), ran=True)
    failing.armed = 1
    backend = storage.shared.backend
    connect = backend.connect
    refusals: list[int] = []

    def refuse_twice(*args: Any, **kwargs: Any) -> Any:
        if failing.fired and len(refusals) < 2:     # the lookup's sessions
            refusals.append(1)
            raise DatabaseError("starting up")
        return connect(*args, **kwargs)
    monkeypatch.setattr(backend, "connect", refuse_twice)
    _set_balance(db, 70)               # committed, found out at the third try
    assert len(refusals) == 2
    assert _balance(storage_factory)[0] == 70


@pytest.mark.parametrize("where", ["connect", "lookup", "undecided"])
def test_an_outcome_that_cannot_be_learned_is_never_retryable(
        db: Any, storage_factory: Any, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    storage = db.storage
    failing = FailingCommits(storage, lambda: ConnectionLost("cut"), ran=True)
    failing.armed = 1
    backend = storage.shared.backend
    if where == "connect":
        connect = backend.connect

        def refuse(*args: Any, **kwargs: Any) -> Any:
            if failing.fired:              # the lookup's sessions
                raise DatabaseError("no sessions")
            return connect(*args, **kwargs)
        monkeypatch.setattr(backend, "connect", refuse)
    elif where == "lookup":
        def cannot_tell(*args: Any, **kwargs: Any) -> Any:
            raise DatabaseError("no sessions")
        monkeypatch.setattr(backend.txncontrol, "commit_outcome", cannot_tell)
    else:       # the lookup ran and could not decide: the COMMIT's error is the problem
        monkeypatch.setattr(backend.txncontrol, "commit_outcome", lambda *args: None)
    problem = "cut" if where == "undecided" else "no sessions"
    with pytest.raises(CommitOutcomeUnknown) as raised:
        _set_balance(db, 70)
    transaction.abort()
    error = raised.value
    assert not isinstance(error, TransientError)
    tid = f"0x{error.tid:016x}"
    assert str(error) == (
        f"COMMIT of transaction {tid} on {backend.describe()} failed (cut) and whether it"
        f" was applied could not be found out ({problem}). Do not simply retry it: look"
        f" for transaction {tid} in the database first (in a history-preserving database,"
        " zodbsql's transactions table), since retrying a committed transaction applies"
        " it twice")
    monkeypatch.undo()
    balance, committed = _balance(storage_factory)
    assert (balance, u64(committed)) == (70, error.tid)   # it had in fact committed
