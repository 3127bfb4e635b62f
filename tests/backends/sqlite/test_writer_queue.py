"""The writers of one SQLite file in one process: one that waited out its patience in
SQLite's busy handler takes a turn, and every later writer queues behind it in the order
they came (backends/sqlite/writers.py); a turn, and the lock, end with the write
transaction however it ends: commit, abort, a failed vote, a timeout, a closed
storage or connection."""
from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Any

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB import POSException
from ZODB.Connection import TransactionMetaData
from ZODB.tests.MinPO import MinPO
from ZODB.tests.StorageTestBase import zodb_pickle
from ZODB.utils import z64

from zodbsql.backends.sqlite import connections
from zodbsql.backends.sqlite.writers import WriterQueue, queue_for
from zodbsql.errors import CommitLockTimeout

storage_backends = ("sqlite",)
storage_backends_reason = "a queue of the threads writing one SQLite file"


def _waiting(writers: WriterQueue, count: int) -> None:
    deadline = time.monotonic() + 5
    while len(writers._waiting) < count:
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.001)


def test_waiters_get_the_turn_in_the_order_they_asked() -> None:
    writers = WriterQueue()
    assert writers.acquire(1)
    order: list[int] = []

    def wait_turn(number: int) -> None:
        assert writers.acquire(10)
        order.append(number)
        writers.release()

    threads = []
    for number in range(5):
        thread = threading.Thread(target=wait_turn, args=(number,))
        thread.start()
        _waiting(writers, number + 1)      # each asks after the one before
        threads.append(thread)
    writers.release()
    for thread in threads:
        thread.join(10)
    assert order == [0, 1, 2, 3, 4]
    assert writers.acquire(0)              # the last one gave the turn back
    writers.release()


def test_a_waiter_that_runs_out_of_time_leaves_the_queue() -> None:
    writers = WriterQueue()
    assert writers.acquire(1)
    started = time.monotonic()
    assert not writers.acquire(0.2)
    assert time.monotonic() - started >= 0.2
    assert len(writers._waiting) == 0
    assert not writers.acquire(0)          # still held by the first
    writers.release()
    assert writers.acquire(0)              # and free once it is released
    writers.release()


def test_one_queue_per_file_whatever_the_path_spelling(tmp_path: Any) -> None:
    path = str(tmp_path / "db.sqlite")
    os.symlink(path, str(tmp_path / "link.sqlite"))
    same = queue_for(path)
    assert same is not None
    assert queue_for(str(tmp_path / "." / "db.sqlite")) is same
    assert queue_for(str(tmp_path / "link.sqlite")) is same
    assert queue_for(str(tmp_path / "other.sqlite")) is not same
    assert queue_for(":memory:") is None


def _voted(storage: Any) -> TransactionMetaData:
    """A transaction of ``storage`` that has voted: it holds the file's write lock."""
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    storage.store(storage.new_oid(), z64, zodb_pickle(MinPO(1)), "", txn)
    storage.tpc_vote(txn)
    return txn


def _commit_within(db: ZODB.DB, key: str, seconds: float) -> None:
    started = time.monotonic()
    with db.transaction() as conn:
        conn.root()[key] = 1
    assert time.monotonic() - started < seconds


@pytest.fixture
def impatient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers queue after 50 ms in SQLite's busy handler instead of a second."""
    monkeypatch.setattr(connections, "PATIENCE", 0.05)


def test_a_writer_of_this_process_holds_the_others_back_until_it_ends(
        storage_factory: Any, impatient: None) -> None:
    writer = storage_factory.open(commit_lock_timeout=0.3)
    db = ZODB.DB(storage_factory.open(commit_lock_timeout=0.3))
    try:
        txn = _voted(writer)
        started = time.monotonic()
        with pytest.raises(CommitLockTimeout, match="commit-lock-timeout"):
            with db.transaction() as conn:      # patience, then the queue, then out
                conn.root()["a"] = 1
        assert time.monotonic() - started >= 0.3
        writer.tpc_finish(txn)
        _commit_within(db, "b", 0.3)            # the turn was given back at the timeout
        txn = _voted(writer)
        writer.tpc_abort(txn)
        _commit_within(db, "c", 0.3)
        with db.transaction() as conn:
            assert sorted(conn.root()) == ["b", "c"]
    finally:
        writer.close()
        db.close()


