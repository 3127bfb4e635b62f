"""Report what a zodbsql database holds: objects, revisions and bytes per class, the
largest objects, transactions and bytes written per day, blobs, and history kept.

Read-only, and SQL on the server: a state's class is read from the first bytes of its
pickle, so no object is loaded.  ``--chart FILE.png`` draws the bytes per class and the
database's growth over time.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

from rich.console import Console
from rich.table import Table

from zodbsql.cli import common
from zodbsql.storage.report import Report, build

HELP = "objects, revisions and bytes per class, largest objects, growth per day (read-only)"
EXAMPLE = ("example:\n  zodbsql report zodbsql+sqlite:///var/Data.sqlite\n"
           "  zodbsql report zope.conf#main --top 30 --chart report.png\n"
           "  zodbsql report postgresql://zodb@db/zodb --json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("storage", metavar="STORAGE", help=common.STORAGE_HELP)
    parser.add_argument("--top", type=int, default=20, metavar="N",
                        help="classes shown, largest first (default 20; --json has all)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--chart", metavar="FILE.png",
                        help="also draw bytes per class and growth over time to this PNG")


def run(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise SystemExit("zodbsql report: --top must be at least 1")
    storage = common.require_zodbsql(
        common.open_storage(args.storage, read_only=True, zodbsql_for="report"), "report")
    try:
        report = build(storage)
    finally:
        storage.close()
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        # A pipe or a file gets whole class names, not a terminal's 80 columns.
        show(report, args.top, Console() if sys.stdout.isatty() else Console(width=160))
    if args.chart:
        draw(report, pathlib.Path(args.chart), args.top)
    return 0


def megabytes(size: int) -> str:
    return f"{size / 1e6:,.3f}"


def show(report: Report, top: int, console: Console) -> None:
    mode = "history-preserving" if report.keep_history else "history-free"
    console.print(f"{report.objects:,} objects, {megabytes(report.bytes)} MB current;"
                  f" {report.revisions:,} revisions, {megabytes(report.revision_bytes)} MB"
                  f" in all ({mode}; history kept:"
                  f" {megabytes(report.revision_bytes - report.bytes)} MB);"
                  f" {report.blobs:,} blobs, {megabytes(report.blob_bytes)} MB"
                  f" ({report.blob_references:,} references)")
    table = Table(title=f"by class (largest {min(top, len(report.classes))}"
                        f" of {len(report.classes)})")
    for column in ("class", "objects", "MB", "revisions", "MB, all revisions"):
        table.add_column(column, justify="left" if column == "class" else "right",
                         no_wrap=column == "class")
    for figures in report.classes[:top]:
        table.add_row(figures.name, f"{figures.objects:,}", megabytes(figures.bytes),
                      f"{figures.revisions:,}", megabytes(figures.revision_bytes))
    console.print(table)
    largest = Table(title="largest objects")
    for column in ("oid", "tid", "bytes", "class"):
        largest.add_column(column, justify="right" if column == "bytes" else "left")
    for oid, tid, size, name in report.largest:
        largest.add_row(f"0x{oid:016x}", f"0x{tid:016x}", f"{size:,}", name)
    console.print(largest)
    days = Table(title="per day (the last 14)")
    for column in ("day", "transactions", "revisions", "MB written"):
        days.add_column(column, justify="left" if column == "day" else "right")
    for day in report.days[-14:]:
        days.add_row(day.day.isoformat(), f"{day.transactions:,}", f"{day.revisions:,}",
                     megabytes(day.bytes))
    console.print(days)


def draw(report: Report, path: pathlib.Path, top: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, (by_class, growth) = plt.subplots(1, 2, figsize=(13, 5))
    shown = report.classes[:top][::-1]
    by_class.barh([c.name for c in shown], [c.bytes / 1e6 for c in shown], label="current")
    by_class.barh([c.name for c in shown],
                  [(c.revision_bytes - c.bytes) / 1e6 for c in shown],
                  left=[c.bytes / 1e6 for c in shown], label="older revisions")
    by_class.set_xlabel("MB")
    by_class.set_title("bytes by class")
    by_class.legend()
    by_class.tick_params(axis="y", labelsize=7)
    total = 0.0
    days, sizes = [], []
    for day in report.days:
        total += day.bytes / 1e6
        days.append(day.day)
        sizes.append(total)
    growth.plot(days, sizes, marker="o" if len(days) < 30 else None)
    growth.set_ylabel("MB written, cumulative")
    growth.set_title("growth over time")
    figure.autofmt_xdate()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
