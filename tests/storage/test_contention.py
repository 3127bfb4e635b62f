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

A third runs threads of one process whose ZODB connections come and go (more threads
than the DB's pool keeps): every counter ends at the commits that moved it, and no
storage instance's poll takes the database for one gone back in time.
"""
from __future__ import annotations

import logging
import multiprocessing
import random
import threading
from typing import Any, Iterator

import pytest
import transaction
import transaction.interfaces
import ZODB
from persistent.mapping import PersistentMapping

import zodbsql
from tests.databases import PostgreSQLDatabaseFactory, StorageFactory
from zodbsql.bench import hotspot, processes
from zodbsql.bench.deadlocks import DeadlockCounter, counter_for_options

PAIR = 2               # crossing: processes (A and B)
ROUNDS = 40            # crossing: commits per process, each voting with the other's
PROCESSES = 3          # hotspot: processes
TRANSACTIONS = 100     # hotspot: transactions per process
KEYS = hotspot.KEYS_PER_TRANSACTION


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


def run_processes(factory: StorageFactory, count: int, target: Any,
                  *args: Any) -> hotspot.Retries:
    """The workers' retries, once every one of them finished without an error."""
    finished = processes.run(target, factory.backend_options(),
                             factory.param.keep_history, count, *args)
    assert finished.errors == {}
    return finished.retries


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


# -- crossing write / read-current sets -------------------------------------------------
def crossing_worker(options: Any, keep_history: bool, number: int, start: Any,
                    results: Any, rounds: Any) -> None:
    def work() -> hotspot.Retries:
        db = ZODB.DB(zodbsql.open_storage(options, keep_history=keep_history))
        try:
            tm = transaction.TransactionManager(explicit=True)
            conn = db.open(tm)
            mine, other = f"o{number}", f"o{(number + 1) % PAIR}"
            retries = hotspot.Retries()
            start.wait(processes.WAIT)
            for _ in range(ROUNDS):
                first = [True]

                def change() -> None:
                    root = conn.root()
                    root[mine]["value"] += 1
                    assert root[other]["value"] >= 0     # loaded: its serial is known
                    conn.readCurrent(root[other])
                    if first:   # the first attempt of every round votes with the other's
                        first.clear()
                        rounds.wait(processes.WAIT)
                hotspot.commit_with_retries(tm, change, retries)
            conn.close()
            return retries
        except BaseException:
            rounds.abort()      # the other worker must not wait for this one
            raise
        finally:
            db.close()
    processes.report(number, start, results, work)


def test_crossing_read_current_sets_do_not_deadlock(contended: StorageFactory) -> None:
    db = ZODB.DB(contended.open())
    with db.transaction() as conn:
        for n in range(PAIR):
            conn.root()[f"o{n}"] = PersistentMapping(value=0)
    db.close()
    counter, before = deadlocks_before(contended)

    rounds = multiprocessing.get_context("spawn").Barrier(PAIR)
    retried = run_processes(contended, PAIR, crossing_worker, rounds)

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
def test_btree_and_length_hotspot_is_exact_without_deadlocks(
        contended: StorageFactory) -> None:
    db = ZODB.DB(contended.open())
    tm = transaction.TransactionManager(explicit=True)
    conn = db.open(tm)
    hotspot.make_shared(tm, conn.root, "hot")
    conn.close()
    db.close()
    counter, before = deadlocks_before(contended)

    retried = run_processes(contended, PROCESSES, processes.hotspot_worker, "hot",
                            TRANSACTIONS, KEYS)

    assert_no_new_deadlocks(counter, before, retried)
    db = ZODB.DB(contended.open())
    try:
        with db.transaction() as conn:
            hot = conn.root()["hot"]
            expected = hotspot.expected_keys("hot", PROCESSES, TRANSACTIONS, KEYS)
            assert len(expected) == PROCESSES * TRANSACTIONS * KEYS
            assert hot["length"]() == len(expected)
            assert set(hot["tree"].keys()) == expected
    finally:
        db.close()
    print(f"hotspot {contended.param.id}: retried {retried.by_error}")


# -- rekey beside the site's commits --------------------------------------------------
#: Objects rekey rewrites, written in one transaction: their rows share one tid.
REKEY_OBJECTS = 600
#: Rekey passes, each to a new key id: every pass rewrites every row.
REKEY_PASSES = 5


def test_rekey_beside_a_committing_writer_does_not_deadlock(
        contended: StorageFactory, tmp_path: Any) -> None:
    """``zodbsql rekey`` rewrites rows in short batches while a writer commits to the
    same objects.  Its UPDATE names a row by oid and tid; read at REPEATABLE READ on
    MariaDB it went through the tid index and kept next-key locks on the rows of other
    objects written at the same tid, and a commit replacing one of those deadlocked with
    it in finish (1 run in 4 of test_atrest's rekey test; the server picked rekey as the
    victim only because its batch had written less).  Totals are checked too."""
    from tests.storage.test_atrest import check, fill, key_file, new_key
    from zodbsql.atrest.rekey import rekey
    keys = [f"k{n}:{new_key()}" for n in range(REKEY_PASSES + 1)]
    db = ZODB.DB(contended.open(key_file=key_file(tmp_path, keys[0])))
    fill(db, count=REKEY_OBJECTS)
    db.close()
    every = key_file(tmp_path, *keys, name="every")
    counter, before = deadlocks_before(contended)
    site = ZODB.DB(contended.open(key_file=every, key_id="k0"))
    stop = threading.Event()
    commits = [0]
    failures: list[BaseException] = []

    def write() -> None:
        manager = transaction.TransactionManager()
        conn = site.open(manager)
        try:
            while not stop.is_set():
                for attempt in manager.attempts():
                    with attempt:
                        item = conn.root()[f"item{commits[0] % REKEY_OBJECTS}"]
                        item["small"] = -commits[0]
                commits[0] += 1
        except BaseException as exc:
            failures.append(exc)
        finally:
            conn.close()

    writer = threading.Thread(target=write)
    writer.start()
    rewritten = 0
    try:
        for key_id in range(1, REKEY_PASSES + 1):
            storage = contended.open(key_file=every, key_id=f"k{key_id}")
            rewritten += rekey(storage.backend, storage.shared.codec, batch=10).states_rewritten
            storage.close()
    finally:
        stop.set()
        writer.join()
    site.close()
    assert failures == [] and commits[0] > 0
    assert rewritten >= REKEY_PASSES * REKEY_OBJECTS
    assert_no_new_deadlocks(counter, before, hotspot.Retries())
    db = ZODB.DB(contended.open(key_file=every, key_id="k0"))
    check(db, count=REKEY_OBJECTS)
    db.close()


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


def test_a_worker_that_fails_is_reported_not_waited_for(tmp_path: Any) -> None:
    from zodbsql.backends.sqlite.options import SQLiteOptions
    missing = SQLiteOptions(path=str(tmp_path / "no-such-dir" / "db.sqlite"))
    finished = processes.run(processes.hotspot_worker, missing, True, 2, "hot", 1, 1)
    assert sorted(finished.errors) == [0, 1] and finished.retries.total == 0


# -- threads whose ZODB connections come and go ------------------------------------------
THREADS = 16           # churn: threads of one process
CHURN_TRANSACTIONS = 100  # churn: transactions per thread, a ZODB connection each 1 to 3
PAIRS = 4              # churn: objects whose two counters move together


def test_threads_with_connections_made_and_dropped_lose_nothing_and_never_reset(
        storage_factory: StorageFactory, caplog: pytest.LogCaptureFixture) -> None:
    """More threads than the DB's pool keeps connections for, so storage instances are
    made and released all along (their first polls race the others'), each transaction
    checking that every pair's two counters agree and half of them moving one pair:
    every counter ends at the number of commits that moved it, and no poll took the
    database for one gone back in time (which drops every cached state)."""
    storage = storage_factory.open()
    db = ZODB.DB(storage, pool_size=2)
    with db.transaction() as conn:
        for pair in range(PAIRS):
            conn.root()[pair] = PersistentMapping(a=0, b=0)
    moved = [0] * PAIRS
    seen_apart: list[str] = []
    lock = threading.Lock()

    def work(seed: int) -> None:
        rng = random.Random(seed)
        done = 0
        while done < CHURN_TRANSACTIONS:
            tm = transaction.TransactionManager()
            conn = db.open(tm)
            try:
                for _ in range(rng.randint(1, 3)):
                    done += 1
                    tm.begin()
                    root = conn.root()
                    seen_apart.extend(f"pair {p}: {root[p]['a']} {root[p]['b']}"
                                      for p in range(PAIRS) if root[p]["a"] != root[p]["b"])
                    pair, move = rng.randrange(PAIRS), rng.random() < 0.5
                    if move:
                        root[pair]["a"] += 1
                        root[pair]["b"] += 1
                    try:
                        tm.commit()
                    except transaction.interfaces.TransientError:
                        tm.abort()
                        continue
                    if move:
                        with lock:
                            moved[pair] += 1
            finally:
                conn.close()

    try:
        with caplog.at_level(logging.WARNING, logger="zodbsql"):
            threads = [threading.Thread(target=work, args=(seed,)) for seed in range(THREADS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
        assert seen_apart == []
        with db.transaction() as conn:
            assert [(conn.root()[p]["a"], conn.root()[p]["b"]) for p in range(PAIRS)] == [
                (count, count) for count in moved]
        assert sum(moved) > 0
        assert [r.getMessage() for r in caplog.records if "back in time" in r.getMessage()] == []
        assert storage.shared.resets == 0
    finally:
        db.close()
