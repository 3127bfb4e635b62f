"""How long the first request of a restarted process takes while its persistent cache
is read back (issue 16), against the same request without the cache file.

One database holds an ``OOBTree`` of ``--objects`` small objects, made once; one
process reads them all with ``cache-persistent-dir`` set and closes, which saves the
cache file.  Then each run is a fresh process that opens the storage, with the file
(its read-back starts at open, in the background) or without ``cache-persistent-dir``,
and at once serves one "request": it reads ``--reads`` objects picked at random (the
same ones every run) in one transaction.  Runs with and without alternate; the script
prints each run's request time and the medians, and for the runs with the file how long
the read-back took and how many states it adopted.

    python scripts/first_request.py --backend sqlite
    python scripts/first_request.py --backend postgresql --runs 9

The SQLite file and the cache directory are under ``--dir``; PostgreSQL uses a scratch
schema of the test server, dropped at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import transaction
import ZODB
from BTrees.OOBTree import OOBTree
from persistent import Persistent

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"


class Item(Persistent):
    def __init__(self, data: bytes) -> None:
        self.data = data


def open_storage(args: argparse.Namespace, with_file: bool) -> Any:
    from zodbsql.api import open_storage as open_
    cache: dict[str, Any] = {"cache_size_mb": 64.0}
    if with_file:
        cache["cache_persistent_dir"] = os.path.join(args.dir, "cache")
    if args.backend == "sqlite":
        from zodbsql.backends.sqlite.options import SQLiteOptions
        return open_(SQLiteOptions(path=os.path.join(args.dir, "first.sqlite")), **cache)
    from zodbsql.backends.postgresql.options import PostgreSQLOptions
    return open_(PostgreSQLOptions(dsn=PG_DSN, schema=args.schema), **cache)


def build(args: argparse.Namespace) -> None:
    db = ZODB.DB(open_storage(args, with_file=True))
    with db.transaction() as conn:
        conn.root()["items"] = OOBTree()
    for start in range(0, args.objects, 10_000):
        with db.transaction() as conn:
            items = conn.root()["items"]
            for key in range(start, min(start + 10_000, args.objects)):
                items[key] = Item(b"x" * 128)
    with db.transaction() as conn:       # every state once, so the file holds them all
        for item in conn.root()["items"].values():
            item.data
    db.close()                           # saves the file


def request(args: argparse.Namespace, with_file: bool) -> dict[str, Any]:
    """One run, in this (fresh) process."""
    keys = random.Random(16).sample(range(args.objects), args.reads)
    opened = time.perf_counter()
    storage = open_storage(args, with_file)
    db = ZODB.DB(storage)
    start = time.perf_counter()
    with db.transaction() as conn:
        items = conn.root()["items"]
        for key in keys:
            items[key].data
    took = time.perf_counter() - start
    result: dict[str, Any] = {"request_ms": took * 1000,
                              "open_ms": (start - opened) * 1000}
    persistent = storage.shared.persistent
    if persistent is not None:
        persistent.loaded.wait(300)
        result["readback_ms"] = (time.perf_counter() - opened) * 1000
        result["adopted"] = persistent.adopted
    print(json.dumps(result), flush=True)
    os._exit(0)   # no close: a close would save the file again and change it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--objects", type=int, default=50_000)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--dir")
    parser.add_argument("--schema")
    parser.add_argument("--child", choices=("with", "without"))
    args = parser.parse_args()
    if args.child:
        request(args, args.child == "with")
        return
    args.dir = args.dir or tempfile.mkdtemp(prefix="zodbsql-first-request-")
    os.makedirs(args.dir, exist_ok=True)
    admin = None
    if args.backend == "postgresql":
        import psycopg
        admin = psycopg.connect(PG_DSN, autocommit=True)
        args.schema = f"first_request_{uuid.uuid4().hex[:8]}"
        admin.execute(f'CREATE SCHEMA "{args.schema}"')
    try:
        build(args)
        times: dict[str, list[float]] = {"with": [], "without": []}
        for run in range(args.runs):
            for kind in ("with", "without"):
                command = [sys.executable, __file__, "--child", kind, "--backend",
                           args.backend, "--objects", str(args.objects), "--reads",
                           str(args.reads), "--dir", args.dir]
                if args.schema:
                    command += ["--schema", args.schema]
                out = subprocess.run(command, capture_output=True, text=True, check=True)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                times[kind].append(result["request_ms"])
                print(f"run {run + 1} {kind:>7} the file: {json.dumps(result)}", flush=True)
        for kind, values in times.items():
            print(f"{kind} the file: median {statistics.median(values):.1f} ms"
                  f" (min {min(values):.1f}, max {max(values):.1f})")
    finally:
        if admin is not None:
            admin.execute(f'DROP SCHEMA IF EXISTS "{args.schema}" CASCADE')
            admin.close()


if __name__ == "__main__":
    main()
