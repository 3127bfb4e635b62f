"""Contended commits never deadlock on the server, and lose nothing (issue 11).

Two workloads, each run by several OS processes on one database:

* crossing: two processes; each writes its own object and reads the other's current
  (``readCurrent``): A writes x and reads y while B writes y and reads x.  A barrier
  before the first commit attempt of every round makes the votes overlap.  Whether
  a round deadlocks depends on timing (at f840cce 4 to 25 rounds of 40 deadlocked),
  hence many rounds; the hotspot below meets such crossings all the time.
* hotspot: every transaction inserts fresh keys into one shared OOBTree and bumps one
  shared ``BTrees.Length`` (BTrees call readCurrent on the parent of every bucket they
  change), retried on TransientError as ``transaction.manager.attempts()`` does.

Both assert that the totals are exact and that the server's own deadlock counter did
not move: PostgreSQL's ``pg_stat_database.deadlocks`` of a database the test creates
(no other session counts there), MariaDB/MySQL's ``Innodb_deadlocks`` (server-wide: a
deadlock in another session on the same server during the test counts too).  SQLite
serialises commits with its write lock and has no such counter: its totals are checked.
"""
from __future__ import annotations

import multiprocessing
import queue
import threading
from typing import Any, Callable, Iterator

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping

import zodbsql
from tests.databases import PostgreSQLDatabaseFactory, StorageFactory
from zodbsql.bench import hotspot
from zodbsql.bench.deadlocks import DeadlockCounter, counter_for_options

PAIR = 2               # crossing: processes in the ring (A and B)
ROUNDS = 40            # crossing: commits per process, each voting with the other's
PROCESSES = 3          # hotspot: processes
TRANSACTIONS = 100     # hotspot: transactions per process
KEYS = hotspot.KEYS_PER_TRANSACTION
WAIT = 120             # seconds a worker may take, far above what the workload needs


@pytest.fixture
def contended(storage_factory: StorageFactory, tmp_path: Any) -> Iterator[StorageFactory]:
    """The cell's factory; on PostgreSQL one in a database of its own, so its deadlock
    counter counts this test's sessions only."""
    if storage_factory.param.backend != "postgresql":
        yield storage_factory
        return
    factory = PostgreSQLDatabaseFactory(storage_factory.param, tmp_path)
    try:
        yield factory
    finally:
        factory.cleanup()


def open_db(options: Any, keep_history: bool) -> ZODB.DB:
    return ZODB.DB(zodbsql.open_storage(options, keep_history=keep_history))


def run_processes(factory: StorageFactory, processes: int,
                  target: Callable[..., None]) -> list[hotspot.Retries]:
    """Spawned workers ``target(options, keep_history, number, barrier, results)``;
    their retries, after checking that every one succeeded."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(factory.backend_options(),
                                              factory.param.keep_history, n, barrier,
                                              results))
             for n in range(processes)]
    for proc in procs:
        proc.start()
    reports: dict[int, tuple[dict[str, int], str | None]] = {}
    try:
        for _ in procs:
            number, by_error, error = results.get(timeout=WAIT)
            reports[number] = (by_error, error)
    except queue.Empty:
        pytest.fail(f"workers did not report within {WAIT}s: got {sorted(reports)}")
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    assert {n: error for n, (_, error) in reports.items() if error} == {}
    assert [proc.exitcode for proc in procs] == [0] * processes
    return [hotspot.Retries(dict(by_error)) for by_error, _ in reports.values()]


def report(number: int, results: Any, work: Callable[[], hotspot.Retries]) -> None:
    """Run a worker's work and send the parent its retries or its error."""
    try:
        results.put((number, work().by_error, None))
    except BaseException as exc:
        results.put((number, {}, repr(exc)))


def deadlocks_before(factory: StorageFactory) -> tuple[DeadlockCounter | None, int]:
    counter = counter_for_options(factory.backend_options())
    assert (counter is None) == (factory.param.backend == "sqlite")
    return counter, counter.settled() if counter is not None else 0


def assert_no_new_deadlocks(counter: DeadlockCounter | None, before: int,
                            retried: hotspot.Retries) -> None:
    if counter is None:
        return    # SQLite: no server, commits serialised by the write lock
    new = counter.settled() - before
    assert new == 0, (f"the {counter.server} {counter.scope} counted {new} deadlock(s)"
                      f" during the test; retried errors: {retried.by_error}")


def total(retries: list[hotspot.Retries]) -> hotspot.Retries:
    merged = hotspot.Retries()
    for one in retries:
        merged.merge(one.by_error)
    return merged


# -- crossing write / read-current sets -------------------------------------------------
def crossing_worker(options: Any, keep_history: bool, number: int, barrier: Any,
                    results: Any) -> None:
    def work() -> hotspot.Retries:
        db = open_db(options, keep_history)
        try:
            tm = transaction.TransactionManager(explicit=True)
            conn = db.open(tm)
            mine, other = f"o{number}", f"o{(number + 1) % PAIR}"
            retries = hotspot.Retries()
            for _ in range(ROUNDS):
                first = [True]

                def change() -> None:
                    root = conn.root()
                    root[mine]["value"] += 1
                    assert root[other]["value"] >= 0     # loaded: its serial is known
                    conn.readCurrent(root[other])
                    if first:   # the first attempt of every round votes with the others
                        first.clear()
                        barrier.wait(WAIT)
                hotspot.commit_with_retries(tm, change, retries)
            conn.close()
            return retries
        finally:
            db.close()
    report(number, results, work)


