"""Several OS processes commit to one database at once through ZODB.DB.

Each worker opens its own storage (same backend options and mode) and runs three kinds
of transaction: a ``BTrees.Length.Length`` change (conflicts are resolved by the
storage, so it must never surface a ConflictError), an increment of a plain attribute
of a shared PersistentMapping (not resolvable: ConflictError, retried) and an insert of
its own keys into a shared OOBTree (bucket splits may conflict: retried).  The totals
prove that no committed update was lost.
"""
from __future__ import annotations

import multiprocessing
import queue
from typing import Any

import pytest
import transaction
import ZODB
from BTrees.Length import Length
from BTrees.OOBTree import OOBTree
from persistent.mapping import PersistentMapping
from transaction.interfaces import TransientError
from ZODB.POSException import ConflictError

import zodbsql

PROCESSES = 4
TRANSACTIONS = 30
#: Retries of one transaction before a worker gives up (far above what contention needs).
MAX_ATTEMPTS = 200


def _commit_with_retry(tm: transaction.TransactionManager, conn: Any, change: Any,
                       counts: dict[str, int], kind: str) -> None:
    """Run ``change(root)`` in a transaction until it commits; count the conflicts."""
    for _ in range(MAX_ATTEMPTS):
        tm.begin()
        try:
            change(conn.root())
            tm.commit()
            return
        except Exception as exc:
            tm.abort()
            if not isinstance(exc, TransientError):
                raise
            key = "conflicts" if isinstance(exc, ConflictError) else "other_transient"
            counts[f"{kind}_{key}"] = counts.get(f"{kind}_{key}", 0) + 1
    raise AssertionError(f"{kind}: no commit after {MAX_ATTEMPTS} attempts")


def worker(backend_options: Any, keep_history: bool, number: int,
           barrier: Any, results: Any) -> None:
    """One process: TRANSACTIONS rounds of the three kinds of transaction."""
    counts: dict[str, int] = {}
    storage = zodbsql.open_storage(backend_options, keep_history=keep_history)
    db = ZODB.DB(storage)
    try:
        tm = transaction.TransactionManager(explicit=True)
        conn = db.open(tm)
        barrier.wait(timeout=60)  # start together, so the commits really overlap

        def bump_length(root: Any) -> None:
            root["length"].change(1)

        def bump_plain(root: Any) -> None:
            root["plain"]["count"] += 1

        for i in range(TRANSACTIONS):
            def add_key(root: Any, i: int = i) -> None:
                root["tree"][f"p{number}-{i:03d}"] = number
            _commit_with_retry(tm, conn, bump_length, counts, "length")
            _commit_with_retry(tm, conn, bump_plain, counts, "plain")
            _commit_with_retry(tm, conn, add_key, counts, "tree")
        conn.close()
        results.put((number, counts, None))
    except BaseException as exc:  # report it to the parent instead of dying silently
        results.put((number, counts, repr(exc)))
    finally:
        db.close()


def test_processes_commit_concurrently(storage_factory: Any) -> None:
    keep_history = storage_factory.param.keep_history
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        root = conn.root()
        root["length"] = Length()
        root["plain"] = PersistentMapping({"count": 0})
        root["tree"] = OOBTree()
    db.close()

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(storage_factory.backend_options(),
                                              keep_history, n, barrier, results))
             for n in range(PROCESSES)]
    for proc in procs:
        proc.start()
    reports = {}
    try:
        for _ in procs:
            number, counts, error = results.get(timeout=120)
            reports[number] = (counts, error)
    except queue.Empty:
        pytest.fail(f"workers did not report: got {sorted(reports)}")
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    assert {n: e for n, (_, e) in reports.items() if e} == {}
    assert [proc.exitcode for proc in procs] == [0] * PROCESSES

    total = PROCESSES * TRANSACTIONS
    db = ZODB.DB(storage_factory.open())
    try:
        with db.transaction() as conn:
            root = conn.root()
            assert root["length"]() == total
            assert root["plain"]["count"] == total
            expected = {f"p{n}-{i:03d}" for n in range(PROCESSES) for i in range(TRANSACTIONS)}
            assert set(root["tree"].keys()) == expected
    finally:
        db.close()

    conflicts: dict[str, int] = {}
    for counts, _ in reports.values():
        for key, value in counts.items():
            conflicts[key] = conflicts.get(key, 0) + value
    print(f"conflicts ({'hp' if keep_history else 'hf'}): {conflicts}")
    # The Length resolves every conflict, in both modes: none may reach the application.
    assert conflicts.get("length_conflicts", 0) == 0, conflicts
