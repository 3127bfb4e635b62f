"""The terminal view: a rich table of the best figures so far, with a progress bar."""
from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from zodbsql.bench.session import summarise


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table_rows(summary: list[dict[str, Any]], contenders: list[str]
               ) -> list[tuple[str, str, list[str]]]:
    """(label, unit, cells) for each line of the table; the tests and CSV share these."""
    keyed = {(r["test"], r["concurrency"], r["objects_per_txn"], r["contender"]): r
             for r in summary}
    combos = list(dict.fromkeys((r["test"], r["concurrency"], r["objects_per_txn"])
                                for r in summary))
    several = len({(c, n) for _, c, n in combos}) > 1
    lines = []
    for test, c, n in combos:
        cells, raised, resolved = [], [], []
        first = None
        for contender in contenders:
            row = keyed.get((test, c, n, contender))
            first = first or row
            if row is None:
                cells.append("")
                raised.append("")
                resolved.append("")
                continue
            cell = fmt(row["value"])
            if row.get("sql_per_txn") is not None:
                cell += f"  [dim]{row['sql_per_txn']:.1f} sql/txn[/dim]"
            cells.append(cell)
            raised.append(fmt(row.get("conflicts_raised_per_s")))
            resolved.append(fmt(row.get("conflicts_resolved_per_s")))
        assert first is not None
        label = first["title"] + (f"  (c={c}, n={n})" if several else "")
        lines.append((label, first["unit"], cells))
        if test == "conflicts":
            lines.append(("  conflicts raised", "per s", raised))
            lines.append(("  conflicts resolved", "per s", resolved))
    return lines


def build_table(summary: list[dict[str, Any]], contenders: list[str], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("test")
    table.add_column("unit", style="dim")
    for contender in contenders:
        table.add_column(contender, justify="right")
    for label, unit, cells in table_rows(summary, contenders):
        table.add_row(label, unit, *cells)
    return table


class LiveView:
    def __init__(self, contenders: list[str], steps: int, title: str,
                 console: Console | None = None) -> None:
        self.console = console or Console()
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
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.update(self.task, description="done" if exc[0] is None else "stopped")
        self.live.update(self._render())
        self.live.__exit__(*exc)

    def result(self, run: dict[str, Any]) -> None:
        self.runs.append(run)
        self.progress.advance(self.task)
        self.live.update(self._render())

    def status(self, text: str) -> None:
        self.progress.update(self.task, description=text)
