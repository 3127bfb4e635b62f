"""What the state cache costs in memory, and what it serves on a second pass (issue 24).

One database holds an ``OOBTree`` of ``--objects`` small persistent objects
(``--object-size`` bytes of data each), made once.  Then, for every cache size, a fresh
process opens the storage with that cache (ZODB's pickle cache at 400 objects), reads
every object in key order (the first pass: everything from the database), empties the
pickle cache and reads them all again (the second pass: what the state cache kept).
It reports the process's peak RSS, the peak above the cache-off run (size 0), the
cache's own count, the objects per second of each pass and, for zodbsql, the share of
the second pass's loads the state cache answered.  The passes' ratio is given by the
wall clock and by the process's CPU time (steadier on a shared host; on PostgreSQL it
leaves out the server's work).

    python scripts/cache_memory.py --backend sqlite --sizes 0,10,32,64,256
    python scripts/cache_memory.py --backend postgresql --sizes 0,10,32
    python scripts/cache_memory.py --backend relstorage-postgresql --sizes 0,10,32

``--cache-compress zstd`` keeps zodbsql's cached states compressed.
``--prefetch-count 0`` turns zodbsql's prefetch off: every load that misses the state
cache is a statement of its own, as RelStorage's are, so the second pass shows what the
cache alone saves.  ``--admission off`` reads with the state cache's admission filter turned off (the
segmented LRU alone); ``--admission lru`` with one plain LRU segment (the policy before
issue 24), to compare the policies on the same data.  The databases are scratch ones:
a SQLite file under ``--dir``, PostgreSQL databases ``cachemem_zodbsql`` and
``cachemem_relstorage`` (dropped and made again with ``--rebuild``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import transaction
import ZODB
from BTrees.OOBTree import OOBTree
from persistent import Persistent

PG = "postgresql://postgres@127.0.0.1:5432"
NAMES = {"postgresql": "cachemem_zodbsql", "relstorage-postgresql": "cachemem_relstorage"}


class Item(Persistent):
    def __init__(self, data: bytes) -> None:
        self.data = data


def open_db(args: argparse.Namespace, size_mb: float) -> ZODB.DB:
    if args.backend == "relstorage-postgresql":
        from relstorage.adapters.postgresql import PostgreSQLAdapter
        from relstorage.options import Options
        from relstorage.storage import RelStorage
        options = Options(cache_local_mb=size_mb, cache_local_dir=None)
        adapter = PostgreSQLAdapter(
            dsn=f"host=127.0.0.1 user=postgres dbname={NAMES[args.backend]}",
            options=options)
        storage: Any = RelStorage(adapter, options=options)
    else:
        import zodbsql
        url = (f"sqlite:///{args.dir}/cachemem.sqlite" if args.backend == "sqlite"
               else f"{PG}/{NAMES[args.backend]}")
        extra = {} if args.prefetch_count is None else {"prefetch_count": args.prefetch_count}
        extra["cache_compress"] = args.cache_compress
        storage = zodbsql.open_storage(url, cache_size_mb=size_mb, **extra)
        if args.admission != "on":
            storage.shared.cache._policy_for_comparison(args.admission)
    return ZODB.DB(storage, cache_size=400)


def rebuild(args: argparse.Namespace) -> None:
    if args.backend == "sqlite":
        os.makedirs(args.dir, exist_ok=True)
        for suffix in ("", "-wal", "-shm"):
            path = f"{args.dir}/cachemem.sqlite{suffix}"
            if os.path.exists(path):
                os.remove(path)
    else:
        import psycopg2
        conn = psycopg2.connect("host=127.0.0.1 user=postgres dbname=postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {NAMES[args.backend]}")
            cur.execute(f"CREATE DATABASE {NAMES[args.backend]}")
        conn.close()
    db = open_db(args, 0)
    with db.transaction() as conn:
        conn.root.tree = OOBTree()
    data = b"x" * args.object_size
    for start in range(0, args.objects, 10_000):
        with db.transaction() as conn:
            tree = conn.root.tree
            for i in range(start, min(start + 10_000, args.objects)):
                tree[f"{i:08d}"] = Item(data)
    db.close()


def database_exists(name: str) -> bool:
    import psycopg2
    conn = psycopg2.connect("host=127.0.0.1 user=postgres dbname=postgres")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            return cur.fetchone() is not None
    finally:
        conn.close()


def peak_rss_mb() -> float:
    """This process's peak RSS since its exec (``VmHWM``).  ``ru_maxrss`` is not: Linux
    carries it over from the forked parent, so a size measured right after ``--rebuild``
    (the parent then held the whole database build) reported the parent's peak."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def read_all(conn: Any) -> tuple[float, float]:
    """Objects per second of one pass, by the wall clock and by this process's CPU time
    (which a busy neighbour on a shared host moves less; on SQLite it is all the work)."""
    started, started_cpu = time.perf_counter(), time.process_time()
    count = 0
    for item in conn.root.tree.values():
        item.data            # loads the state
        count += 1
        if count % 1000 == 0:
            conn.cacheGC()
    return (count / (time.perf_counter() - started),
            count / (time.process_time() - started_cpu))


