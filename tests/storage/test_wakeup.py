"""Wake-up instead of polling: a transaction start keeps its snapshot while nothing
committed (backends/base/wakeup.py, sqlite/wakeup.py, postgresql/listener.py).

The matrix test counts the statements of idle transaction starts in every cell and
checks that a commit made through another storage is seen at the next start.  The
PostgreSQL tests check the listening session: a commit of another process, a commit
racing with the poll, a session ended by the server, gone silent or sent a foreign
notification, a database whose procedures predate announcing commits, and the server's
own log of an idle run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import pathlib
import re
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterator

import psycopg
import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping

from tests.conformance.roomy_postgresql import private_postgresql
from tests.databases import Param, PostgreSQLFactory
from zodbsql.api import open_storage
from zodbsql.backends.postgresql.listener import CommitListener, local_high, note_local_commit
from zodbsql.backends.postgresql.options import PostgreSQLOptions
from zodbsql.backends.postgresql.pooler import TRANSACTION_POOLING
from zodbsql.errors import ConnectionLost, described
from zodbsql.storage import SQLStorage

#: Statements of 20 idle transactions (begin, read, abort: ZODB polls at the begin and
#: again after the abort).  PostgreSQL history-preserving listens: none.  SQLite reads
#: PRAGMA data_version at each poll it skips (history-free inside the read transaction
#: that is the snapshot, begun and ended around it).  History-free MySQL polls: BEGIN,
#: the poll and ROLLBACK.  History-free PostgreSQL listens, and the abort's
#: afterCompletion leaves the read transaction open for ZODB's poll right after it
#: (storage/next_poll.py), which hears of no commit and keeps it, as the begin does:
#: none (2 a transaction when afterCompletion ended it with a ROLLBACK; 3 before it
#: listened).
IDLE_STATEMENTS = {
    ("sqlite", True): 40,
    ("sqlite", False): 120,
    ("postgresql", True): 0,
    ("postgresql", False): 0,
    ("mysql", True): 40,
    ("mysql", False): 120,
}
IDLE_TRANSACTIONS = 20


def idle_statements(storage: SQLStorage, tm: Any, root: Any, count: int) -> int:
    before = storage.statement_count()
    for _ in range(count):
        tm.begin()
        assert "x" in root
        tm.abort()
    return storage.statement_count() - before


def test_idle_transaction_starts(storage_factory: Any) -> None:
    param = storage_factory.param
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    other_db = ZODB.DB(storage_factory.open())
    try:
        tm = transaction.TransactionManager()
        root = db.open(tm).root()
        root["x"] = PersistentMapping(v=0)
        tm.commit()
        idle_statements(storage, tm, root, 3)          # warm: prepared statements
        assert idle_statements(storage, tm, root, IDLE_TRANSACTIONS) == \
            IDLE_STATEMENTS[(param.backend, param.keep_history)]
        # Another storage on the database commits: the next start sees it.
        other_tm = transaction.TransactionManager()
        other_root = db_root(other_db, other_tm)
        other_root["x"]["v"] = 1
        other_tm.commit()
        tm.begin()
        assert root["x"]["v"] == 1
        tm.abort()
    finally:
        other_db.close()
        db.close()


def db_root(db: Any, tm: Any) -> Any:
    return db.open(tm).root()


def wait_until_heard(storage: SQLStorage, serial: bytes) -> None:
    """PostgreSQL: wait for the announcement of another storage's commit (a start
    before it arrives may keep its snapshot).  The other backends ask the database at
    every start."""
    watch = storage.shared.watch
    if isinstance(watch, CommitListener) and watch.listening:
        wait_until(notified(watch, int.from_bytes(serial, "big")))


def commit_again(instance: Any, oid: bytes) -> bytes:
    """The storage API's own commit: ``oid``'s state as ``instance`` loads it, stored
    again in one transaction; its tid."""
    from ZODB.Connection import TransactionMetaData
    data, serial = instance.load(oid)
    txn = TransactionMetaData()
    instance.tpc_begin(txn)
    instance.store(oid, serial, data, "", txn)
    instance.tpc_vote(txn)
    tid: bytes = instance.tpc_finish(txn)
    return tid


@contextlib.contextmanager
def two_databases(storage_factory: Any) -> Iterator[tuple[Any, Any]]:
    """A DB, and another on the same database (another process's storage)."""
    db = ZODB.DB(storage_factory.open())
    other_db = ZODB.DB(storage_factory.open())
    try:
        yield db, other_db
    finally:
        other_db.close()
        db.close()


def x_and_y(db: Any, other_db: Any) -> tuple[Any, Any, Any, Any]:
    """Two mappings x and y committed through ``db``; a transaction manager and the
    root for each database."""
    tm = transaction.TransactionManager()
    root = db_root(db, tm)
    root["x"] = PersistentMapping(v=0)
    root["y"] = PersistentMapping(v=0)
    tm.commit()
    other_tm = transaction.TransactionManager()
    return tm, root, other_tm, db_root(other_db, other_tm)


def test_a_commit_after_anothers_still_sees_it(storage_factory: Any) -> None:
    """After its own commit a start may keep the commit as its snapshot without a poll
    (history-preserving PostgreSQL and SQLite: finish says which tid came before), but
    only when nothing else was committed since the snapshot: another storage's commit
    in between is seen, and so is one made after."""
    with two_databases(storage_factory) as (db, other_db):
        tm, root, other_tm, other_root = x_and_y(db, other_db)
        for value in (1, 2, 3):
            tm.begin()
            assert root["y"]["v"] == value - 1   # y in this connection's cache
            other_tm.begin()
            other_root["y"]["v"] = value       # committed between the snapshot and ...
            other_tm.commit()
            root["x"]["v"] = value             # ... this connection's own commit
            tm.commit()
            tm.begin()
            assert (root["x"]["v"], root["y"]["v"]) == (value, value)
            tm.abort()
        # Alone this time: the next start may skip its poll.
        root["x"]["v"] = 4
        tm.commit()
        tm.begin()
        assert (root["x"]["v"], root["y"]["v"]) == (4, 3)
        tm.abort()


#: Statements of an empty commit and the start after it (the bench's ``empty``: begin,
#: a cached read, the storage's two-phase commit of nothing, abort, whose poll ZODB makes
#: right after): the commit's own (test_round_trips.py's EXPECTED_EMPTY) and an idle
#: transaction's (IDLE_STATEMENTS), SQLite's one more: the last tid, read where the start
#: after the commit asks whether it was the last.  PostgreSQL: the finish call alone;
#: the start after it moves the snapshot to the commit without a poll, since nothing was
#: committed in between or after (history-free: the read transaction the last poll
#: began, left open by the abort, sees the database as the commit, which changed
#: nothing, does; 2 when that start polled).
EMPTY_COMMIT_STATEMENTS = {
    ("sqlite", True): 6 + 2 + 1,
    ("sqlite", False): 5 + 6 + 1,
    ("postgresql", True): 1,
    ("postgresql", False): 1,
    ("mysql", True): 8 + 2,
    ("mysql", False): 7 + 6,
}


def empty_commit(conn: Any) -> None:
    """The storage API's commit of nothing, inside ``conn``'s transaction."""
    from ZODB.Connection import TransactionMetaData
    storage = conn._storage
    txn = TransactionMetaData(description="nothing stored")
    storage.tpc_begin(txn)
    storage.tpc_vote(txn)
    storage.tpc_finish(txn)


def test_an_empty_commit_made_alone_keeps_the_snapshot(storage_factory: Any) -> None:
    """A commit that changes nothing, made alone, needs no poll after it: its statements
    with the start after it are the commit's own (PostgreSQL).  A commit of another
    storage made before it (since the snapshot) or after it is seen at the next start,
    and so is one after a read-current commit, which stores nothing either."""
    param = storage_factory.param
    with two_databases(storage_factory) as (db, other_db):
        tm, root, other_tm, other_root = x_and_y(db, other_db)
        conn = root._p_jar
        storage = conn._storage

        def empty_transaction() -> None:
            tm.begin()
            assert root["y"]["v"] == value
            empty_commit(conn)
            tm.abort()
        value = 0
        for _ in range(3):      # warm up: the pool, prepared statements
            empty_transaction()
        before = storage.statement_count()
        for _ in range(10):
            empty_transaction()
        per_commit = (storage.statement_count() - before) / 10
        assert per_commit == EMPTY_COMMIT_STATEMENTS[(param.backend, param.keep_history)]
        for value in (1, 2):
            tm.begin()
            assert root["y"]["v"] == value - 1
            other_root["y"]["v"] = value       # after this snapshot, before the commit
            other_tm.commit()
            if value == 2:
                wait_until_heard(db.storage, other_root["y"]._p_serial)
            empty_commit(conn)
            tm.abort()
            tm.begin()
            assert root["y"]["v"] == value
            tm.abort()
        for value in (3, 4):
            tm.begin()
            assert root["y"]["v"] == value - 1
            if value == 3:
                empty_commit(conn)
            else:
                conn.readCurrent(root["y"])
                tm.commit()
            tm.abort()      # (after an empty commit: ZODB's poll moves past it)
            other_root["y"]["v"] = value       # after the commit and the poll past it
            other_tm.commit()
            wait_until_heard(db.storage, other_root["y"]._p_serial)
            tm.begin()
            assert root["y"]["v"] == value
            tm.abort()


def test_the_start_after_an_own_commit_reads_it_from_the_database(
        storage_factory: Any) -> None:
    """A start after the instance's own commit sees that commit in what it loads from
    the database (no state cache to serve it): a history-free snapshot kept from before
    the commit would still give the states it replaced."""
    db = ZODB.DB(storage_factory.open(cache_size_mb=0))
    try:
        tm = transaction.TransactionManager()
        root = db_root(db, tm)
        root["x"] = PersistentMapping(v=0)
        tm.commit()
        for value in (1, 2, 3):
            tm.begin()
            root["x"]["v"] = value
            tm.commit()
            tm.begin()
            root._p_jar.cacheMinimize()     # x is loaded again, from the database
            assert root["x"]["v"] == value
            tm.abort()
    finally:
        db.close()


def test_the_poll_after_an_own_commit_sees_a_later_one(storage_factory: Any) -> None:
    """The storage API's order, without ZODB's poll right after the commit: an instance
    commits alone, another storage commits after it, then the instance polls.  The
    poll must name the other's object, though the own commit alone would have let it
    keep the commit as its snapshot."""
    db = ZODB.DB(storage_factory.open())
    other_db = ZODB.DB(storage_factory.open())
    try:
        with db.transaction() as conn:
            conn.root()["x"] = PersistentMapping(v=0)
            conn.root()["y"] = PersistentMapping(v=0)
        with db.transaction() as conn:
            x_oid, y_oid = conn.root()["x"]._p_oid, conn.root()["y"]._p_oid
        instance = db.storage.new_instance()
        try:
            instance.poll_invalidations()
            commit_again(instance, x_oid)
            with other_db.transaction() as conn:
                conn.root()["y"]["v"] = 1
            wait_until_heard(db.storage, other_db.storage.lastTransaction())
            assert y_oid in (instance.poll_invalidations() or [])
        finally:
            instance.release()
    finally:
        other_db.close()
        db.close()


def test_a_watch_that_fails_to_answer_lets_the_start_poll(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit watch whose check failed (its statement, its session) can't vouch that
    nothing was committed: the start polls, after an own commit too."""
    from zodbsql.errors import ZodbsqlError
    with two_databases(storage_factory) as (db, other_db):
        tm, root, other_tm, other_root = x_and_y(db, other_db)

        def failing(*args: Any) -> Any:
            raise ZodbsqlError("the watch's check failed")
        watch = db.storage.shared.watch
        monkeypatch.setattr(watch, "quiet", failing)
        monkeypatch.setattr(watch, "quiet_after_own_commit", failing)
        for value in (1, 2):
            tm.begin()
            root["x"]["v"] = value             # an own commit, made alone ...
            tm.commit()
            other_tm.begin()
            other_root["y"]["v"] = value       # ... then another storage's
            other_tm.commit()
            tm.begin()
            assert (root["x"]["v"], root["y"]["v"]) == (value, value)
            tm.abort()
        # The storage API's order: no poll between the own commit and the other's.
        x, y = root["x"]._p_oid, root["y"]._p_oid
        instance = db.storage.new_instance()
        try:
            instance.poll_invalidations()
            commit_again(instance, x)
            other_tm.begin()
            other_root["y"]["v"] = 3
            other_tm.commit()
            assert y in (instance.poll_invalidations() or [])
        finally:
            instance.release()


def test_the_first_poll_of_a_new_storage_reads_no_changes(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A storage that starts has nothing cached to invalidate: its first poll asks for
    the newest tid, not for every change the database holds."""
    made = ZODB.DB(storage_factory.open())
    for value in range(3):
        with made.transaction() as conn:
            conn.root()[f"x{value}"] = PersistentMapping(v=value)
    made.close()
    storage = storage_factory.open()
    try:
        poller = storage.shared.backend.poller
        seen: list[tuple[int | None, int]] = []
        poll, begin_and_poll = poller.poll, poller.begin_and_poll

        def recorded(polled: Any, since: int | None) -> Any:
            seen.append((since, len(polled[1])))
            return polled
        monkeypatch.setattr(poller, "poll", lambda conn, since, gone_since=None, limit=0:
                            recorded(poll(conn, since, gone_since, limit), since))
        monkeypatch.setattr(
            poller, "begin_and_poll",
            lambda conn, since, gone_since=None, end_first=False, limit=0: recorded(
                begin_and_poll(conn, since, gone_since, end_first, limit), since))
        instance = storage.new_instance()
        try:
            assert instance.poll_invalidations() == []
        finally:
            instance.release()
        # (MySQL's begin_and_poll is its poll after a BEGIN: both are recorded.)
        assert seen and set(seen) == {(None, 0)}
    finally:
        storage.close()


#: Cells whose start after an instance's own commit, made alone, keeps the commit as its
#: snapshot without the poll's statement: history-preserving with a watch that can vouch
#: for what came after it (PostgreSQL listens; SQLite reads the commit row's last tid,
#: its data_version having changed with the commit itself).
SKIPS_POLL_AFTER_OWN_COMMIT = {("sqlite", True), ("postgresql", True)}
#: The other cells whose poll after such a commit starts from its tid (every finish
#: reports the tid before its own).
POLLS_FROM_OWN_COMMIT = {("sqlite", False), ("postgresql", False), ("mysql", True),
                         ("mysql", False)}


def test_a_start_after_an_own_commit_made_alone_reads_no_changes(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next start knows what the commit changed (its own objects): only what came
    after it is asked, and nothing did.  Then another storage's commit is seen."""
    param = storage_factory.param
    with two_databases(storage_factory) as (db, other_db):
        tm = transaction.TransactionManager()
        root = db_root(db, tm)
        root["x"] = PersistentMapping(v=0)
        tm.commit()
        poller = db.storage.shared.backend.poller
        polls: list[int | None] = []
        poll, begin_and_poll = poller.poll, poller.begin_and_poll
        def counted_poll(conn: Any, since: Any, gone_since: Any = None, limit: int = 0) -> Any:
            polls.append(since)
            return poll(conn, since, gone_since, limit)

        def counted_begin_and_poll(conn: Any, since: Any, gone_since: Any = None,
                                   end_first: bool = False, limit: int = 0) -> Any:
            polls.append(since)
            return begin_and_poll(conn, since, gone_since, end_first, limit)
        monkeypatch.setattr(poller, "poll", counted_poll)
        monkeypatch.setattr(poller, "begin_and_poll", counted_begin_and_poll)
        first_after: list[int | None] = []   # the first poll after each commit
        own_tids = []
        for value in range(1, 4):
            tm.begin()
            root["x"]["v"] = value
            before = len(polls)
            tm.commit()
            own_tids.append(int.from_bytes(root["x"]._p_serial, "big"))
            first_after.extend(polls[before:before + 1])
        tm.begin()
        assert root["x"]["v"] == 3
        tm.abort()
        if (param.backend, param.keep_history) in SKIPS_POLL_AFTER_OWN_COMMIT:
            assert polls == []
        elif (param.backend, param.keep_history) in POLLS_FROM_OWN_COMMIT:
            # The poll after each commit asks only for what came after it, not for the
            # rows the commit itself wrote.
            assert first_after == own_tids
        else:
            raise AssertionError(f"no expectation for {param}")
        other_tm = transaction.TransactionManager()
        other_x = db_root(other_db, other_tm)["x"]
        other_x["v"] = 10
        other_tm.commit()
        wait_until_heard(db.storage, other_x._p_serial)
        tm.begin()
        assert root["x"]["v"] == 10
        tm.abort()


# -- PostgreSQL: the listening session -----------------------------------------------


@pytest.fixture
def pg() -> Iterator[PostgreSQLFactory]:
    factory = PostgreSQLFactory(Param("postgresql", True))
    yield factory
    factory.cleanup()


def options(factory: PostgreSQLFactory, **extra: Any) -> PostgreSQLOptions:
    return dataclasses.replace(factory.backend_options(), **extra)


def watch_of(storage: SQLStorage) -> CommitListener:
    watch = storage.shared.watch
    assert isinstance(watch, CommitListener)
    return watch


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def notified(watch: CommitListener, tid: int) -> Callable[[], bool]:
    """Has the notification of ``tid`` arrived (read the way a start reads it)?"""
    def arrived() -> bool:
        session = watch._session
        if session is None or not watch._lock.acquire(blocking=False):
            return False
        try:
            return watch._take_arrived(session) and session.high >= tid
        finally:
            watch._lock.release()
    return arrived


class Site:
    """A storage with a DB and its root, and a second storage on the same schema that
    does not listen (its commits stay unknown to this process, as another process's)."""

    def __init__(self, factory: PostgreSQLFactory) -> None:
        self.storage = factory.open()
        self.db = ZODB.DB(self.storage)
        self.tm = transaction.TransactionManager()
        self.root = self.db.open(self.tm).root()
        self.root["x"] = PersistentMapping(v=0)
        self.tm.commit()
        self.other = open_storage(options(factory, listen_for_commits=False))
        self.other_db = ZODB.DB(self.other)
        self.other_tm = transaction.TransactionManager()
        self.other_root = self.other_db.open(self.other_tm).root()
        idle_statements(self.storage, self.tm, self.root, 3)

    def commit_elsewhere(self, value: int) -> int:
        self.other_tm.begin()
        self.other_root["x"]["v"] = value
        self.other_tm.commit()
        return int.from_bytes(self.other_root["x"]._p_serial, "big")

    def start(self) -> tuple[int, int]:
        """One transaction start: ``(the value read, statements sent)``."""
        before = self.storage.statement_count()
        self.tm.begin()
        value = self.root["x"]["v"]
        sent = self.storage.statement_count() - before
        self.tm.abort()
        return value, sent

    def close(self) -> None:
        self.other_db.close()
        self.db.close()


@pytest.fixture
def site(pg: PostgreSQLFactory) -> Iterator[Site]:
    made = Site(pg)
    yield made
    made.close()


def test_idle_starts_send_nothing(site: Site) -> None:
    watch = watch_of(site.storage)
    assert watch.listening
    # A daemon: a process that forgets to close its storage still exits.
    assert watch._thread is not None
    assert (watch._thread.name, watch._thread.daemon) == ("zodbsql-listen", True)
    for _ in range(5):
        assert site.start() == (0, 0)


def test_commit_in_another_process_is_seen(pg: PostgreSQLFactory, site: Site) -> None:
    code = (
        "import sys, transaction, ZODB\n"
        "from zodbsql.api import open_storage\n"
        "from zodbsql.backends.postgresql.options import PostgreSQLOptions\n"
        "db = ZODB.DB(open_storage(PostgreSQLOptions(dsn=sys.argv[1], schema=sys.argv[2])))\n"
        "with db.transaction() as conn:\n"
        "    conn.root()['x']['v'] = 7\n"
        "print(int.from_bytes(db.storage.lastTransaction(), 'big'))\n"
        "db.close()\n")
    done = subprocess.run([sys.executable, "-c", code, pg.dsn, pg.path], check=True,
                          timeout=60, capture_output=True, text=True)
    wait_until(notified(watch_of(site.storage), int(done.stdout)))
    value, sent = site.start()
    assert value == 7 and sent > 0          # polled: the notification had arrived
    assert site.start() == (7, 0)           # and nothing since


def test_commit_racing_with_the_poll(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    poller = site.storage.shared.backend.poller
    poll = poller.poll
    watch = watch_of(site.storage)
    hooks: dict[str, Callable[[], Any]] = {}

    def racing_poll(conn: Any, since: int | None, gone_since: int | None = None,
                    limit: int = 0) -> Any:
        if "before" in hooks:
            hooks.pop("before")()
        polled = poll(conn, since, gone_since, limit)
        if "after" in hooks:
            hooks.pop("after")()
        return polled

    monkeypatch.setattr(poller, "poll", racing_poll)
    tids: list[int] = []
    # A commit lands just before the poll's snapshot: the poll sees it, and its
    # notification, arriving after the poll, leaves the next start quiet.
    wait_until(notified(watch, site.commit_elsewhere(1)))
    hooks["before"] = lambda: tids.append(site.commit_elsewhere(2))
    assert site.start()[0] == 2 and "before" not in hooks
    wait_until(notified(watch, tids[-1]))
    assert site.start() == (2, 0)
    # A commit lands just after the poll's snapshot: that start reads the value before
    # it, and the first start after its notification arrived polls and sees it.
    wait_until(notified(watch, site.commit_elsewhere(4)))
    hooks["after"] = lambda: tids.append(site.commit_elsewhere(3))
    assert site.start()[0] == 4 and "after" not in hooks
    wait_until(notified(watch, tids[-1]))
    value, sent = site.start()
    assert value == 3 and sent > 0
    assert site.start() == (3, 0)


def test_lost_session_falls_back_to_polling(pg: PostgreSQLFactory, site: Site) -> None:
    watch = watch_of(site.storage)
    pid = watch.session_pid
    assert pid is not None
    # pg_terminate_backend with a timeout waits until the session is gone.
    assert pg.admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone() == (True,)
    site.commit_elsewhere(5)                # no notification reaches this process
    value, sent = site.start()
    assert (value, watch.listening) == (5, False) and sent > 0
    value, sent = site.start()
    assert value == 5 and sent > 0          # polls at every start meanwhile
    wait_until(lambda: watch.listening)     # the heartbeat thread listens again
    assert watch.session_pid != pid
    site.start()
    assert site.start() == (5, 0)
    # The new session hears the next commit: a start after its notification arrived
    # polls and sees it.  (Wait for that notification: a start before it may keep
    # its snapshot, as after any commit of another process.)
    wait_until(notified(watch, site.commit_elsewhere(6)))
    value, sent = site.start()
    assert value == 6 and sent > 0
    assert site.start() == (6, 0)


def stop_heartbeats(watch: CommitListener) -> None:
    """End the heartbeat thread: the test beats by hand (``watch._beat()``)."""
    watch._stop.set()
    assert watch._thread is not None
    watch._thread.join(5)


def test_silent_session_polls(site: Site) -> None:
    watch = watch_of(site.storage)
    stop_heartbeats(watch)
    session = watch._session
    assert session is not None
    session.heard -= 60                     # as if the heartbeats had stopped answering
    assert site.start()[1] > 0
    watch._beat()                           # one answers
    assert site.start() == (0, 0)


def test_foreign_notification_polls(pg: PostgreSQLFactory, site: Site) -> None:
    watch = watch_of(site.storage)
    stop_heartbeats(watch)
    watch._beat()
    with psycopg.connect(pg.dsn, autocommit=True) as other:
        other.execute(f'SET search_path TO "{pg.path}"')
        row = other.execute("SELECT zodbsql_channel()").fetchone()
    assert row is not None
    # Anyone may NOTIFY the channel: a payload that names no tid stands for a commit
    # whose tid is unknown, so starts poll until a heartbeat has read the last tid.
    pg.admin.execute("SELECT pg_notify(%s, 'not a tid')", (row[0],))
    wait_until(lambda: notified(watch, 0)() and watch._session is not None
               and watch._session.unknown)
    assert site.start()[1] > 0
    watch._beat()
    assert site.start() == (0, 0)


def test_a_pack_that_deletes_is_announced(pg: PostgreSQLFactory, site: Site) -> None:
    """A pack makes no tid, but the deletions it records are announced (a payload that
    names none): the next start polls and takes them in, where it kept its snapshot
    until the next commit before."""
    site.other_tm.begin()
    site.other_root["doomed"] = PersistentMapping(v=1)
    site.other_tm.commit()
    site.other_tm.begin()
    del site.other_root["doomed"]
    site.other_tm.commit()
    watch = watch_of(site.storage)
    wait_until(notified(watch, int.from_bytes(site.other.lastTransaction(), "big")))
    site.start()                             # the two commits: polled
    assert site.start() == (0, 0)            # quiet since
    cache = site.storage.shared.cache
    seen_before = cache.position()[1] or 0
    session = watch._session
    assert session is not None and session.gone == seen_before
    site.other_db.pack(time.time() + 1)      # collects the mapping: a deletion record
    wait_until(lambda: notified(watch, 0)() and session.gone > seen_before)
    assert not session.unknown               # a record's number, not a foreign payload
    value, sent = site.start()
    assert value == 0 and sent > 0           # polled: the pack's record came with it
    assert cache.position()[1] == session.gone
    assert site.root._p_jar._storage._gone_seen == session.gone
    assert site.start() == (0, 0)            # and quiet again
    # A heartbeat reads the newest record too (a pack while the session was lost).
    stop_heartbeats(watch)
    with psycopg.connect(pg.dsn, autocommit=True) as other:
        other.execute(f'SET search_path TO "{pg.path}"')
        other.execute("UPDATE gone_row SET last_seq = last_seq + 1")
    watch._beat()
    assert session.gone == seen_before + 2 and site.start()[1] > 0


def test_old_procedures_poll(pg: PostgreSQLFactory, caplog: pytest.LogCaptureFixture) -> None:
    made = ZODB.DB(pg.open())               # the schema, its procedures, a root
    with made.transaction() as conn:
        conn.root()["x"] = 1
    made.close()
    pg.admin.execute(f'DROP FUNCTION "{pg.path}".zodbsql_channel()')
    pg.admin.execute(f'DROP FUNCTION "{pg.path}".zodbsql_commit_log_window()')
    caplog.set_level(logging.DEBUG, logger="zodbsql.backends.postgresql.listener")
    old = pg.open(read_only=True)           # can't install them: polls
    # Said once, and no thread tries again: the database can't announce commits.
    assert not watch_of(old).listening and watch_of(old)._thread is None
    assert listener_records(caplog) == [(logging.INFO, (
        f"zodbsql: {old.backend.describe()}: listen-for-commits is off because its"
        " commit procedures predate announcing commits (a writable storage opened on it"
        " installs them); every transaction start polls"))]
    db = ZODB.DB(old)
    try:
        tm = transaction.TransactionManager()
        root = db.open(tm).root()
        assert idle_statements(old, tm, root, 3) > 0
    finally:
        db.close()
    fresh = pg.open()                       # a writable storage installs them
    assert watch_of(fresh).listening
    fresh.close()


def test_listen_for_commits_false_polls(pg: PostgreSQLFactory) -> None:
    storage = open_storage(options(pg, listen_for_commits=False))
    db = ZODB.DB(storage)
    try:
        tm = transaction.TransactionManager()
        root = db.open(tm).root()
        root["x"] = 1
        tm.commit()
        assert idle_statements(storage, tm, root, 5) == 10
    finally:
        db.close()


def finished(work: Callable[[], Any], timeout: float = 10.0) -> Any:
    """``work()`` run in another thread, which must end within ``timeout``."""
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(work()), daemon=True)
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), "it waited"
    return result[0]


def test_a_start_while_the_session_is_busy_polls_without_waiting(site: Site) -> None:
    """A heartbeat's round trip holds the session: a start meanwhile can't take in the
    notifications waiting on its socket, so it polls (and sees the commit they
    announce) instead of waiting, or of keeping a snapshot nothing proved current."""
    watch = watch_of(site.storage)
    stop_heartbeats(watch)
    site.commit_elsewhere(7)      # its notification waits on the socket, unread
    with watch._lock:             # as the heartbeat holds it
        value, sent = finished(site.start)
    assert value == 7 and sent > 0


def test_a_process_keeps_its_newest_commit_whatever_order_commits_end_in() -> None:
    """Two threads' commits may tell the watch in either order: the newer stays."""
    key = f"test-{time.monotonic_ns()}"
    assert local_high(key) == 0
    note_local_commit(key, 10)
    note_local_commit(key, 5)
    assert local_high(key) == 10


def listener_records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(record.levelno, record.getMessage()) for record in caplog.records
            if record.name == "zodbsql.backends.postgresql.listener"]


def test_a_pooler_that_shares_sessions_turns_listening_off(
        pg: PostgreSQLFactory, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a transaction pooler LISTEN would stay with a server session other
    clients then use: the watch never listens, every start polls, and it says why."""
    storage = pg.open()
    backend = storage.backend
    monkeypatch.setattr(backend, "pooling", TRANSACTION_POOLING, raising=False)
    watch = CommitListener(backend, backend.connect)
    caplog.set_level(logging.DEBUG, logger="zodbsql.backends.postgresql.listener")
    watch.start()
    try:
        assert not watch.listening and watch._thread is None
        assert watch.quiet(backend.connect, 0, None) == (False, None)
        assert listener_records(caplog) == [(logging.INFO, (
            f"zodbsql: {backend.describe()}: listen-for-commits is off because the server"
            " is reached through a pooler that shares server sessions between"
            " transactions, where LISTEN does not stay with the session; every"
            " transaction start polls"))]
    finally:
        watch.close()
        storage.close()


def test_listening_that_fails_is_said_once_and_again_when_it_works(
        pg: PostgreSQLFactory, caplog: pytest.LogCaptureFixture) -> None:
    """A WARNING when the watch can't listen, DEBUG while it still can't (the thread
    tries every second), INFO once it listens again; a WARNING when the session is
    lost, then INFO when it is back."""
    storage = pg.open()
    backend = storage.backend
    where = backend.describe()
    refused = ConnectionLost("could not connect to the server: Connection refused")
    attempts: list[int] = []

    def connect() -> Any:
        attempts.append(1)
        if len(attempts) in (1, 2, 4):
            raise refused
        return backend.connect()
    watch = CommitListener(backend, connect)
    at_once = CommitListener(backend, backend.connect)
    caplog.set_level(logging.DEBUG, logger="zodbsql.backends.postgresql.listener")
    cannot = (f"zodbsql: {where}: cannot listen for commits ({described(refused)});"
              " every transaction start polls until it can")
    listening = f"zodbsql: {where}: listening for commits"
    head = f"zodbsql: {where}: the session listening for commits was lost ("
    tail = "); every transaction start polls until it listens again"

    def lost_once() -> None:
        [(level, lost)] = listener_records(caplog)
        assert level == logging.WARNING
        assert lost.startswith(head) and lost.endswith(tail)
        assert lost[len(head):-len(tail)] not in ("", "None")
        caplog.clear()
    try:
        at_once._listen()                   # nothing to say: it simply listens
        assert at_once.listening
        assert listener_records(caplog) == [(logging.DEBUG, listening)]
        caplog.clear()
        watch._listen()
        watch._listen()
        assert not watch.listening
        watch._listen()
        assert watch.listening
        assert listener_records(caplog) == [(logging.WARNING, cannot),
                                            (logging.DEBUG, cannot),
                                            (logging.INFO, listening)]
        caplog.clear()
        watch._drop()
        watch._listen()                     # a new outage: said again
        watch._listen()
        assert listener_records(caplog) == [(logging.WARNING, cannot),
                                            (logging.INFO, listening)]
        caplog.clear()
        # Lost, as a start finds it (the notifications' socket) ...
        pg.admin.execute("SELECT pg_terminate_backend(%s, 5000)", (watch.session_pid,))
        wait_until(lambda: watch.quiet(backend.connect, 0, None)[0] is False
                   and not watch.listening)
        lost_once()
        watch._listen()
        assert watch.listening
        assert listener_records(caplog) == [(logging.INFO, listening)]
        caplog.clear()
        # ... and as a heartbeat finds it.
        pg.admin.execute("SELECT pg_terminate_backend(%s, 5000)", (watch.session_pid,))
        watch._beat()
        assert not watch.listening
        lost_once()
    finally:
        at_once.close()
        watch.close()
        storage.close()


def test_a_commit_to_another_database_of_the_process_leaves_starts_quiet(
        pg: PostgreSQLFactory, site: Site) -> None:
    """What a process committed is known per database: a commit to another one (here
    another schema) tells this database's starts nothing, and they keep sending none."""
    other = PostgreSQLFactory(Param("postgresql", True))
    try:
        elsewhere = ZODB.DB(other.open())
        with elsewhere.transaction() as conn:
            conn.root()["y"] = 1
        elsewhere.close()
        assert site.start() == (0, 0)
    finally:
        other.cleanup()


def test_history_free_start_keeps_only_an_open_snapshot() -> None:
    """History-free PostgreSQL listens too, but a start keeps its snapshot only while
    the read transaction its last poll began is open: after ZODB's afterCompletion
    poll (a plain transaction manager), not after an explicit one's abort, which ends
    it with no poll; and a commit heard before the start makes it poll.  A closed ZODB
    connection waits in the pool with no read transaction open."""
    hf = PostgreSQLFactory(Param("postgresql", False))
    storage = hf.open()
    other = hf.open()
    db = ZODB.DB(storage)
    other_db = ZODB.DB(other)
    try:
        assert isinstance(storage.shared.watch, CommitListener)
        tm = transaction.TransactionManager()
        root = db.open(tm).root()
        root["x"] = PersistentMapping(v=0)
        tm.commit()
        idle_statements(storage, tm, root, 3)
        # afterCompletion leaves the read transaction for its poll, which hears of no
        # commit and keeps it; so does the begin: nothing is sent.
        assert idle_statements(storage, tm, root, 5) == 0
        instance = root._p_jar._storage
        tm.begin()
        assert instance._read_txn      # the snapshot the afterCompletion poll began
        tm.abort()
        # Another storage commits; once heard, the next start polls and sees it.
        other_tm = transaction.TransactionManager()
        other_root = db_root(other_db, other_tm)
        other_root["x"]["v"] = 1
        other_tm.commit()
        wait_until_heard(storage, other_root["x"]._p_serial)
        tm.begin()
        assert root["x"]["v"] == 1
        # A commit heard while a transaction runs: the poll after its abort's
        # afterCompletion ends the read transaction and begins the next in one query
        # (a ROLLBACK of its own would be a second round trip), then the begin keeps it.
        other_root["x"]["v"] = 2
        other_tm.commit()
        wait_until_heard(storage, other_root["x"]._p_serial)
        before = storage.statement_count()
        tm.abort()
        assert storage.statement_count() - before == 1
        tm.begin()
        assert storage.statement_count() - before == 1
        assert root["x"]["v"] == 2
        tm.abort()
        # Explicit: nothing polls after the abort, which ended the read transaction,
        # so every begin polls (COMMIT-less: BEGIN and the poll), and ROLLBACK.
        explicit = transaction.TransactionManager(explicit=True)
        explicit_root = db.open(explicit).root()
        explicit_storage = explicit_root._p_jar._storage
        explicit.begin()
        assert explicit_root["x"]["v"] == 2
        explicit.abort()
        idle_statements(explicit_storage, explicit, explicit_root, 2)
        assert idle_statements(explicit_storage, explicit, explicit_root, 5) == 10
        explicit.begin()    # DB.close aborts every connection's transaction manager
        # Closed, a plain one's connection ends its read transaction (no poll follows).
        instance = root._p_jar._storage
        assert instance._read_txn
        root._p_jar.close()
        assert not instance._read_txn
        assert instance._load is None or not instance._load.in_transaction
    finally:
        other_db.close()
        db.close()
        hf.cleanup()


# -- PostgreSQL: the server's own count -------------------------------------------------

LOG_SETTINGS = "log_statement = all\nlog_line_prefix = '%a|%p|'\n"
APPLICATION = "zodbsql-idle"


@pytest.fixture(scope="module")
def logging_server() -> Iterator[tuple[str, pathlib.Path]]:
    with private_postgresql(LOG_SETTINGS) as (dsn, directory):
        yield dsn, pathlib.Path(directory) / "log"


def logged(log: pathlib.Path, start: str, end: str) -> list[str]:
    """The statements the server logged between the two markers."""
    text = log.read_text(errors="replace")
    between = text[text.index(start):text.index(end)]
    return [line for line in between.splitlines()
            if re.search(r"LOG:\s+(statement|execute [^:]*):", line)]


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
def test_server_logs_no_statement_for_idle_starts(
        logging_server: tuple[str, pathlib.Path], keep_history: bool) -> None:
    """History-free too: the read transaction its afterCompletion poll began is kept
    by the starts that follow, and ended by none of them (storage/next_poll.py)."""
    dsn, log = logging_server
    factory = PostgreSQLFactory(Param("postgresql", keep_history),
                                dsn=f"{dsn} application_name={APPLICATION}")
    try:
        storage = factory.open()
        db = ZODB.DB(storage)
        tm = transaction.TransactionManager()
        root = db.open(tm).root()
        root["x"] = PersistentMapping(v=0)
        tm.commit()
        idle_statements(storage, tm, root, 3)
        listener = watch_of(storage).session_pid
        start, end = f"zodbsql-idle-start-{keep_history}", f"zodbsql-idle-end-{keep_history}"
        factory.admin.execute(f"SELECT '{start}'")
        began = time.monotonic()
        assert idle_statements(storage, tm, root, 100) == 0
        elapsed = time.monotonic() - began
        factory.admin.execute(f"SELECT '{end}'")
        wait_until(lambda: end in log.read_text(errors="replace"))
        lines = logged(log, start, end)
        admin = factory.admin.info.backend_pid    # it sends the markers
        ours = [line for line in lines if line.startswith(f"{APPLICATION}|")
                and not line.startswith(f"{APPLICATION}|{admin}|")]
        heartbeats = [line for line in ours if line.startswith(f"{APPLICATION}|{listener}|")]
        # The 100 starts sent nothing; the listening session's heartbeat (one a second)
        # is all this storage sent meanwhile.
        assert ours == heartbeats
        assert len(heartbeats) <= elapsed + 2
        db.close()
    finally:
        factory.cleanup()