def test_crossing_read_current_sets_do_not_deadlock(contended: StorageFactory) -> None:
    db = ZODB.DB(contended.open())
    with db.transaction() as conn:
        for n in range(PAIR):
            conn.root()[f"o{n}"] = PersistentMapping(value=0)
    db.close()
    counter, before = deadlocks_before(contended)

    retried = total(run_processes(contended, PAIR, crossing_worker))

    assert_no_new_deadlocks(counter, before, retried)
    db = ZODB.DB(contended.open())
    try:
        with db.transaction() as conn:
            values = [conn.root()[f"o{n}"]["value"] for n in range(PAIR)]
    finally:
        db.close()
    assert values == [ROUNDS] * PAIR
    # Two commits that each read what the other writes can't both succeed: retries
    # prove the votes really overlapped.
    assert retried.total > 0, "no commit was ever retried: the votes did not overlap"


# -- the BTree + Length hotspot ---------------------------------------------------------
def hotspot_worker(options: Any, keep_history: bool, number: int, barrier: Any,
                   results: Any) -> None:
    def work() -> hotspot.Retries:
        db = open_db(options, keep_history)
        try:
            tm = transaction.TransactionManager(explicit=True)
            conn = db.open(tm)
            barrier.wait(WAIT)
            retries = hotspot.run(tm, lambda: conn.root()["hot"], "test", number,
                                  TRANSACTIONS, KEYS)
            conn.close()
            return retries
        finally:
            db.close()
    report(number, results, work)


def test_btree_and_length_hotspot_is_exact_without_deadlocks(
        contended: StorageFactory) -> None:
    db = ZODB.DB(contended.open())
    tm = transaction.TransactionManager(explicit=True)
    conn = db.open(tm)
    hotspot.make_shared(tm, conn.root, "hot")
    conn.close()
    db.close()
    counter, before = deadlocks_before(contended)

    retried = total(run_processes(contended, PROCESSES, hotspot_worker))

    assert_no_new_deadlocks(counter, before, retried)
    db = ZODB.DB(contended.open())
    try:
        with db.transaction() as conn:
            hot = conn.root()["hot"]
            expected = hotspot.expected_keys("test", PROCESSES, TRANSACTIONS, KEYS)
            assert len(expected) == PROCESSES * TRANSACTIONS * KEYS
            assert hot["length"]() == len(expected)
            assert set(hot["tree"].keys()) == expected
    finally:
        db.close()
    print(f"hotspot {contended.param.id}: retried {retried.by_error}")


# -- the counter the tests above rely on ------------------------------------------------
class TestDeadlockCounter:
    """The counter moves when the server sees a deadlock, so "it did not move" above
    means something."""

    history_modes = (True,)
    history_modes_reason = "the counter is the server's; the history mode plays no part"

    def test_a_deadlock_moves_the_counter(self, contended: StorageFactory) -> None:
        options = contended.backend_options()
        counter = counter_for_options(options)
        if contended.param.backend == "sqlite":
            assert counter is None     # no server: the tests above check totals only
            return
        assert counter is not None
        contended.open().close()       # the schema, so the backend can connect
        before = counter.settled()
        make_a_deadlock(options)
        new = counter.settled() - before
        if contended.param.backend == "postgresql":
            assert new == 1            # the test's own database: no one else counts
        else:
            assert new >= 1            # server-wide: others' deadlocks count too


def make_a_deadlock(options: Any) -> None:
    """Two sessions lock two rows in opposite orders; the server ends one of them."""
    backend = options.create_backend(True, 30.0)
    a, b = backend.connect(), backend.connect()
    errors: list[Exception] = []
    try:
        a.execute("CREATE TABLE deadlock_probe (id INT PRIMARY KEY)")
        a.execute("INSERT INTO deadlock_probe VALUES (1), (2)")
        for conn, row in ((a, 1), (b, 2)):
            conn.execute("BEGIN")
            conn.fetchall(f"SELECT id FROM deadlock_probe WHERE id = {row} FOR UPDATE")

        def lock(conn: Any, row: int) -> None:
            try:
                conn.fetchall(f"SELECT id FROM deadlock_probe WHERE id = {row} FOR UPDATE")
            except Exception as exc:   # the victim; the other gets its row
                errors.append(exc)
            finally:
                conn.execute("ROLLBACK")
        waiting = threading.Thread(target=lock, args=(a, 2))
        waiting.start()
        lock(b, 1)
        waiting.join(60)
        assert len(errors) == 1 and "deadlock" in str(errors[0]).lower(), errors
        a.execute("DROP TABLE deadlock_probe")
    finally:
        a.close()    # sessions end: PostgreSQL sends their statistics now
        b.close()
