"""Pack a zodbsql database: remove old revisions, and garbage unless --no-gc.

Works in batches; each batch holds the commit lock only while it deletes, so writers
keep committing.  ``--duty-cycle 0.5`` sleeps as long as it works between batches.
Killed at any point, it can simply be run again: every batch is its own transaction and
nothing still reachable is ever removed.
"""
from __future__ import annotations

import argparse

from zodbsql.cli import common
from zodbsql.storage import pack as packing

HELP = "remove old revisions and unreachable objects, in batches"
EXAMPLE = ("example:\n  zodbsql pack zope.conf#main --days 7 --duty-cycle 0.5\n"
           "  zodbsql pack zodbsql+sqlite:///var/Data.sqlite --dry-run")
PHASES = {"walk": "following references", "gc": "removing garbage",
          "deleted": "removing deleted objects", "history": "removing old revisions"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("storage", metavar="STORAGE", help=common.STORAGE_HELP)
    common.add_pack_time_arguments(parser)
    parser.add_argument("--no-gc", action="store_true",
                        help="keep unreachable objects; only remove old revisions")
    parser.add_argument("--dry-run", action="store_true",
                        help="walk the references and print what would go; delete nothing")
    parser.add_argument("--duty-cycle", type=float, default=None,
                        help="fraction of time spent working, 0 < D <= 1 (default: the"
                        " storage's pack-duty-cycle)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="objects per batch (default: the storage's pack-batch-size)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    # A dry run writes pack's work tables, so neither opens read-only; neither creates
    # a database.
    storage = common.require_zodbsql(
        common.open_storage(args.storage, must_exist=True, zodbsql_for="pack"), "pack")
    try:
        when = common.pack_time(args)
        with common.progress_bar(args.quiet) as bar:
            tasks: dict[str, object] = {}

            def progress(phase: str, done: int) -> None:
                if phase not in tasks:
                    tasks[phase] = bar.add_task(PHASES.get(phase, phase), total=None, rate="")
                bar.update(tasks[phase], completed=done)  # type: ignore[arg-type]
            counts = packing.pack(storage, when, gc=not args.no_gc, progress=progress,
                                  dry_run=args.dry_run, batch_size=args.batch_size,
                                  duty_cycle=args.duty_cycle)
    finally:
        storage.close()
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {counts['garbage']} unreachable objects and"
          f" {counts['old_revisions']} old revisions")
    return 0
