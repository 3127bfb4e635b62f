"""One bench run: every contender x concurrency x objects per transaction x repetition."""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from zodbsql.bench import runner
from zodbsql.bench.contenders import Contender
from zodbsql.bench.workloads import NEEDS_OBJECTS, READS, TESTS, Params

ALL_TESTS = list(TESTS)


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
        return (contenders * len(self.objects) * len(self.concurrency)
                * (self.repetitions + self.warmup) * len(self.tests))


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Best (and median) of the measured repetitions of each contender/test/c/n."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for run in runs:
        if not run["warmup"]:
            key = (run["contender"], run["test"], run["concurrency"], run["objects_per_txn"])
            groups.setdefault(key, []).append(run)
    rows = []
    for (contender, test, c, n), group in groups.items():
        kind = TESTS[test]
        pick = min if kind.lower_is_better else max
        best = pick(group, key=lambda r: r["value"])
        row = {"contender": contender, "test": test, "title": kind.title, "unit": kind.unit,
               "lower_is_better": kind.lower_is_better, "concurrency": c,
               "objects_per_txn": n, "value": best["value"],
               "median": statistics.median(r["value"] for r in group),
               "repetitions": len(group), "sql_per_txn": best["sql_per_txn"],
               "loads": best["loads"], "seconds": best["seconds"]}
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


def execute(plan: Plan, contenders: list[Contender],
            on_result: Callable[[dict[str, Any]], None],
            on_status: Callable[[str], None] = lambda text: None) -> list[dict[str, Any]]:
    """Run the plan; ``on_result`` gets every measurement as it comes."""
    runs: list[dict[str, Any]] = []
    needs_objects = any(t in NEEDS_OBJECTS for t in plan.tests)
    needs_readers = any(t in READS for t in plan.tests)
    for contender in contenders:
        prepopulated = False
        for c in plan.concurrency:
            for n in plan.objects:
                params = replace(plan.params, objects=n, concurrency=c)
                on_status(f"{contender.name}: starting {c if not contender.single_process else 1}"
                          f" worker process(es), {n} objects per transaction")
                with runner.Round(contender, params, plan.profile_dir, needs_readers) as rnd:
                    rnd.setup(0 if prepopulated else plan.prepopulate)
                    prepopulated = True
                    for rep in range(plan.warmup + plan.repetitions):
                        tag = f"c{c}-n{n}-r{rep}"
                        warmup = rep < plan.warmup
                        if needs_objects and "add" not in plan.tests:
                            rnd.run("add", rep, tag)      # the objects, not measured
                        for test in plan.tests:
                            on_status(f"{contender.name}: {TESTS[test].title}, c={c},"
                                      f" n={n}, {'warm-up' if warmup else 'run'} {rep + 1}")
                            result = rnd.measure(test, rep, tag)
                            result.update(contender=contender.name, test=test,
                                          concurrency=c, objects_per_txn=n, repetition=rep,
                                          warmup=warmup)
                            runs.append(result)
                            on_result(result)
    return runs


def plan_as_dict(plan: Plan) -> dict[str, Any]:
    return asdict(plan)
