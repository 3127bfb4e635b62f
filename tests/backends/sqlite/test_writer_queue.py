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
import types
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
from zodbsql.backends.sqlite import writers as writers_module
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
    # The adapter opens every path as a file name, made absolute: ":memory:" and
    # "file:..." are files too, each with its queue.
    assert queue_for(str(tmp_path / ":memory:")) not in (same, None)
    assert queue_for(str(tmp_path / "file:x.sqlite")) not in (same, None)


def test_a_turn_handed_over_as_the_wait_runs_out_is_the_waiters(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-over and the end of the wait at the same moment: the waiter's wait
    reports a timeout, but the turn was handed to it, so it has it (and gives it back)."""
    writers = WriterQueue()
    assert writers.acquire(1)

    class LateGate:
        """A gate whose timed wait sees the hand-over, then reports a timeout."""

        def __init__(self) -> None:
            self.lock = threading.Lock()

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            got = self.lock.acquire()
            return got if timeout < 0 else False

        def release(self) -> None:
            self.lock.release()

    monkeypatch.setattr(writers_module, "threading", types.SimpleNamespace(Lock=LateGate))
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(writers.acquire(5)))
    waiter.start()
    _waiting(writers, 1)
    writers.release()                   # handed to the waiter
    waiter.join(10)
    assert result == [True] and writers.crowded()
    writers.release()
    assert not writers.crowded()


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


def test_a_writer_that_meets_no_other_takes_no_turn_and_keeps_its_busy_timeout(
        storage_factory: Any) -> None:
    """The queue is for writers that waited: one that finds the lock free goes
    straight to SQLite, and its connection's busy timeout is its commit-lock-timeout
    again afterwards (the patience is set for the BEGIN alone)."""
    storage = storage_factory.open(commit_lock_timeout=7)
    try:
        writers = queue_for(storage_factory.path)
        conn = storage.shared.backend.connect()
        conn.begin_write()
        assert not writers.crowded()
        assert conn.fetchone("PRAGMA busy_timeout") == (7000,)
        conn.rollback()
        conn.close()
    finally:
        storage.close()


def test_a_writer_that_queues_after_its_patience_gives_up_at_its_timeout(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second of patience, then the queue (free), then SQLite for what is left of
    the two seconds: two seconds in all, not the patience again on top."""
    monkeypatch.setattr(connections, "PATIENCE", 1.0)
    storage = storage_factory.open(commit_lock_timeout=2)
    holder = _hold_file(storage_factory.path)
    try:
        conn = storage.shared.backend.connect()
        started = time.monotonic()
        with pytest.raises(CommitLockTimeout, match="commit-lock-timeout"):
            conn.begin_write()
        waited = time.monotonic() - started
        assert 2.0 <= waited < 2.7, waited
        assert not queue_for(storage_factory.path).crowded()
        conn.close()
    finally:
        holder.rollback()
        holder.close()
        storage.close()


def test_a_writer_behind_a_queued_one_gives_up_at_its_timeout(
        storage_factory: Any, impatient: None) -> None:
    storage, writers, holder = _held_elsewhere(storage_factory)
    late = storage_factory.open(commit_lock_timeout=0.5)
    try:
        first = storage.shared.backend.connect()
        thread = threading.Thread(target=first.begin_write)
        thread.start()
        _crowd(writers)                 # the first has the turn and waits on SQLite
        second = late.shared.backend.connect()
        started = time.monotonic()
        with pytest.raises(CommitLockTimeout, match="commit-lock-timeout"):
            second.begin_write()        # queues at once, then runs out of time
        waited = time.monotonic() - started
        assert 0.5 <= waited < 1.5, waited
        holder.rollback()
        holder.close()
        thread.join(10)
        assert first.in_transaction
        first.rollback()
        first.close()
        second.close()
        assert not writers.crowded()
    finally:
        late.close()
        storage.close()


def test_a_transaction_ends_once(storage_factory: Any) -> None:
    """COMMIT or ROLLBACK ends the connection's transaction: a ROLLBACK after either
    (an abort after a finish, a release after an abort) sends nothing more."""
    storage = storage_factory.open()
    try:
        conn = storage.shared.backend.connect()
        for begin, end in ((conn.begin_write, conn.commit), (conn.begin_read, conn.rollback)):
            begin()
            end()
            sent = conn.statements
            conn.rollback()
            conn.commit()
            assert conn.statements == sent and not conn.in_transaction
        conn.close()
    finally:
        storage.close()