def test_a_vote_that_fails_gives_the_lock_back(storage_factory: Any) -> None:
    db = ZODB.DB(storage_factory.open(commit_lock_timeout=0.3))
    try:
        with db.transaction() as conn:
            conn.root()["x"] = PersistentMapping(v=0)
        tm1, tm2 = transaction.TransactionManager(), transaction.TransactionManager()
        c1, c2 = db.open(tm1), db.open(tm2)
        c1.root()["x"]["v"] = 1
        c2.root()["x"]["v"] = 2
        tm1.commit()
        with pytest.raises(POSException.ConflictError):
            tm2.commit()                        # fails in vote, once it has the lock
        tm2.abort()
        _commit_within(db, "y", 0.3)
        c1.close()
        c2.close()
    finally:
        db.close()


def test_a_storage_closed_while_it_writes_gives_the_lock_back(storage_factory: Any) -> None:
    writer = storage_factory.open(commit_lock_timeout=0.3)
    db = ZODB.DB(storage_factory.open(commit_lock_timeout=0.3))
    try:
        _voted(writer)
        writer.close()                          # the voted transaction is dropped
        _commit_within(db, "a", 0.3)
        with db.transaction() as conn:
            assert sorted(conn.root()) == ["a"]
    finally:
        db.close()


def _hold_file(path: str) -> sqlite3.Connection:
    """Another writer, outside this process's queue (as another process would be)."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    return holder


def _held_elsewhere(factory: Any) -> tuple[Any, WriterQueue, sqlite3.Connection]:
    """A storage whose writers wait up to 10 s, its file's queue, and a writer of
    another connection that holds the file's write lock."""
    storage = factory.open(commit_lock_timeout=10)
    writers = queue_for(factory.path)
    assert writers is not None
    return storage, writers, _hold_file(factory.path)


def _crowd(writers: WriterQueue) -> None:
    deadline = time.monotonic() + 10
    while not writers.crowded():
        assert time.monotonic() < deadline, "no writer took the turn"
        time.sleep(0.001)


def test_writers_after_an_impatient_one_queue_in_the_order_they_came(
        storage_factory: Any, impatient: None, monkeypatch: pytest.MonkeyPatch) -> None:
    storage, writers, holder = _held_elsewhere(storage_factory)
    try:
        backend = storage.shared.backend
        order: list[int] = []

        def write(number: int) -> None:
            conn = backend.connect()
            conn.begin_write()
            order.append(number)
            conn.rollback()
            conn.close()

        threads = [threading.Thread(target=write, args=(0,))]
        threads[0].start()
        _crowd(writers)                     # the first waited out its patience
        # The next ones queue at once: with their patience they would wait 10 s in
        # SQLite's busy handler instead.
        monkeypatch.setattr(connections, "PATIENCE", 10.0)
        for number in (1, 2, 3):
            threads.append(threading.Thread(target=write, args=(number,)))
            threads[-1].start()
            _waiting(writers, number)
        holder.rollback()
        holder.close()
        for thread in threads:
            thread.join(10)
        assert order == [0, 1, 2, 3]
        assert not writers.crowded()
    finally:
        storage.close()


def test_a_connection_closed_with_the_turn_gives_it_back(storage_factory: Any,
                                                         impatient: None) -> None:
    storage, writers, holder = _held_elsewhere(storage_factory)
    try:
        backend = storage.shared.backend
        first, second = backend.connect(), backend.connect()
        thread = threading.Thread(target=first.begin_write)
        thread.start()
        _crowd(writers)
        holder.rollback()
        holder.close()
        thread.join(10)
        assert first.in_transaction and writers.crowded()
        first.close()                   # no commit, no rollback: SQLite rolls back
        assert not writers.crowded()
        started = time.monotonic()
        second.begin_write()
        assert time.monotonic() - started < 0.3
        second.rollback()
        second.close()
    finally:
        storage.close()
