"""Where a cold read's time goes, per object: zodbsql (SQLite, or a server) against FileStorage.

    .venv/bin/python scripts/read_budget.py [--objects 1000] [--trials 25]
        [--url postgresql://postgres@127.0.0.1/scratch]

Builds, in a temporary directory, a SQLite database (history-preserving, as the bench's
``sqlite`` contender) holding a ``PersistentMapping`` of --objects bench items, and a
FileStorage copy of it.  Then, each trial with a new storage (an empty state cache),
it loads the mapping's state and every item's through the storage's ``load``, the call
ZODB makes for a ghost, and prints the median and lowest microseconds per object of:

- FileStorage's ``load`` (an index lookup and a read of the record);
- zodbsql's cold ``load`` of them all, and the part of it spent in the misses that go
  to the database (``_load_at``: the statements, and what the prefetch around them
  decides and caches);
- the same with the state cache off (``cache-size-mb 0``: a statement a load, nothing
  cached or prefetched);
- the pieces of a miss's batch on their own, for all the objects at once: the
  statement (``load_many_at``, on the instance's new connection, then once more on
  it), the checksums, what the instance holds (``Brought.add``), the shared cache's
  entry (``put_loaded_many``), then the loads that find them (hits), and the same loads
  once the instance holds nothing (hits in the shared cache, as a ``hot`` read's).

ZODB's own share (unpickling, the pickle cache) is the same for every storage and is
not counted here.  Give --url for an empty server database to measure instead of
SQLite (the FileStorage copy is made from it).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any, Callable

import transaction
from persistent.mapping import PersistentMapping
from ZODB.FileStorage import FileStorage
from ZODB.utils import p64

import zodbsql
from zodbsql.bench.workloads import Item


def build(directory: str, count: int, url: str | None = None) -> tuple[str, list[bytes]]:
    url = url or f"sqlite://{directory}/Data.sqlite"
    db = zodbsql.open_db(url)
    with db.transaction() as conn:
        conn.root()["items"] = items = PersistentMapping()
        for key in range(count):
            items[key] = Item(b"x" * 128)
    with db.transaction() as conn:
        items = conn.root()["items"]
        # The container first, as a walk through it loads it: its references are what
        # the prefetch reads ahead by.
        oids = [items._p_oid, *(item._p_oid for item in items.values())]
    copy = FileStorage(f"{directory}/Data.fs")
    copy.copyTransactionsFrom(db.storage)
    copy.close()
    db.close()
    return url, oids


def per_object(seconds: float, count: int) -> float:
    return seconds * 1e6 / count


def timed(function: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def measure(url: str, fs_path: str, oids: list[bytes], trials: int) -> dict[str, list[float]]:
    count = len(oids)
    found: dict[str, list[float]] = {}

    def record(name: str, seconds: float) -> None:
        found.setdefault(name, []).append(per_object(seconds, count))

    for _ in range(trials):
        fs = FileStorage(fs_path, read_only=True)
        record("FileStorage load", timed(lambda: [fs.load(oid) for oid in oids])[1])
        fs.close()

        storage = zodbsql.open_storage(url)
        instance = storage.new_instance()
        instance.poll_invalidations()
        in_misses = [0.0]
        miss = instance._load_at

        def timed_miss(*args: Any, **kw: Any) -> Any:
            row, seconds = timed(lambda: miss(*args, **kw))
            in_misses[0] += seconds
            return row
        instance._load_at = timed_miss  # type: ignore[method-assign]
        record("zodbsql cold load", timed(lambda: [instance.load(oid) for oid in oids])[1])
        record("  of which misses", in_misses[0])
        instance.release()
        storage.close()

        storage = zodbsql.open_storage(url, cache_size_mb=0)
        instance = storage.new_instance()
        instance.poll_invalidations()
        record("zodbsql load, cache off", timed(
            lambda: [instance.load(oid) for oid in oids])[1])
        instance.release()
        storage.close()

        storage = zodbsql.open_storage(url)
        instance = storage.new_instance()
        instance.poll_invalidations()
        snapshot = instance._snapshot
        assert snapshot is not None          # polled above
        mover = instance.shared.backend.mover
        numbers = sorted(int.from_bytes(oid, "big") for oid in oids)
        rows, seconds = timed(lambda: mover.load_many_at(
            instance._snapshot_conn(), numbers, snapshot))
        record("batch: statement", seconds)
        record("batch: statement again", timed(lambda: mover.load_many_at(
            instance._snapshot_conn(), numbers, snapshot))[1])
        matches = instance.shared.matches
        record("batch: checksums", timed(
            lambda: [matches(row.state, row.checksum) for row in rows])[1])
        entering = [(row.oid, row.tid, row.state) for row in rows]
        record("batch: Brought.add", timed(lambda: instance._brought.add(entering, snapshot))[1])
        record("batch: put_loaded_many", timed(
            lambda: instance.shared.cache.put_loaded_many(entering, snapshot))[1])
        record("batch: loads (hits)", timed(
            lambda: [instance.load(p64(number)) for number in numbers])[1])
        instance._brought.drop()
        record("loads: shared cache hits", timed(
            lambda: [instance.load(p64(number)) for number in numbers])[1])
        instance.release()
        storage.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=25)
    parser.add_argument("--url", help="an empty server database instead of SQLite (it is"
                                      " written to: a scratch one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        url, oids = build(directory, args.objects, args.url)
        found = measure(url, f"{directory}/Data.fs", oids, args.trials)
    transaction.abort()
    print(f"{'us per object':26} {'median':>7} {'lowest':>7}")
    for name, values in found.items():
        print(f"{name:26} {statistics.median(values):7.2f} {min(values):7.2f}")


if __name__ == "__main__":
    main()
