"""Measure a large pack with garbage collection while another process keeps committing.

Builds a history-preserving database of N objects of which 90% become garbage, then
packs it while a writer process commits small transactions, and prints the pack time
and the writer's commit latency before and during the pack (median and 99th percentile);
with ``--packs 3`` it packs three times in a row (the third prunes the records of what
the first deleted: backends/base/poller.py).

    python scripts/pack_under_load.py --url sqlite:///tmp/pack.sqlite --objects 1000000
    python scripts/pack_under_load.py --url "postgresql://postgres@127.0.0.1/test?x=1" \\
        --schema zodbsql_packtest --objects 1000000   # (CREATE SCHEMA zodbsql_packtest first)
"""
from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

import transaction
from BTrees.OOBTree import OOBTree
from persistent.mapping import PersistentMapping

import zodbsql
from zodbsql.storage import pack


def open_db(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    if args.schema:
        from zodbsql.backends.postgresql.options import PostgreSQLOptions
        return zodbsql.open_db(PostgreSQLOptions(dsn=args.url, schema=args.schema),
                               cache_size_mb=0)
    return zodbsql.open_db(args.url, cache_size_mb=0)


def build(args: argparse.Namespace) -> None:
    db = open_db(args)
    conn = db.open()
    root = conn.root()
    root["tree"] = tree = OOBTree()
    root["writer"] = PersistentMapping()
    transaction.commit()
    for i in range(args.objects):
        tree[i] = PersistentMapping(value=i)
        if i % 20000 == 19999:
            transaction.commit()
            conn.cacheMinimize()
    transaction.commit()
    for i in range(args.objects):
        if i % 10:
            del tree[i]
        if i % 50000 == 49999:
            transaction.commit()
            conn.cacheMinimize()
    transaction.commit()
    conn.close()
    db.close()


def writer(args: argparse.Namespace, stop: object, latencies: object) -> None:
    db = open_db(args)
    conn = db.open()
    i = 0
    while not stop.is_set():  # type: ignore[attr-defined]
        started = time.perf_counter()
        conn.root()["writer"][i % 100] = i
        transaction.commit()
        latencies.append((time.time(), time.perf_counter() - started))  # type: ignore[attr-defined]
        i += 1
        time.sleep(0.01)
    conn.close()
    db.close()


def summary(values: list[float]) -> str:
    if not values:
        return "no commits"
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"{len(values)} commits, median {statistics.median(values) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--schema", help="PostgreSQL schema (created by the storage)")
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--duty-cycle", type=float, default=1.0)
    parser.add_argument("--packs", type=int, default=1,
                        help="packs in a row (the third prunes the first's deletion records)")
    args = parser.parse_args()
    started = time.perf_counter()
    build(args)
    print(f"built {args.objects} objects (90% garbage) in {time.perf_counter() - started:.0f} s")
    manager = multiprocessing.Manager()
    stop, latencies = manager.Event(), manager.list()
    proc = multiprocessing.get_context("spawn").Process(target=writer, args=(args, stop, latencies))
    proc.start()
    time.sleep(5)
    db = open_db(args)
    spans = []
    for number in range(args.packs):
        objects_before = len(db.storage)
        pack_start = time.time()
        pack.pack(db.storage, time.time(), duty_cycle=args.duty_cycle)
        pack_end = time.time()
        spans.append((pack_start, pack_end))
        print(f"pack {number + 1} with GC: {pack_end - pack_start:.1f} s,"
              f" {objects_before} -> {len(db.storage)} objects")
        time.sleep(1)
    db.close()
    time.sleep(2)
    stop.set()
    proc.join()
    before = [lat for at, lat in latencies if at < spans[0][0]]
    print(f"writer before the pack: {summary(before)}")
    for number, (pack_start, pack_end) in enumerate(spans):
        during = [lat for at, lat in latencies if pack_start <= at <= pack_end]
        print(f"writer during pack {number + 1}: {summary(during)}")


if __name__ == "__main__":
    main()
