"""The terminal view: a rich table of the best figures so far, with a progress bar."""
from __future__ import annotations

from typing import Any, Callable

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from zodbsql.bench.session import summarise
from zodbsql.bench.workloads import TESTS


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


UNITS = {"objects/s": "objects/s", "transactions/s": "txn/s",
         "s per 100k objects": "s/100k objects"}
#: Lines under a test's figure: (label, unit, summary key, format).
EXTRA_ROWS: dict[str, list[tuple[str, str, str, Callable[[float | None], str]]]] = {
    "conflicts": [("  raised", "conflicts/s", "conflicts_raised_per_s", fmt),
                  ("  resolved", "conflicts/s", "conflicts_resolved_per_s", fmt)],
    "hotspot": [("  retries", "per commit", "retries_per_commit", fmt),
                ("  deadlocks", "server count", "deadlocks", count)],
    "soak": [("  queries", "queries/s", "queries_per_s", fmt),
             ("  last/first", "tenths, rate", "last_first", fmt),
             ("  RSS last/2nd", "tenths, MB", "rss_last_second", fmt)],
}


def sql_contenders(summary: list[dict[str, Any]], contenders: list[str]) -> set[str]:
    return {r["contender"] for r in summary if r.get("sql_per_txn") is not None}


def server_sql_contenders(summary: list[dict[str, Any]]) -> set[str]:
    """Contenders whose statements were counted on the wire (--server-statements)."""
    return {r["contender"] for r in summary if r.get("server_sql_per_txn") is not None}


