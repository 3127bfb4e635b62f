"""A cold walk of a container whose children each hold a sub-object: zodbsql against
FileStorage.

    .venv/bin/python scripts/nested_walk.py [--objects 1000] [--walks 15]
        [--url postgresql://postgres@127.0.0.1/scratch]

A ``PersistentMapping`` of --objects mappings, each holding one mapping of its own (a
content item and its annotations), is read child and sub-object, with zodbsql's state
cache and ZODB's pickle cache emptied before each walk and the prefetch at a warm
process's bound.  Printed: the median milliseconds of a walk (the poll and the root's
load included) after three to warm up, and zodbsql's statements a walk.  Give --url
for a server database (it is written to: a scratch one); SQLite is always run.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any, Callable

import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.FileStorage import FileStorage

import zodbsql

WARM_UP = 3


def build(db: Any, count: int) -> None:
    with db.transaction() as conn:
        conn.root()["items"] = PersistentMapping(
            {i: PersistentMapping(child=PersistentMapping(v=i)) for i in range(count)})


def walk(db: Any, empty_caches: Callable[[], None]) -> float:
    """Milliseconds of one walk into every child and its sub-object."""
    empty_caches()
    db.cacheMinimize()
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    start = time.perf_counter()
    tm.begin()
    for item in conn.root()["items"].values():
        item["child"]["v"]
    tm.abort()
    took = time.perf_counter() - start
    conn.close()
    return took * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--walks", type=int, default=15)
    parser.add_argument("--url", action="append", default=[],
                        help="a server database to measure too (a scratch one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        for url in [f"sqlite://{directory}/Data.sqlite", *args.url]:
            db = zodbsql.open_db(url)
            build(db, args.objects)
            storage = db.storage
            prefetcher = storage.shared.prefetcher
            times, statements = [], []
            for _ in range(args.walks):
                prefetcher.bound = prefetcher.limit
                before = storage.statement_count()
                times.append(walk(db, storage.shared.cache.clear))
                statements.append(storage.statement_count() - before)
            db.close()
            print(f"{url.split(':')[0]}: {statistics.median(times[WARM_UP:]):.2f} ms a walk,"
                  f" statements {statements[WARM_UP:]}")
        db = ZODB.DB(FileStorage(f"{directory}/Data.fs"))
        build(db, args.objects)
        times = [walk(db, lambda: None) for _ in range(args.walks)]
        db.close()
        print(f"FileStorage: {statistics.median(times[WARM_UP:]):.2f} ms a walk")


if __name__ == "__main__":
    main()
