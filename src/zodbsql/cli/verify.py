"""Check a zodbsql database: every state against its checksum, every reference resolvable.

Read-only.  Prints each problem with its oid and tid, then a summary; the exit status is
0 when the database is clean and 1 when it is not.
"""
from __future__ import annotations

import argparse
import json

from zodbsql.cli import common
from zodbsql.storage.verify import verify

HELP = "check checksums and references of every stored state, and blobs (read-only)"
EXAMPLE = "example:\n  zodbsql verify zodbsql+sqlite:///var/Data.sqlite\n  zodbsql verify zope.conf#main --json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("storage", metavar="STORAGE", help=common.STORAGE_HELP)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    storage = common.require_zodbsql(
        common.open_storage(args.storage, read_only=True, zodbsql_for="verify"), "verify")
    try:
        with common.progress_bar(args.quiet or args.json) as bar:
            task = bar.add_task("verifying", total=None, rate="")

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)
            report = verify(storage, progress)
    finally:
        storage.close()
    if args.json:
        print(json.dumps({"clean": report.clean, "states": report.states,
                          "bytes": report.bytes, "blobs": report.blobs,
                          "blob_bytes": report.blob_bytes,
                          "problems": [{"kind": p.kind, "oid": f"0x{p.oid:016x}",
                                        "tid": f"0x{p.tid:016x}", "detail": p.detail}
                                       for p in report.problems]}, indent=2))
    else:
        for problem in report.problems:
            print(problem)
        verdict = "clean" if report.clean else f"{len(report.problems)} problem(s)"
        blobs = (f" and {report.blobs} blobs ({report.blob_bytes / 1e6:.1f} MB)"
                 if report.blobs else "")
        print(f"{report.states} states ({report.bytes / 1e6:.1f} MB){blobs} checked: {verdict}")
    return 0 if report.clean else 1
