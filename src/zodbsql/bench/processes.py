"""Worker processes on one zodbsql database, released together, and what they retried.

Used by scripts/contention.py and the contention tests.  A worker is a module-level
function ``target(options, keep_history, number, barrier, results, *args)`` (spawned
processes import it) that waits at ``barrier`` when it is ready and sends its retries
through ``report``; the parent waits at the same barrier, so the time it measures runs
from the release to the last report.
"""
from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import transaction
import ZODB

from zodbsql.bench import hotspot

#: Seconds the parent waits for a worker to get ready, or for the next report.
WAIT = 300


@dataclass
class Finished:
    seconds: float                                   # release to the last report
    retries: hotspot.Retries = field(default_factory=hotspot.Retries)
    errors: dict[int, str] = field(default_factory=dict)   # worker number -> error


def report(number: int, barrier: Any, results: Any,
           work: Callable[[], hotspot.Retries]) -> None:
    """Run a worker's work and send the parent its retries, or its error."""
    try:
        results.put((number, work().by_error, None))
    except BaseException as exc:
        barrier.abort()     # nobody waits for a worker that failed before it was ready
        results.put((number, {}, f"{type(exc).__name__}: {exc}"))


def run(target: Callable[..., None], options: Any, keep_history: bool, processes: int,
        *args: Any) -> Finished:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=target,
                         args=(options, keep_history, n, barrier, results, *args))
             for n in range(processes)]
    for proc in procs:
        proc.start()
    finished = Finished(0.0)
    try:
        try:
            barrier.wait(WAIT)
        except threading.BrokenBarrierError:
            pass    # a worker failed (or hung) getting ready: the reports say which
        start = time.perf_counter()
        for _ in procs:
            number, by_error, error = results.get(timeout=WAIT)
            finished.retries.merge(by_error)
            if error:
                finished.errors[number] = error
        finished.seconds = time.perf_counter() - start
    except queue.Empty:
        finished.errors[-1] = f"a worker did not report within {WAIT}s"
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
            elif proc.exitcode and not finished.errors:
                finished.errors[-1] = f"a worker exited with {proc.exitcode}"
    return finished


def hotspot_worker(options: Any, keep_history: bool, number: int, barrier: Any,
                   results: Any, name: str, transactions: int, keys: int) -> None:
    """The hotspot workload on ``root[name]`` (made by ``hotspot.make_shared``)."""
    def work() -> hotspot.Retries:
        import zodbsql
        db = ZODB.DB(zodbsql.open_storage(options, keep_history=keep_history))
        try:
            tm = transaction.TransactionManager(explicit=True)
            conn = db.open(tm)
            barrier.wait(WAIT)
            retries = hotspot.run(tm, lambda: conn.root()[name], name, number,
                                  transactions, keys)
            conn.close()
            return retries
        finally:
            db.close()
    report(number, barrier, results, work)
