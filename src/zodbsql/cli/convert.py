"""Copy every transaction from one ZODB storage to another.

SOURCE and DEST are any storages (FileStorage, ZEO, zodbsql on any backend, RelStorage),
each a zodburi URI or a ZConfig file.  Run it again and it copies only what came after
the destination's last transaction: move a live site with a short final pause.  At the
end the transactions, records and blobs of both sides are counted and compared.
"""
from __future__ import annotations

import argparse
import time

from ZODB.TimeStamp import TimeStamp

from zodbsql import copying
from zodbsql.cli import common
from zodbsql.storage import SQLStorage

HELP = "copy every transaction (incrementally) from one storage to another"
EXAMPLE = ("example:\n  zodbsql convert file:///var/Data.fs zodbsql+sqlite:///var/Data.sqlite\n"
           "  zodbsql convert zope.conf#old zope.conf#new --clear")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE", help=common.STORAGE_HELP)
    parser.add_argument("dest", metavar="DEST", help="the destination, named the same way")
    parser.add_argument("--dry-run", action="store_true",
                        help="say what would be copied; write nothing")
    parser.add_argument("--clear", action="store_true",
                        help="empty the (zodbsql) destination first: removes all its data")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _seconds(tid: bytes) -> float:
    return TimeStamp(tid).timeTime()


def run(args: argparse.Namespace) -> int:
    source = common.open_storage(args.source, read_only=True)
    try:
        dest = common.open_storage(args.dest)
        try:
            return _convert(source, dest, args)
        finally:
            dest.close()
    finally:
        source.close()


def _convert(source: object, dest: object, args: argparse.Namespace) -> int:
    if args.clear:
        if not isinstance(dest, SQLStorage):
            raise common.ConfigurationError("--clear only empties zodbsql destinations")
        if not args.dry_run:
            dest.zap_all()
    start = copying.resume_point(source, dest)
    if start is None:
        print("the destination is up to date: nothing to copy")
        return 0
    last = source.lastTransaction()  # type: ignore[attr-defined]
    if args.dry_run:
        counts = copying.count_from(source, start)
        print(f"would copy {counts.transactions} transactions, {counts.records} records,"
              f" {counts.blobs} blobs ({counts.data_bytes / 1e6:.1f} MB)")
        return 0
    began = time.monotonic()
    first = _seconds(start) if start != b"\0" * 8 else None
    with common.progress_bar(args.quiet) as bar:
        task = bar.add_task("copying", total=1000, rate="")

        def progress(counts: copying.CopyCounts, tid: bytes) -> None:
            nonlocal first
            first = first or _seconds(tid)
            span = max(_seconds(last) - first, 1e-6)
            elapsed = max(time.monotonic() - began, 1e-6)
            bar.update(task, completed=int(1000 * (_seconds(tid) - first) / span),
                       rate=f"{counts.transactions / elapsed:.0f} txn/s"
                            f" {counts.data_bytes / 1e6 / elapsed:.1f} MB/s")
        copied = copying.copy_transactions(source, dest, start, progress)
        bar.update(task, completed=1000)
    print(f"copied {copied.transactions} transactions, {copied.records} records,"
          f" {copied.blobs} blobs ({copied.data_bytes / 1e6:.1f} MB)"
          f" in {time.monotonic() - began:.1f} s")
    if isinstance(dest, SQLStorage) and not dest.options.keep_history:
        print(f"the history-free destination keeps current states only: {len(dest)} objects")
        return 0
    check = copying.count_from(dest, copied.first_tid or start)
    same = (check.transactions, check.records, check.blobs) == (
        copied.transactions, copied.records, copied.blobs)
    print(f"destination now holds {check.transactions} transactions, {check.records} records,"
          f" {check.blobs} blobs from that point: {'they match' if same else 'MISMATCH'}")
    return 0 if same else 1
