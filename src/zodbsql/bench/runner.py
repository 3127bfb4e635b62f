"""Worker processes: start them, release them together, time them, stop them.

A *host* is one worker process with one open database.  A contender that several
processes can share (zodbsql, ZEO, RelStorage) gets one host per worker: ``c`` writers
and ``c`` readers.  A storage that one process owns (FileStorage, MappingStorage) gets a
single host whose workers are threads.  Workers of a test wait at a barrier, so they
start together; the figure of a test is the work of all workers divided by the wall time
from the release (the earliest start) to the last finish.
"""
from __future__ import annotations

import cProfile
import gc
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from zodbsql.bench import soak, workloads
from zodbsql.bench.memory import memory
from zodbsql.bench.contenders import Contender
from zodbsql.bench.workloads import Outcome, Params, TESTS, Unit
from zodbsql.errors import ConfigurationError

BARRIER_TIMEOUT = 300


class BenchFailure(RuntimeError):
    """A worker failed, or a test did not do what it must (steamin loading objects)."""


@dataclass
class HostSpec:
    host_id: int
    contender: Contender
    units: list[tuple[str, int]]      # (role, index)
    params: Params
    profile_dir: str | None
    label: str                        # used in profile file names


def _statements(db: Any) -> int | None:
    count = getattr(db.storage, "statement_count", None)
    return count() if count is not None else None


def _metrics(db: Any) -> dict[str, float] | None:
    """A zodbsql storage's metrics now (turned on for the bench when prometheus_client
    is installed), or None for other storages."""
    enable = getattr(db.storage, "enable_metrics", None)
    if enable is None:
        return None
    try:
        return dict(enable().snapshot())
    except ConfigurationError:        # no prometheus_client: the bench goes on without
        return None


