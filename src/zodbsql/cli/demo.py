"""Write, read, update, undo and pack a small database, and say what happened.

A first look at zodbsql on the embedded SQLite default: no server, one file.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import transaction
from BTrees.OOBTree import OOBTree
from persistent.mapping import PersistentMapping

import zodbsql

HELP = "a short demo on SQLite: write, read, update, undo, pack"
EXAMPLE = "example:\n  zodbsql demo --objects 5000 --path ./demo.sqlite"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--path", help="SQLite file to use (default: a temporary file,"
                        " removed afterwards)")
    parser.add_argument("--objects", type=int, default=2000,
                        help="objects to write (default: %(default)s)")
    parser.add_argument("--history-free", action="store_true",
                        help="use a history-free storage (no undo)")


def _step(label: str, started: float, detail: str) -> None:
    print(f"  {label:<10} {time.perf_counter() - started:8.3f} s  {detail}")


def run(args: argparse.Namespace) -> int:
    if args.path:
        return _demo(args.path, args)
    with tempfile.TemporaryDirectory(prefix="zodbsql-demo-") as tmp:
        return _demo(os.path.join(tmp, "Data.sqlite"), args)


def _demo(path: str, args: argparse.Namespace) -> int:
    keep_history = not args.history_free
    db = zodbsql.open_db(zodbsql.SQLiteOptions(path=path), keep_history=keep_history)
    storage = db.storage
    mode = "history-preserving" if keep_history else "history-free"
    print(f"zodbsql demo on {storage.backend.describe()} ({mode})")
    count = args.objects
    try:
        started = time.perf_counter()
        with db.transaction("demo: write") as conn:
            tree = conn.root.items = OOBTree()
            for i in range(count):
                tree[i] = PersistentMapping(number=i, square=i * i)
        _step("write", started, f"{count} objects in one transaction")

        started = time.perf_counter()
        with db.transaction() as conn:
            total = sum(item["square"] for item in conn.root.items.values())
        assert total == sum(i * i for i in range(count))
        _step("read", started, f"{count} objects read back, sum of squares {total}")

        started = time.perf_counter()
        with db.transaction("demo: update") as conn:
            for i in range(0, count, 10):
                conn.root.items[i]["number"] = -i
        _step("update", started, f"{len(range(0, count, 10))} objects changed")

        if keep_history:
            started = time.perf_counter()
            last = db.undoLog(0, 1)[0]
            db.undo(last["id"])
            transaction.commit()
            probe = (count - 1) // 10 * 10  # the last item the update changed
            with db.transaction() as conn:
                restored = conn.root.items[probe]["number"]
            _step("undo", started,
                  f"undid {last['description']!r}: item {probe} is {restored} again")

        started = time.perf_counter()
        with db.transaction("demo: drop half") as conn:
            for i in range(0, count, 2):
                del conn.root.items[i]
        size_before = storage.getSize()
        db.pack(time.time() + 1)
        _step("pack", started, f"dropped {len(range(0, count, 2))} objects and packed:"
              f" {len(storage)} objects, {size_before // 1024} KiB before pack")
    finally:
        db.close()
    print("done; the database file was", "kept at " + path if args.path else "removed")
    return 0
