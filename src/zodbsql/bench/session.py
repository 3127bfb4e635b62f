"""One bench run: every contender x concurrency x objects per transaction x repetition."""
from __future__ import annotations

import contextlib
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

    The contenders take turns: at each concurrency and size the worker processes of all
    of them are started, and each repetition runs every contender's tests, the first
    contender first in the first repetition, the second first in the next, and so on.
    A machine whose speed drifts (a figure in seconds moved up to 3x between runs here)
    then moves the figures of one repetition together, instead of one contender's whole
    column; ``paired_ratios`` compares the contenders repetition by repetition.

    A test that fails (a worker's error, wrong data, steamin' loading) is recorded with
    its reason and not run again at that concurrency and size; the run goes on.  When
    a contender's worker processes themselves fail, every one of its tests not measured
    yet at that concurrency and size is recorded as failed with the same reason, and
    the other contenders go on.
    """
    runs: list[dict[str, Any]] = []

    def record(result: dict[str, Any]) -> None:
        runs.append(result)
        on_result(result)

    needs_objects = any(t in NEEDS_OBJECTS for t in plan.tests)
    needs_readers = any(t in READS for t in plan.tests)
    structures = tuple(t for t in plan.tests if t in STRUCTURES)
    prepopulated: set[str] = set()
    for c in plan.concurrency:
        for n in plan.objects:
            params = replace(plan.params, objects=n, concurrency=c)
            with contextlib.ExitStack() as stack:
                turns: dict[str, _Turn] = {}
                for contender in contenders:
                    turn = _Turn(contender, {"contender": contender.name, "concurrency": c,
                                             "objects_per_txn": n})
                    on_status(f"{contender.name}: starting"
                              f" {c if not contender.single_process else 1}"
                              f" worker process(es), {n} objects per transaction")
                    try:
                        turn.round = stack.enter_context(runner.Round(
                            contender, params, plan.profile_dir, needs_readers))
                        turn.round.setup(0 if contender.name in prepopulated
                                         else plan.prepopulate, structures)
                        prepopulated.add(contender.name)
                    except runner.BenchFailure as exc:
                        turn.fail_the_rest(plan, str(exc), record)
                        continue
                    turns[contender.name] = turn
                for rep in range(plan.warmup + plan.repetitions):
                    first = rep % len(contenders)
                    for contender in contenders[first:] + contenders[:first]:
                        turn_now = turns.get(contender.name)
                        if turn_now is None:
                            continue
                        try:
                            turn_now.repetition(plan, rep, needs_objects, record, on_status)
                        except runner.BenchFailure as exc:
                            turn_now.fail_the_rest(plan, str(exc), record)
                            del turns[contender.name]
    return runs


class _Turn:
    """One contender's worker processes at one concurrency and size, and what its
    tests did there."""

    def __init__(self, contender: Contender, cell: dict[str, Any]) -> None:
        self.contender = contender
        self.cell = cell
        self.round: Any = None
        self.failed: set[str] = set()
        self.measured: set[str] = set()

    def repetition(self, plan: Plan, rep: int, needs_objects: bool,
                   record: Callable[[dict[str, Any]], None],
                   on_status: Callable[[str], None]) -> None:
        """Every test of the plan once (those that failed before are left out)."""
        c, n = self.cell["concurrency"], self.cell["objects_per_txn"]
        tag = f"c{c}-n{n}-r{rep}"
        warmup = rep < plan.warmup
        # Every worker sees what the last repetition wrote (large, pack's 100 x n
        # objects) now, so that "warm" pays for reading add's and update's objects,
        # not for that.
        self.round.catch_up()
        if needs_objects and "add" not in plan.tests:
            self.round.run("add", rep, tag)      # the objects, not measured
        for test in plan.tests:
            if test in self.failed or (TESTS[test].on_request and rep != plan.warmup):
                continue      # soak: once, as the first measured run
            on_status(f"{self.contender.name}: {TESTS[test].title}, c={c}, n={n},"
                      f" {'warm-up' if warmup else 'run'} {rep + 1}")
            try:
                result = self.round.measure(test, rep, tag)
            except runner.BenchFailure as exc:
                self.failed.add(test)
                result = failure(str(exc))
                self.round.recover()
            self.measured.add(test)
            result.update(self.cell, test=test, repetition=rep, warmup=warmup)
            record(result)

    def fail_the_rest(self, plan: Plan, reason: str,
                      record: Callable[[dict[str, Any]], None]) -> None:
        for test in plan.tests:
            if test not in self.measured:
                record(failure(reason, self.cell, test=test, repetition=0, warmup=False))


def paired_ratios(runs: list[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """How many times faster ``baseline`` was than each other contender, repetition by
    repetition (its figure over the other's, or the other's over its own where lower is
    better), for every test, concurrency and size both measured: the median, the
    lowest and the highest of those ratios, and how many repetitions paired up.
    Warm-ups and failed runs are left out."""
    pairs = _paired(runs, baseline, lambda test, mine, value: (
        value / mine if TESTS[test].lower_is_better else mine / value))
    return [{"baseline": baseline, "contender": contender, "test": test, "concurrency": c,
             "objects_per_txn": n, "median": statistics.median(ratios),
             "lowest": min(ratios), "highest": max(ratios), "pairs": len(ratios)}
            for (contender, test, c, n), ratios in pairs.items()]


def beyond_floor(runs: list[dict[str, Any]], floor: str) -> list[dict[str, Any]]:
    """The microseconds of wall time each contender spent per object (per transaction
    where the test counts those) more than ``floor``, repetition by repetition: one over
    its figure less one over the floor's.  With MappingStorage as the floor (a dict in
    memory, without I/O) that is what the storage itself costs, ZODB's own work
    (pickling, the pickle cache), the same for every storage, taken out: a ratio of two
    storages says how far apart they are, this says how much time each one's own part
    has.  MappingStorage's own calls (a load is about 1.5 us) stay in the floor, so
    each storage's own time is that much more than shown, the same for all.  The
    median, lowest and highest, and how many repetitions paired up; tests whose figure
    is seconds (pack) are left out."""
    pairs = _paired(runs, floor, lambda test, mine, value: 1e6 / value - 1e6 / mine)
    return [{"floor": floor, "contender": contender, "test": test, "concurrency": c,
             "objects_per_txn": n, "per": TESTS[test].unit.split("/")[0].rstrip("s"),
             "median_us": statistics.median(spent), "lowest_us": min(spent),
             "highest_us": max(spent), "pairs": len(spent)}
            for (contender, test, c, n), spent in pairs.items()
            if not TESTS[test].lower_is_better]


def _paired(runs: list[dict[str, Any]], reference: str,
            compare: Callable[[str, float, float], float]
            ) -> dict[tuple[Any, ...], list[float]]:
    """``compare(test, reference's figure, other's figure)`` for every other contender's
    measured figure whose repetition ``reference`` measured too, by contender, test,
    concurrency and size (warm-ups and failed runs left out)."""
    figures: dict[tuple[Any, ...], float] = {}
    for run in runs:
        if run["warmup"] or run.get("failed") or not run.get("value"):
            continue
        figures[(run["contender"], run["test"], run["concurrency"], run["objects_per_txn"],
                 run["repetition"])] = run["value"]
    paired: dict[tuple[Any, ...], list[float]] = {}
    for (contender, test, c, n, rep), value in figures.items():
        mine = figures.get((reference, test, c, n, rep))
        if contender == reference or mine is None:
            continue
        paired.setdefault((contender, test, c, n), []).append(compare(test, mine, value))
    return paired


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
