"""Where a warm read's time goes: zodbsql against FileStorage, as the bench's ``warm``.

    .venv/bin/python scripts/warm_budget.py [--objects 1000] [--trials 20]
        [--url postgresql://postgres@127.0.0.1/scratch] [--changed-container]

Each trial, a writer adds a ``PersistentMapping`` of --objects bench items and changes
every one (the bench's ``add`` and ``update``), then a reader that has been open all
along (its caches hold the earlier trials' reads) begins a transaction and reads them
all (with --changed-container, one mapping the reader holds gains an item each trial,
as a folder another process added to, and its items change).  zodbsql's writer is
another process, as in the bench, so the reader must poll;
FileStorage's is a thread of the reader's process sharing its storage, as in the bench
(FileStorage locks its file), so the reader learns of the commit from it.

Printed, milliseconds a trial (median, lowest): the transaction's start (the poll),
the storage's ``load`` calls, the whole read (ZODB's unpickling and pickle cache
besides), and for zodbsql the parts inside ``load``: the statements, the states' entry
into the shared cache, the lookahead's choice of what to bring, the walk onward.  Give
--url for a server database (it is written to: a scratch one); SQLite is always run.
"""
from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from typing import Any, Callable

import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.FileStorage import FileStorage

import zodbsql
import zodbsql.cache.lookahead as lookahead
from zodbsql.bench.workloads import Item


#: The one mapping of --changed-container.
CHANGED_KEY = "changed"
ORDER = ["start (poll)", "load calls", "  statements", "  entry into the shared cache",
         "  lookahead: what to bring", "  lookahead: the walk onward", "whole read"]


def write(db: Any, key: str, count: int, changed: bool = False) -> None:
    """A new mapping at ``key`` (with ``changed``: one mapping at CHANGED_KEY, made
    once, that gains an item named ``key``), then every item of it changed."""
    tm = transaction.TransactionManager()
    conn = db.open(transaction_manager=tm)
    tm.begin()
    root = conn.root()
    name = CHANGED_KEY if changed else key
    if changed and name in root:
        root[name][key] = Item(b"x" * 128)
    else:
        root[name] = items = PersistentMapping()
        for number in range(count):
            items[number] = Item(b"x" * 128)
    tm.commit()
    for item in root[name].values():
        item._p_changed = True
    tm.commit()
    conn.close()


def writer_process(url: str, count: int, changed: bool, keys: Any, done: Any) -> None:
    db = zodbsql.open_db(url)
    while (key := keys.get()) is not None:
        write(db, key, count, changed)
        done.put(key)
    db.close()


class Timings:
    """Seconds spent in wrapped callables, by name, since the last ``take``."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        function: Callable[..., Any] = getattr(owner, attribute)

        def timed(*args: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kw)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - start
        setattr(owner, attribute, timed)

    def take(self) -> dict[str, float]:
        spent, self.spent = self.spent, {}
        return spent


def zodbsql_parts(timings: Timings, instance: Any) -> None:
    """Time the parts of a zodbsql load (``instance`` is the connection's storage)."""
    shared = instance.shared
    mover = shared.backend.mover
    for attribute in ("load_many_at", "load_with_references", "load_many_with_references",
                      "load_and_references"):
        if hasattr(mover, attribute):
            timings.wrap(mover, attribute, "  statements")
    timings.wrap(shared.cache, "put_loaded_many", "  entry into the shared cache")
    timings.wrap(lookahead, "uncached_after", "  lookahead: what to bring")
    timings.wrap(instance, "_walked_on", "  lookahead: the walk onward")


def measure(name: str, db: Any, write_one: Callable[[str], None], trials: int,
            changed: bool = False) -> dict[str, list[float]]:
    tm = transaction.TransactionManager()
    conn = db.open(transaction_manager=tm)
    timings = Timings()
    storage = conn._storage
    timings.wrap(storage, "load", "load calls")
    if hasattr(storage, "shared"):
        zodbsql_parts(timings, storage)
    found: dict[str, list[float]] = {}
    for trial in range(trials + 3):           # three to warm up
        key = f"{name}-{trial}"
        tm.begin()
        tm.abort()
        write_one(key)
        conn.cacheMinimize()
        timings.take()
        start = time.perf_counter()
        tm.begin()
        begun = time.perf_counter()
        for item in conn.root()[CHANGED_KEY if changed else key].values():
            item.count
        tm.abort()
        end = time.perf_counter()
        if trial < 3:
            continue
        parts = {"start (poll)": begun - start, **timings.take(), "whole read": end - start}
        for part, seconds in parts.items():
            found.setdefault(part, []).append(seconds * 1e3)
    conn.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--url", action="append", default=[],
                        help="a server database to measure too (a scratch one)")
    parser.add_argument("--changed-container", action="store_true",
                        help="one mapping the reader holds, changed by each trial (it gains"
                             " an item), instead of a new one a trial")
    args = parser.parse_args()
    changed = args.changed_container
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as directory:
        db = ZODB.DB(FileStorage(f"{directory}/Data.fs"))
        results["FileStorage"] = measure(
            "fs", db, lambda key: write(db, key, args.objects, changed), args.trials, changed)
        db.close()
        context = multiprocessing.get_context("spawn")
        for url in [f"sqlite://{directory}/Data.sqlite", *args.url]:
            db = zodbsql.open_db(url)       # the schema, before the writer opens it
            keys, done = context.Queue(), context.Queue()
            writer = context.Process(target=writer_process,
                                     args=(url, args.objects, changed, keys, done))
            writer.start()

            def write_there(key: str) -> None:
                keys.put(key)
                done.get()
            results[url.split(":")[0]] = measure("sql", db, write_there, args.trials,
                                                 changed)
            keys.put(None)
            writer.join()
            db.close()
    for name, found in results.items():
        print(f"{name}, ms a read of {args.objects} objects   median  lowest")
        for part, values in sorted(found.items(), key=lambda item: ORDER.index(item[0])):
            print(f"  {part:36} {statistics.median(values):7.2f} {min(values):7.2f}")


if __name__ == "__main__":
    main()