def per_txn(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def table_rows(summary: list[dict[str, Any]], contenders: list[str]
               ) -> list[tuple[str, str, list[str]]]:
    """(label, unit, cells) for each line of the table: a value per contender, followed
    by SQL statements per transaction for contenders that count them, and the peak
    memory (MB) of the contender's largest worker process."""
    with_sql = sql_contenders(summary, contenders)
    with_server = server_sql_contenders(summary)
    keyed = {(r["test"], r["concurrency"], r["objects_per_txn"], r["contender"]): r
             for r in summary}
    combos = list(dict.fromkeys((r["test"], r["concurrency"], r["objects_per_txn"])
                                for r in summary))
    several = len({(c, n) for _, c, n in combos}) > 1
    lines = []
    for test, c, n in combos:
        specs = EXTRA_ROWS.get(test, [])
        cells: list[str] = []
        extras: list[list[str]] = [[] for _ in specs]
        first = None
        for contender in contenders:
            row = keyed.get((test, c, n, contender))
            first = first or row
            # sql/txn, server sql/txn, MB
            blanks = [""] * (1 + (contender in with_sql) + (contender in with_server))
            if row is None:
                cells += [""] + blanks
                for extra in extras:
                    extra += [""] + blanks
                continue
            cells.append("failed" if row.get("failed") else fmt(row["value"]))
            if contender in with_sql:
                cells.append(per_txn(row.get("sql_per_txn")))
            if contender in with_server:
                cells.append(per_txn(row.get("server_sql_per_txn")))
            cells.append(count(row.get("peak_rss_mb")))
            for extra, (_, _, key, show) in zip(extras, specs):
                extra += [show(row.get(key))] + blanks
        assert first is not None
        label = test + (f" c={c} n={n}" if several else "")
        lines.append((label, UNITS.get(first["unit"], first["unit"]), cells))
        for extra, (extra_label, unit, _, _) in zip(extras, specs):
            lines.append((extra_label, unit, extra))
    return lines


def build_table(summary: list[dict[str, Any]], contenders: list[str], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("test", no_wrap=True)
    table.add_column("unit", style="dim", no_wrap=True)
    with_sql = sql_contenders(summary, contenders)
    with_server = server_sql_contenders(summary)
    for contender in contenders:
        table.add_column(contender, justify="right", no_wrap=True)
        if contender in with_sql:
            table.add_column("sql/txn", justify="right", style="dim", no_wrap=True)
        if contender in with_server:
            table.add_column("server sql/txn", justify="right", style="dim", no_wrap=True)
        table.add_column("MB", justify="right", style="dim", no_wrap=True)
    for label, unit, cells in table_rows(summary, contenders):
        table.add_row(label, unit, *cells)
    return table


def _by_test(rows: list[dict[str, Any]], contenders: list[str]
             ) -> tuple[list[str], list[tuple[str, list[dict[str, Any] | None]]]]:
    """The contenders ``rows`` (paired figures) name, in ``contenders``' order, and a
    line per test, concurrency and size: its label and each contender's row there."""
    others = [c for c in contenders if any(r["contender"] == c for r in rows)]
    combos = list(dict.fromkeys((r["test"], r["concurrency"], r["objects_per_txn"])
                                for r in rows))
    several = len({(c, n) for _, c, n in combos}) > 1
    keyed = {(r["test"], r["concurrency"], r["objects_per_txn"], r["contender"]): r
             for r in rows}
    return others, [(test + (f" c={c} n={n}" if several else ""),
                     [keyed.get((test, c, n, other)) for other in others])
                    for test, c, n in combos]


def paired_table(pairs: list[dict[str, Any]], contenders: list[str]) -> Table | None:
    """``session.paired_ratios`` as a table: a line per test, a column per contender
    compared with the baseline, each cell the median ratio and its range (None:
    nothing paired up, as with one contender)."""
    if not pairs:
        return None
    baseline = pairs[0]["baseline"]
    others, lines = _by_test(pairs, contenders)
    table = Table(title=f"{baseline} / each, figures of one repetition: median"
                  " (lowest-highest)", title_justify="left")
    table.add_column("test", no_wrap=True)
    for other in others:
        table.add_column(f"{baseline} / {other}", justify="right", no_wrap=True)
    for label, found in lines:
        table.add_row(label, *("" if pair is None else
                               f"{pair['median']:.2f} ({pair['lowest']:.2f}-{pair['highest']:.2f})"
                               for pair in found))
    return table


def floor_table(spent: list[dict[str, Any]], contenders: list[str]) -> Table | None:
    """``session.beyond_floor`` as a table: a line per test, a column per contender,
    each cell the median microseconds per object (or transaction) beyond the floor and
    their range (None: nothing paired up with the floor)."""
    if not spent:
        return None
    others, lines = _by_test(spent, contenders)
    table = Table(title=f"µs of wall time an object (txn: a transaction) beyond"
                  f" {spent[0]['floor']}'s, figures of one repetition: median (lowest to"
                  " highest)", title_justify="left")
    table.add_column("test", no_wrap=True)
    table.add_column("per", style="dim", no_wrap=True)
    for other in others:
        table.add_column(other, justify="right", no_wrap=True)
    for label, found in lines:
        per = next(row["per"] for row in found if row is not None)
        table.add_row(label, "txn" if per == "transaction" else per,
                      *("" if row is None else f"{row['median_us']:.1f}"
                        f" ({row['lowest_us']:.1f} to {row['highest_us']:.1f})"
                        for row in found))
    return table


def result_line(run: dict[str, Any]) -> str:
    """One finished measurement as one line (for logs: stdout is not a terminal)."""
    where = (f"{run['contender']} {run['test']} c={run['concurrency']}"
             f" n={run['objects_per_txn']} {'warm-up' if run.get('warmup') else 'run'}"
             f" {run['repetition'] + 1}")
    if run.get("failed"):
        return f"{where}: FAILED: {run['failed'].strip().splitlines()[-1]}"
    unit = UNITS.get(TESTS[run["test"]].unit, TESTS[run["test"]].unit)
    line = f"{where}: {fmt(run['value'])} {unit}"
    if run.get("sql_per_txn") is not None:
        line += f", {run['sql_per_txn']:.1f} sql/txn"
    if run.get("server_sql_per_txn") is not None:
        line += f", {run['server_sql_per_txn']:.1f} sql/txn on the wire"
    if "retries_per_commit" in run:
        line += f", {run['retries_per_commit']:.2f} retries/commit"
    if run.get("peak_rss_mb") is not None:
        line += f", peak {run['peak_rss_mb']:,.0f} MB"
    measured = run.get("metrics") or {}
    loads = sum(v for k, v in measured.items() if k.startswith("loads_"))
    if loads:
        served = measured.get("loads_cache", 0) + measured.get("loads_prefetch", 0)
        line += (f", {served / loads:.0%} of {loads:,.0f} loads from the cache"
                 f" ({measured.get('loads_prefetch', 0):,.0f} prefetched)")
    return line


class LiveView:
    """A live table and progress bar on a terminal; elsewhere (a CI log, a file) one
    line per finished measurement, and the table once at the end."""

    def __init__(self, contenders: list[str], steps: int, title: str,
                 console: Console | None = None) -> None:
        self.console = console or Console()
        self.live_terminal = self.console.is_terminal
        if not self.live_terminal:
            self.console = Console(width=160)   # a file or pipe: no wrapped columns
        self.contenders = contenders
        self.title = title
        self.runs: list[dict[str, Any]] = []
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=self.console)
        self.task = self.progress.add_task("starting", total=steps)
        self.live = Live(self._render(), console=self.console, refresh_per_second=4,
                         transient=False)

    def _render(self) -> Group:
        return Group(build_table(summarise(self.runs), self.contenders, self.title),
                     self.progress)

    def __enter__(self) -> "LiveView":
        if self.live_terminal:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.update(self.task, description="done" if exc[0] is None else "stopped")
        if self.live_terminal:
            self.live.update(self._render())
            self.live.__exit__(*exc)
        else:
            self.console.print(self._render())
        self.console.print()

    def result(self, run: dict[str, Any]) -> None:
        self.runs.append(run)
        self.progress.advance(self.task)
        if self.live_terminal:
            self.live.update(self._render())
        else:
            self.console.print(result_line(run), highlight=False, markup=False,
                               soft_wrap=True)

    def status(self, text: str) -> None:
        self.progress.update(self.task, description=text)
