"""What a commit writes to SQLite's WAL as the same objects gain revisions.

Commits ``--commits`` transactions that each change the same ``--objects`` bench items
(zodbshootout's ``update`` pattern) in a new SQLite database in a temporary directory,
with checkpoints held off so that the WAL's growth is each commit's own, and prints the
median commit time and WAL bytes a commit for each tenth of the run.  ``--pack-at N``
packs to now before the Nth commit.

    python scripts/history_depth.py
    python scripts/history_depth.py --keep-history false
    python scripts/history_depth.py --commits 200 --pack-at 100

History-preserving, every commit adds a revision to each object's run of entries in
``object_state``'s ``(zoid, tid)`` index: one leaf page per changed object once those
runs fill a page, and SQLite's WAL takes every page a transaction changed whole.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import transaction
from persistent.mapping import PersistentMapping

from zodbsql.api import open_db
from zodbsql.bench.workloads import Item


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--keep-history", choices=("true", "false"), default="true")
    parser.add_argument("--pack-at", type=int, default=0,
                        help="pack to now before this commit (0: never)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "Data.sqlite")
        db = open_db(f"sqlite://{path}?keep_history={args.keep_history}"
                     "&wal_autocheckpoint=100000000")
        try:
            conn = db.open()
            items = conn.root()["items"] = PersistentMapping()
            for number in range(args.objects):
                items[number] = Item(b"x" * 128)
            transaction.commit()
            wal = path + "-wal"
            seconds: list[float] = []
            written: list[int] = []
            for number in range(args.commits):
                if args.pack_at and number == args.pack_at:
                    db.pack(time.time() + 1)
                for item in items.values():
                    item.count += 1
                before = os.path.getsize(wal)
                started = time.perf_counter()
                transaction.commit()
                seconds.append(time.perf_counter() - started)
                written.append(os.path.getsize(wal) - before)
            step = max(1, args.commits // 10)
            for start in range(0, args.commits, step):
                print(f"commits {start + 1:>4}-{min(start + step, args.commits):<4}"
                      f" {statistics.median(seconds[start:start + step]) * 1000:6.1f} ms"
                      f" {statistics.median(written[start:start + step]) / 1024:7.0f} KB of WAL")
            conn.close()
        finally:
            db.close()


if __name__ == "__main__":
    main()
