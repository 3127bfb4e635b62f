"""A COMMIT whose answer is lost: applied once, never twice, on every backend and mode.

The failure is injected in the commit connection itself, right after the database
committed (the answer "lost" on the way back) or instead of committing (the request
lost on the way there).  ``transaction.manager.attempts()`` retries whatever is a
``TransientError``, as Zope's publisher does; the balance shows how often the withdrawal
was applied.  The fault suite (tests/fault) does the same with a real TCP cut.
"""
from __future__ import annotations

import re
from typing import Any, Iterator

import pytest
import transaction
import ZODB

from zodbsql.backends.base.connections import DBConnection
from zodbsql.errors import CommitOutcomeUnknown, ConnectionLost


class LoseCommit:
    """Makes the next ``times`` COMMITs of pooled connections fail as a lost connection,
    after committing (``applied``) or after rolling back instead."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, storage: Any, applied: bool,
                 times: int = 1) -> None:
        self.left = times
        self.applied = applied
        pool = storage.shared.pool
        real_acquire = pool.acquire

        def acquire(timeout: float | None = None) -> DBConnection:
            conn = real_acquire(timeout)
            self._arm(monkeypatch, conn)
            return conn
        monkeypatch.setattr(pool, "acquire", acquire)

    def _arm(self, monkeypatch: pytest.MonkeyPatch, conn: DBConnection) -> None:
        real_commit, real_rollback = conn.commit, conn.rollback
        real_fetch_and_commit = getattr(conn, "fetch_and_commit", None)
        if real_fetch_and_commit is not None:
            # PostgreSQL sends COMMIT with finish's call, as one query; its answer, the
            # tid, is lost with it.
            def fetch_and_commit(sql: str, shown: str, count: int) -> Any:
                if self.left <= 0:
                    return real_fetch_and_commit(sql, shown, count)
                self.left -= 1
                if self.applied:
                    real_fetch_and_commit(sql, shown, count)
                else:
                    real_rollback()
                raise ConnectionLost("injected: the connection dropped during COMMIT")
            monkeypatch.setattr(conn, "fetch_and_commit", fetch_and_commit)

        def commit() -> None:
            if self.left <= 0 or not conn.in_transaction:
                return real_commit()
            self.left -= 1
            if self.applied:
                real_commit()
            else:
                real_rollback()
            raise ConnectionLost("injected: the connection dropped during COMMIT")
        monkeypatch.setattr(conn, "commit", commit)


def withdraw(db: Any, amount: int) -> int:
    """Withdraw under attempts(); return how many attempts it took."""
    tries = 0
    for attempt in transaction.manager.attempts(5):
        with attempt:
            tries += 1
            conn = db.open()
            try:
                conn.root()["balance"] -= amount
            finally:
                transaction.get().addAfterCommitHook(lambda ok, c=conn: c.close())
    return tries


@pytest.fixture
def bank(storage_factory: Any) -> Iterator[tuple[Any, Any]]:
    # A short commit-lock-timeout bounds how long a lost COMMIT is looked into.
    storage = storage_factory.open(commit_lock_timeout=1.0)
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        conn.root()["balance"] = 100
    yield db, storage
    db.close()


def balance(db: Any) -> int:
    with db.transaction() as conn:
        return int(conn.root()["balance"])


def test_commit_applied_but_answer_lost_is_not_retried(bank: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    db, storage = bank
    fault = LoseCommit(monkeypatch, storage, applied=True)
    assert withdraw(db, 30) == 1
    assert fault.left == 0, "the fault was never injected"
    assert balance(db) == 70


def test_commit_never_applied_is_retried(bank: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    db, storage = bank
    fault = LoseCommit(monkeypatch, storage, applied=False)
    assert withdraw(db, 30) == 2
    assert fault.left == 0
    assert balance(db) == 70


def test_outcome_that_cannot_be_learned_is_not_retryable(
        bank: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    db, storage = bank
    LoseCommit(monkeypatch, storage, applied=True)
    backend = storage.shared.backend

    def unreachable() -> DBConnection:
        raise ConnectionLost("injected: the database is unreachable")
    monkeypatch.setattr(backend, "connect", unreachable)
    with pytest.raises(CommitOutcomeUnknown) as info:
        withdraw(db, 30)
    assert not isinstance(info.value, transaction.interfaces.TransientError)
    if info.value.tid is None:
        # COMMIT went with the call that allocates the tid (PostgreSQL): the message
        # names what identifies the commit instead.
        assert re.search(r"look for nonce \d+ in zodbsql's commit_log table",
                         str(info.value)), str(info.value)
    else:
        assert f"0x{info.value.tid:016x}" in str(info.value)