def _delta(before: dict[str, float] | None,
           after: dict[str, float] | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    return {key: value - before.get(key, 0.0) for key, value in after.items()
            if value != before.get(key, 0.0)}


def host_main(spec: HostSpec, commands: Any, results: Any, barriers: dict[str, Any]) -> None:
    """The worker process: open the database, then run commands until told to stop."""
    # Ctrl-C reaches the whole process group: the parent stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in ("ZODB", "ZEO", "zodbsql", "relstorage"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        db = spec.contender.open_db()
        units = [Unit(role, index, spec.params) for role, index in spec.units]
        for unit in units:
            unit.connect(db)
        results.put((spec.host_id, "ready", None))
    except BaseException:
        results.put((spec.host_id, "error", traceback.format_exc()))
        return
    try:
        while True:
            command, args = commands.get()
            if command == "stop":
                break
            try:
                if command == "setup":
                    for unit in units:
                        unit.close()
                    workloads.setup_database(db, args["prepopulate"],
                                             structures=tuple(args["structures"]),
                                             params=spec.params)
                    for unit in units:
                        unit.connect(db)
                    reply: Any = None
                elif command == "catch-up":
                    for unit in units:
                        unit.catch_up()
                    reply = None
                elif command == "verify":
                    reply = _verify(units, **args)
                else:
                    db, reply = _run_test(spec, db, units, barriers, **args)
                results.put((spec.host_id, "done", reply))
            except BaseException:
                for barrier in barriers.values():
                    barrier.abort()
                results.put((spec.host_id, "error", traceback.format_exc()))
    finally:
        for unit in units:
            unit.close()
        db.close()


def _reopen(spec: HostSpec, db: Any, units: list[Unit]) -> Any:
    """All caches cleared: a new DB over a new storage instance (MappingStorage lives in
    memory only, so it gets a new DB over the same storage)."""
    for unit in units:
        unit.close()
    if spec.contender.storage_class in ("MappingStorage", "DemoStorage"):
        import ZODB
        storage = db.storage
        db.cacheMinimize()
        # The configured pickle cache bounds, not ZODB.DB's defaults (400 objects: a
        # steamin' read of more than that would load from the storage again).
        new = ZODB.DB(storage, cache_size=db.getCacheSize(),
                      cache_size_bytes=db.getCacheSizeBytes(), pool_size=db.getPoolSize())
    else:
        db.close()
        new = spec.contender.open_db()
    for unit in units:
        unit.connect(new)
    return new


def _run_test(spec: HostSpec, db: Any, units: list[Unit], barriers: dict[str, Any],
              test: str, rep: int, tag: str) -> tuple[Any, list[dict[str, Any]]]:
    kind = TESTS[test]
    mine = [u for u in units if u.role == kind.role]
    if kind.workers == "one":
        mine = [u for u in mine if u.index == 0]
    if not mine:
        return db, []
    if kind.reopen:
        db = _reopen(spec, db, units)
    if kind.restart:
        for unit in mine:
            kind.prepare(unit, {"key": f"{tag}-{unit.index}", "tag": tag})
        db = _reopen(spec, db, units)
    barrier = barriers[kind.role] if kind.workers == "all" else None
    replies: list[dict[str, Any] | None] = [None] * len(mine)
    errors: list[str] = []

    def work(slot: int, unit: Unit) -> None:
        try:
            state = {"key": f"{tag}-{unit.index}", "tag": tag}
            if not kind.restart:
                kind.prepare(unit, state)
            # A full collection that earlier work (a large commit's poll, a reopened
            # DB's garbage) made due would land in the timed part: 14-20 ms of a
            # 13 ms warm read on SQLite, the first after `large`, every run.
            gc.collect()
            if barrier is not None:
                barrier.wait(BARRIER_TIMEOUT + soak.fill_allowance(unit.params.soak_documents))
            profile = cProfile.Profile() if spec.profile_dir else None
            statements = _statements(unit.db)
            measured = _metrics(unit.db)
            start = time.perf_counter()
            if profile is not None:
                profile.enable()
            outcome: Outcome = kind.run(unit, state)
            if profile is not None:
                profile.disable()
            end = time.perf_counter()
            after = _statements(unit.db)
            measured = _delta(measured, _metrics(unit.db))
            if profile is not None:
                name = f"{spec.contender.name}-{test}-{tag}-{unit.role}{unit.index}.prof"
                profile.dump_stats(os.path.join(spec.profile_dir or ".", name))
            replies[slot] = {
                "start": start, "end": end, "objects": outcome.objects,
                "transactions": outcome.transactions, "loads": outcome.loads,
                "statements": None if statements is None or after is None
                else after - statements,
                "extra": outcome.extra, "unit": f"{unit.role}{unit.index}",
                "series": outcome.series, "metrics": measured, "pid": os.getpid(),
                **memory(unit.db)}
        except BaseException:
            if barrier is not None:
                barrier.abort()
            errors.append(traceback.format_exc())

    if len(mine) == 1:
        work(0, mine[0])
    else:
        threads = [threading.Thread(target=work, args=(i, u)) for i, u in enumerate(mine)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if errors:
        raise BenchFailure(errors[0])
    if barrier is not None:
        barrier.reset()   # a barrier that all passed is already reset; harmless
    if kind.counts_deadlocks and not spec.contender.single_process:
        db = _reopen(spec, db, units)   # server sessions end: their statistics are sent
    return db, [r for r in replies if r is not None]


def _verify(units: list[Unit], test: str, tag: str) -> list[str]:
    """The test's check of the data, by this host's first writer."""
    check = TESTS[test].verify
    writer = next(u for u in units if u.role == "writer")
    return check(writer, {"key": f"{tag}-{writer.index}", "tag": tag}) if check else []


class Round:
    """The worker processes of one contender at one concurrency and object count."""

    def __init__(self, contender: Contender, params: Params, profile_dir: str | None,
                 needs_readers: bool) -> None:
        self.contender = contender
        self.params = params
        ctx = multiprocessing.get_context("spawn")
        c = params.concurrency
        roles = [("writer", i) for i in range(c)]
        if needs_readers:
            roles += [("reader", i) for i in range(c)]
        if contender.single_process:
            layouts = [roles]
        else:
            layouts = [[role] for role in roles]
        self.barriers = {"writer": ctx.Barrier(c), "reader": ctx.Barrier(c)}
        self.results = ctx.Queue()
        self.hosts: list[tuple[Any, Any]] = []
        label = f"c{c}-n{params.objects}"
        for host_id, units in enumerate(layouts):
            commands = ctx.Queue()
            spec = HostSpec(host_id, contender, units, params, profile_dir, label)
            process = ctx.Process(target=host_main, daemon=True,
                                  args=(spec, commands, self.results, self.barriers),
                                  name=f"zodbsql-bench-{contender.name}-{host_id}")
            self.hosts.append((process, commands))
        self.writer_hosts = [i for i, units in enumerate(layouts)
                             if any(role == "writer" for role, _ in units)]

    def __enter__(self) -> "Round":
        for process, _ in self.hosts:
            process.start()
        self._collect(range(len(self.hosts)), "ready")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for process, commands in self.hosts:
            if process.is_alive():
                try:
                    commands.put(("stop", None))
                except Exception:
                    pass
        deadline = time.monotonic() + 10
        for process, _ in self.hosts:
            process.join(max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                process.terminate()
                process.join(5)
        self.hosts = []

    def _collect(self, host_ids: Any, expected: str) -> list[Any]:
        waiting = set(host_ids)
        replies: list[Any] = []
        errors: list[str] = []
        while waiting:
            try:
                host_id, status, payload = self.results.get(timeout=1.0)
            except queue.Empty:
                dead = [i for i in waiting if not self.hosts[i][0].is_alive()]
                if dead:
                    raise BenchFailure(f"worker process {dead[0]} of {self.contender.name}"
                                       " died")
                continue
            waiting.discard(host_id)
            if status == "error":
                errors.append(payload)
            else:
                replies.append(payload)
        if errors:
            raise BenchFailure(f"a worker of {self.contender.name} failed:\n{errors[0]}")
        return replies

    def setup(self, prepopulate: int, structures: tuple[str, ...] = ()) -> None:
        """The first writer prepares the database (``structures``: the tests whose
        shared structure it builds); then every other host sees it."""
        first = self.writer_hosts[0]
        self.hosts[first][1].put(("setup", {"prepopulate": prepopulate,
                                            "structures": structures}))
        self._collect([first], "done")
        others = [i for i in range(len(self.hosts)) if i != first]
        for i in others:
            self.hosts[i][1].put(("setup", {"prepopulate": 0, "structures": ()}))
        self._collect(others, "done")

    def recover(self) -> None:
        """After a failed test: the barriers its workers broke are usable again; a
        worker process that died fails the round."""
        dead = [i for i, (process, _) in enumerate(self.hosts) if not process.is_alive()]
        if dead:
            raise BenchFailure(f"worker process {dead[0]} of {self.contender.name} died")
        for barrier in self.barriers.values():
            barrier.reset()

    def catch_up(self) -> None:
        """Every worker sees the database as it is now, outside any measurement."""
        for _, commands in self.hosts:
            commands.put(("catch-up", {}))
        self._collect(range(len(self.hosts)), "done")

    def run(self, test: str, rep: int, tag: str) -> list[dict[str, Any]]:
        for _, commands in self.hosts:
            commands.put(("test", {"test": test, "rep": rep, "tag": tag}))
        units: list[dict[str, Any]] = []
        for reply in self._collect(range(len(self.hosts)), "done"):
            units.extend(reply)
        return units

    def verify(self, test: str, tag: str) -> list[str]:
        first = self.writer_hosts[0]
        self.hosts[first][1].put(("verify", {"test": test, "tag": tag}))
        (problems,) = self._collect([first], "done")
        return list(problems)

    def measure(self, test: str, rep: int, tag: str) -> dict[str, Any]:
        """One run of a test: its figure, the server's deadlocks during it (None: no
        counter) and its check of the data, which fails the bench if anything is wrong."""
        kind = TESTS[test]
        counter = self.contender.deadlocks if kind.counts_deadlocks else None
        before = counter.read() if counter is not None else 0
        units = self.run(test, rep, tag)
        result = figure(test, units)
        relay = self.contender.relay
        if relay is not None:
            # What the server was sent while the workers ran (the monotonic clock is the
            # machine's: the workers' start and end compare with the relay's times).
            start, end = min(u["start"] for u in units), max(u["end"] for u in units)
            sent = relay.statements_between(start, end)
            relay.forget_before(end)
            result["server_statements"] = sent
            result["server_sql_per_txn"] = (sent / result["transactions"]
                                            if result["transactions"] else None)
        problems = self.verify(test, tag) if kind.verify else []
        if problems:
            raise BenchFailure(f"{test} on {self.contender.name} left wrong data: "
                               + "; ".join(problems))
        if kind.counts_deadlocks:
            result["deadlocks"] = counter.settled() - before if counter is not None else None
        return result


def figure(test: str, units: list[dict[str, Any]]) -> dict[str, Any]:
    """One measurement from the units' replies: rates over the wall time of all."""
    kind = TESTS[test]
    wall = max(u["end"] for u in units) - min(u["start"] for u in units)
    wall = max(wall, 1e-9)
    objects = sum(u["objects"] for u in units)
    transactions = sum(u["transactions"] for u in units)
    statements = [u["statements"] for u in units]
    loads = [u["loads"] for u in units if u["loads"] is not None]
    result: dict[str, Any] = {
        "seconds": wall, "objects": objects, "transactions": transactions,
        "workers": len(units),
        "value": wall * 100_000 / max(objects, 1) if kind.lower_is_better else objects / wall,
        "loads": sum(loads) if loads else None,
        "statements": sum(statements) if None not in statements else None,
    }
    for key in ("rss_mb", "peak_rss_mb", "cache_mb"):   # the largest worker process
        values = [u[key] for u in units if u.get(key) is not None]
        result[key] = max(values) if values else None
    result["sql_per_txn"] = (result["statements"] / transactions
                             if result["statements"] is not None and transactions else None)
    # A process's metrics are those of its one storage, which all its units share: add
    # up one unit per process.
    by_process: dict[int, dict[str, float]] = {}
    for u in units:
        if u.get("metrics") is not None:
            by_process.setdefault(u.get("pid", 0), u["metrics"])
    if by_process:
        totals: dict[str, float] = {}
        for measured in by_process.values():
            for key, count in measured.items():
                totals[key] = totals.get(key, 0.0) + count
        result["metrics"] = totals
    for key in ("conflicts_raised", "conflicts_resolved"):
        if any(key in u["extra"] for u in units):
            total = sum(u["extra"].get(key, 0) for u in units)
            result[key] = total
            result[key + "_per_s"] = total / wall
    if any("retries" in u["extra"] for u in units):
        result["retries"] = sum(u["extra"].get("retries", 0) for u in units)
        result["retries_per_commit"] = result["retries"] / max(transactions, 1)
        retried: dict[str, float] = {}
        for u in units:
            for key, count in u["extra"].items():
                if key.startswith("retried:"):
                    name = key.split(":", 1)[1]
                    retried[name] = retried.get(name, 0) + count
        result["retried"] = retried
    for key, combine in (("first_ms", max), ("warmup_wait_ms", max), ("db_loads", sum),
                         ("adopted", sum),            # the restart test
                         ("redis_hits", sum)):        # reads with cache-redis-url
        values = [u["extra"][key] for u in units if key in u["extra"]]
        if values:
            result[key] = combine(values)
    series = [u["series"] for u in units if u.get("series")]
    if series:
        result["soak"] = soak.summarise(series, series[0]["slot_seconds"])
        result["last_first"] = result["soak"]["last_first"]
        result["rss_last_second"] = result["soak"]["rss_last_second"]
        result["queries_per_s"] = (sum(sum(s["done"]) for s in series if s["role"] == "query")
                                   / wall)
    if test == "steamin" and result["loads"]:
        raise BenchFailure(
            f"steamin' loaded {result['loads']} objects from the storage: everything should"
            " have come from the pickle cache")
    return result
