"""One bench run: every contender x concurrency x objects per transaction x repetition."""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from zodbsql.bench import runner
from zodbsql.bench.contenders import Contender
from zodbsql.bench.workloads import NEEDS_OBJECTS, READS, STRUCTURES, TESTS, Params

ALL_TESTS = list(TESTS)
#: What runs without --tests: every test but those run only on request (soak).
DEFAULT_TESTS = [name for name, test in TESTS.items() if not test.on_request]


@dataclass
class Plan:
    tests: list[str]
    objects: list[int] = field(default_factory=lambda: [1000])
    concurrency: list[int] = field(default_factory=lambda: [2])
    repetitions: int = 3
    warmup: int = 0
    params: Params = field(default_factory=Params)
    prepopulate: int = 0
    profile_dir: str | None = None

    def steps(self, contenders: int) -> int:
        once = sum(1 for t in self.tests if TESTS[t].on_request)
        per_round = (self.repetitions + self.warmup) * (len(self.tests) - once) + once
        return contenders * len(self.objects) * len(self.concurrency) * per_round


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Best (and median) of the measured repetitions of each contender/test/c/n."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for run in runs:
        if not run["warmup"] or run.get("failed"):
            key = (run["contender"], run["test"], run["concurrency"], run["objects_per_txn"])
            groups.setdefault(key, []).append(run)
    rows = []
    for (contender, test, c, n), every in groups.items():
        kind = TESTS[test]
        group = [r for r in every if not r.get("failed")]
        if not group:
            rows.append({"contender": contender, "test": test, "title": kind.title,
                         "unit": kind.unit, "lower_is_better": kind.lower_is_better,
                         "concurrency": c, "objects_per_txn": n, "value": None,
                         "median": None, "repetitions": 0, "sql_per_txn": None,
                         "loads": None, "seconds": None, "failed": every[0]["failed"]})
            continue
        pick = min if kind.lower_is_better else max
        best = pick(group, key=lambda r: r["value"])
        row = {"contender": contender, "test": test, "title": kind.title, "unit": kind.unit,
               "lower_is_better": kind.lower_is_better, "concurrency": c,
               "objects_per_txn": n, "value": best["value"],
               "median": statistics.median(r["value"] for r in group),
               "repetitions": len(group), "sql_per_txn": best["sql_per_txn"],
               "loads": best["loads"], "seconds": best["seconds"],
               # Memory: the largest worker process at the end of any repetition.
               "peak_rss_mb": _largest(group, "peak_rss_mb"),
               "rss_mb": _largest(group, "rss_mb"), "cache_mb": _largest(group, "cache_mb")}
        for name in ("server_sql_per_txn", "last_first", "rss_last_second", "queries_per_s", "soak",
                     "first_ms", "warmup_wait_ms", "db_loads", "adopted", "metrics",
                     "redis_hits"):
            if name in best:
                row[name] = best[name]
        for name in ("conflicts_raised_per_s", "conflicts_resolved_per_s"):
            if name in best:
                row[name] = max(r[name] for r in group)
        if "retries" in best:       # over every measured repetition, not the best only
            row["retries_per_commit"] = (sum(r["retries"] for r in group)
                                         / max(sum(r["transactions"] for r in group), 1))
        if "deadlocks" in best:
            counts = [r["deadlocks"] for r in group]
            row["deadlocks"] = None if None in counts else sum(counts)
        rows.append(row)
    return rows


def _largest(group: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in group if r.get(key) is not None]
    return max(values) if values else None


def execute(plan: Plan, contenders: list[Contender],
            on_result: Callable[[dict[str, Any]], None],
            on_status: Callable[[str], None] = lambda text: None) -> list[dict[str, Any]]:
    """Run the plan; ``on_result`` gets every measurement as it comes, failures too.

    A test that fails (a worker's error, wrong data, steamin' loading) is recorded with
    its reason and not run again at that concurrency and size; the run goes on.  When
    the worker processes themselves fail, every test not measured yet at that
    concurrency and size is recorded as failed with the same reason.
    """
    runs: list[dict[str, Any]] = []

    def record(result: dict[str, Any]) -> None:
        runs.append(result)
        on_result(result)

    needs_objects = any(t in NEEDS_OBJECTS for t in plan.tests)
    needs_readers = any(t in READS for t in plan.tests)
    structures = tuple(t for t in plan.tests if t in STRUCTURES)
    for contender in contenders:
        prepopulated = False
        for c in plan.concurrency:
            for n in plan.objects:
                params = replace(plan.params, objects=n, concurrency=c)
                cell = {"contender": contender.name, "concurrency": c, "objects_per_txn": n}
                failed: set[str] = set()
                measured: set[str] = set()
                on_status(f"{contender.name}: starting {c if not contender.single_process else 1}"
                          f" worker process(es), {n} objects per transaction")
                try:
                    with runner.Round(contender, params, plan.profile_dir,
                                      needs_readers) as rnd:
                        rnd.setup(0 if prepopulated else plan.prepopulate, structures)
                        prepopulated = True
                        for rep in range(plan.warmup + plan.repetitions):
                            tag = f"c{c}-n{n}-r{rep}"
                            warmup = rep < plan.warmup
                            if needs_objects and "add" not in plan.tests:
                                rnd.run("add", rep, tag)      # the objects, not measured
                            for test in plan.tests:
                                if test in failed or (TESTS[test].on_request
                                                      and rep != plan.warmup):
                                    continue      # soak: once, as the first measured run
                                on_status(f"{contender.name}: {TESTS[test].title}, c={c},"
                                          f" n={n}, {'warm-up' if warmup else 'run'} {rep + 1}")
                                try:
                                    result = rnd.measure(test, rep, tag)
                                except runner.BenchFailure as exc:
                                    failed.add(test)
                                    result = failure(str(exc))
                                    rnd.recover()
                                measured.add(test)
                                result.update(cell, test=test, repetition=rep, warmup=warmup)
                                record(result)
                except runner.BenchFailure as exc:
                    for test in plan.tests:
                        if test not in measured:
                            record(failure(str(exc), cell, test=test, repetition=0,
                                           warmup=False))
    return runs


def failure(reason: str, *parts: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The record of a test that failed: no figure, and why."""
    result: dict[str, Any] = {"failed": reason, "value": None, "seconds": None,
                              "objects": 0, "transactions": 0, "loads": None,
                              "statements": None, "sql_per_txn": None}
    for part in parts:
        result.update(part)
    result.update(fields)
    return result


def failures(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if r.get("failed")]


def plan_as_dict(plan: Plan) -> dict[str, Any]:
    return asdict(plan)
