"""Where an add commit's time goes: zodbsql against FileStorage, as the bench's ``add``.

    .venv/bin/python scripts/add_budget.py [--objects 1000] [--trials 200]
        [--url postgresql://postgres@127.0.0.1/scratch] [--update] [--size 0]

Each trial commits a new ``PersistentMapping`` holding --objects new mappings, once
into each storage, the two taking turns (which goes first alternates), so that both
see the same machine at the same moment: a figure in seconds moves up to 3x between
runs here, the ratio of a paired run much less.

Printed, milliseconds a commit (median, and mean, which counts the rare slow ones):
the whole ``commit``, and the storage calls ZODB makes inside it (``new_oid`` and
``store``, called once per object, summed); for zodbsql the parts of vote and finish:
the rows vote computes (checksums, references), the conflict check, the write of the
states, the backend's finish and the COMMITs (the commit's, and an oid block's when
one was taken in it).  What the whole holds besides the storage calls is ZODB's own
work (pickling), the same for both storages.  Give --url for a server database
instead of a new SQLite file (it is written to: a scratch one); --update to time, in
place of the add, a commit that changes every object the add wrote (the bench's
``update``); --size for objects that carry that many bytes of data besides (zodbshootout's
are about 1.5 KB).
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any, Callable

import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.FileStorage import FileStorage

import zodbsql
from warm_budget import Timings      # scripts/, where this script runs from
from zodbsql.storage.commit import PendingCommit

#: The storage calls ZODB makes in a commit, timed for both storages.
STORAGE_CALLS = ("new_oid", "store", "tpc_begin", "tpc_vote", "tpc_finish")
ORDER = ["new_oid", "store", "tpc_begin", "tpc_vote", "  rows (checksums, references)",
         "  conflict check", "  the backend's finish", "  write of the states", "tpc_finish",
         "  COMMIT", "commit"]


def zodbsql_parts(timings: Timings, storage: Any) -> None:
    """Time the parts of a zodbsql vote and finish."""
    backend = storage.shared.backend
    timings.wrap(PendingCommit, "_staged_rows", "  rows (checksums, references)")
    timings.wrap(backend.locker, "current_tids", "  conflict check")
    if backend.features.writes_at_vote:
        timings.wrap(backend.mover, "write_states", "  write of the states")
    timings.wrap(PendingCommit, "_call_finish", "  the backend's finish")
    pool = storage.shared.pool
    conn = pool.acquire(storage.shared.options.commit_lock_timeout)
    pool.release(conn)
    # PostgreSQL's finish carries the COMMIT: then there is no call of its own.
    timings.wrap(type(conn), "commit", "  COMMIT")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--url", help="a server database instead of SQLite (a scratch one)")
    parser.add_argument("--size", type=int, default=0,
                        help="bytes of random data in each object (default: none, a"
                             " state of ~60 bytes)")
    parser.add_argument("--update", action="store_true",
                        help="time a commit that changes every object just added (the"
                             " bench's update), not the add")
    args = parser.parse_args()
    timings = Timings()
    with tempfile.TemporaryDirectory() as directory:
        filestorage = FileStorage(f"{directory}/Data.fs")
        ours = zodbsql.open_storage(args.url or f"sqlite://{directory}/Data.sqlite")
        names = {"FileStorage": filestorage, "zodbsql": ours}
        for storage in names.values():
            for call in STORAGE_CALLS:
                timings.wrap(type(storage), call, call)
        zodbsql_parts(timings, ours)
        opened = {}
        for name, storage in names.items():
            db = ZODB.DB(storage)
            tm = transaction.TransactionManager()
            opened[name] = (db, tm, db.open(transaction_manager=tm).root())
        spent: dict[str, list[float]] = {}      # "storage: part" -> seconds a commit
        for trial in range(args.trials + 3):          # three to warm up
            order = list(opened) if trial % 2 else list(opened)[::-1]
            for name in order:
                db, tm, root = opened[name]
                root[trial] = container = PersistentMapping()
                for number in range(args.objects):
                    container[number] = child = PersistentMapping()
                    if args.size:
                        child["data"] = os.urandom(args.size)
                if args.update:
                    tm.commit()
                    for child in container.values():
                        child["changed"] = trial
                timings.take()
                start = time.perf_counter()
                tm.commit()
                parts = {**timings.take(), "commit": time.perf_counter() - start}
                if trial >= 3:
                    for part, seconds in parts.items():
                        spent.setdefault(f"{name}: {part}", []).append(seconds)
        for db, _, _ in opened.values():
            db.close()
    for name in names:
        what = "changed" if args.update else "new"
        print(f"{name}, ms a commit of {args.objects} {what} objects   median     mean")
        for part in ORDER:
            values = spent.get(f"{name}: {part}")
            if values:
                print(f"  {part:40} {statistics.median(values) * 1e3:7.2f}"
                      f" {statistics.fmean(values) * 1e3:8.2f}")
    whole = {name: statistics.median(spent[f"{name}: commit"]) for name in names}
    print(f"commit, zodbsql / FileStorage in speed: {whole['FileStorage'] / whole['zodbsql']:.3f}")


if __name__ == "__main__":
    main()
