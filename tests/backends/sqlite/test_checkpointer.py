"""SQLite's WAL checkpoints run in a thread of their own (backends/sqlite/checkpointer.py)."""
from __future__ import annotations

import os
import time
from typing import Any

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping

from tests.databases import BACKENDS, Param, SQLiteFactory
from zodbsql.backends.sqlite.checkpointer import SAFETY_PAGES, Checkpointer

pytestmark = pytest.mark.skipif("sqlite" not in BACKENDS,
                                reason="sqlite is not in ZODBSQL_TEST_BACKENDS")


def _commit_some(db: Any, count: int, round: int) -> None:
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    for value in range(count):
        tm.begin()
        conn.root()[f"k{round}-{value}"] = PersistentMapping(v=b"x" * 20000)
        tm.commit()
    conn.close()


def _wait_for(condition: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "waited too long"
        time.sleep(0.01)


def test_the_commits_leave_their_checkpoints_to_the_thread(tmp_path: Any) -> None:
    """The storage's connections would checkpoint only past SAFETY_PAGES: the pages
    of a few commits reach the database file (from the WAL) through the thread."""
    factory = SQLiteFactory(Param("sqlite", True), tmp_path)
    storage = factory.open()
    db = ZODB.DB(storage)
    checkpointer = storage.shared.backend.checkpointer
    try:
        conn = storage.shared.backend.connect()
        try:
            assert conn.fetchone("PRAGMA wal_autocheckpoint") == (SAFETY_PAGES,)
        finally:
            conn.close()
        for round in range(2):
            size, runs = os.path.getsize(factory.path), checkpointer.runs
            _commit_some(db, 20, round)
            _wait_for(lambda: checkpointer.runs > runs
                      and os.path.getsize(factory.path) > size)
    finally:
        db.close()
    assert checkpointer._thread is not None and not checkpointer._thread.is_alive()
    factory.cleanup()


def test_a_checkpoint_that_fails_is_tried_again_on_a_new_connection() -> None:
    attempts: list[int] = []

    class Flaky:
        def fetchone(self, sql: str) -> Any:
            return (0, 0, 0)

        def close(self) -> None:
            pass

    def connect() -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            from zodbsql.errors import DatabaseError
            raise DatabaseError("disk I/O error")
        return Flaky()

    checkpointer = Checkpointer(connect, pause=0.0)
    try:
        checkpointer.nudge()
        _wait_for(lambda: len(attempts) == 1 and not checkpointer._due.is_set())
        assert checkpointer.runs == 0
        checkpointer.nudge()
        _wait_for(lambda: checkpointer.runs == 1)
        assert len(attempts) == 2
    finally:
        checkpointer.close()
    assert checkpointer._thread is not None and not checkpointer._thread.is_alive()
    checkpointer.nudge()        # after close: nothing starts again
    assert not checkpointer._thread.is_alive()


def test_a_close_in_the_pause_after_a_nudge_ends_the_thread() -> None:
    """The pause's end once cleared what ``close`` had set: the thread waited for ever."""
    class Quick:
        def fetchone(self, sql: str) -> Any:
            return (0, 0, 0)

        def close(self) -> None:
            pass

    for delay in (0.0, 0.02, 0.2):
        checkpointer = Checkpointer(Quick, pause=0.05)
        checkpointer.nudge()
        time.sleep(delay)
        started = time.monotonic()
        checkpointer.close()
        assert checkpointer._thread is not None and not checkpointer._thread.is_alive()
        assert time.monotonic() - started < 1.0