def measure(args: argparse.Namespace, size_mb: float) -> dict[str, Any]:
    """One size, in this process (a fresh one per size)."""
    db = open_db(args, size_mb)
    conn = db.open()
    first, first_cpu = read_all(conn)
    conn.cacheMinimize()
    cache = getattr(db.storage, "shared", None)
    cache = cache.cache if cache is not None else None
    hits, misses = (cache.hits, cache.misses) if cache is not None else (0, 0)
    second, second_cpu = read_all(conn)
    row = {"size_mb": size_mb, "first": first, "second": second,
           "cpu_ratio": second_cpu / first_cpu,
           "peak_rss_mb": peak_rss_mb()}
    if cache is not None:
        row["cache_mb"] = cache.bytes_used / 2**20
        served = cache.hits - hits
        asked = served + cache.misses - misses
        row["served"] = served / asked if asked else 0.0
        row["entries"] = len(cache)
    conn.close()
    db.close()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="sqlite",
                        choices=["sqlite", "postgresql", "relstorage-postgresql"])
    parser.add_argument("--sizes", default="0,10,32,64,256")
    parser.add_argument("--objects", type=int, default=200_000)
    parser.add_argument("--object-size", type=int, default=128)
    parser.add_argument("--dir", default="/tmp/cache-memory")
    parser.add_argument("--rebuild", action="store_true", help="make the database again")
    parser.add_argument("--admission", default="on", choices=["on", "off", "lru"])
    parser.add_argument("--prefetch-count", type=int,
                        help="zodbsql's prefetch-count (0: prefetch off, each load alone)")
    parser.add_argument("--cache-compress", default="off", choices=["off", "zstd", "auto"],
                        help="zodbsql's cache-compress")
    parser.add_argument("--one", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args, args.one)))
        return 0
    exists = os.path.exists(f"{args.dir}/cachemem.sqlite") if args.backend == "sqlite" \
        else database_exists(NAMES[args.backend])
    if args.rebuild or not exists:
        rebuild(args)
    rows = []
    for size in [float(s) for s in args.sizes.split(",")]:
        out = subprocess.run(
            [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]),
             "--one", str(size)], check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.splitlines()[-1]))
    base = next((r["peak_rss_mb"] for r in rows if r["size_mb"] == 0), None)
    print(f"{args.backend}, {args.objects} objects of {args.object_size} bytes,"
          f" admission {args.admission}, cache-compress {args.cache_compress}"
          + ("" if args.prefetch_count is None else f", prefetch-count {args.prefetch_count}"))
    print("| MB | peak RSS | above size 0 | counted | entries | 1st pass/s | 2nd pass/s"
          " | 2nd/1st | 2nd/1st CPU | served |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        above = f"{r['peak_rss_mb'] - base:.0f}" if base is not None else "-"
        print(f"| {r['size_mb']:g} | {r['peak_rss_mb']:.0f} | {above}"
              f" | {r.get('cache_mb', float('nan')):.1f} | {r.get('entries', '-')}"
              f" | {r['first']:.0f} | {r['second']:.0f} | {r['second'] / r['first']:.2f}"
              f" | {r['cpu_ratio']:.2f}"
              f" | {r.get('served', float('nan')):.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
