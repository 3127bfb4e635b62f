"""Each COMMIT's time in a run of commits that change the same objects, on SQLite.

    .venv/bin/python scripts/commit_times.py [--commits 80] [--objects 1000]
        [--size 1500] [--options checkpoint_in_background=false]

A new SQLite database in a temporary directory (``--options``: the URL's query, the
``<sqlite3>`` settings) gets ``--objects`` ``PersistentMapping`` objects of ``--size``
random bytes each; then ``--commits`` transactions in a row change every one of them
(zodbshootout's ``update``).  Printed: the median, mean and largest ``COMMIT``, how
many took over 10 ms (a commit that checkpoints the write-ahead log), the whole
commit's median and mean, and each ``COMMIT`` in ms.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import transaction
from persistent.mapping import PersistentMapping

import zodbsql
from zodbsql.backends.sqlite.connections import SQLiteConnection


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=80)
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--size", type=int, default=1500)
    parser.add_argument("--options", default="", help="the URL's query, such as"
                        " checkpoint_in_background=false")
    args = parser.parse_args()
    commits: list[float] = []
    committing = SQLiteConnection.commit

    def timed(self: SQLiteConnection) -> None:
        start = time.perf_counter()
        committing(self)
        commits.append((time.perf_counter() - start) * 1e3)
    SQLiteConnection.commit = timed           # type: ignore[method-assign]
    whole: list[float] = []
    with tempfile.TemporaryDirectory() as directory:
        query = f"?{args.options}" if args.options else ""
        db: Any = zodbsql.open_db(f"sqlite://{directory}/Data.sqlite{query}")
        tm = transaction.TransactionManager()
        conn = db.open(transaction_manager=tm)
        tm.begin()
        conn.root()["objects"] = objects = PersistentMapping()
        for number in range(args.objects):
            objects[number] = PersistentMapping(data=os.urandom(args.size))
        tm.commit()
        commits.clear()
        for trial in range(args.commits):
            tm.begin()
            for each in objects.values():
                each["trial"] = trial
            start = time.perf_counter()
            tm.commit()
            whole.append((time.perf_counter() - start) * 1e3)
        conn.close()
        db.close()
    SQLiteConnection.commit = committing      # type: ignore[method-assign]
    print(f"COMMIT ms: median {statistics.median(commits):.2f},"
          f" mean {statistics.fmean(commits):.2f}, largest {max(commits):.2f};"
          f" over 10 ms: {sum(ms > 10 for ms in commits)} of {len(commits)}")
    print(f"whole commit ms: median {statistics.median(whole):.1f},"
          f" mean {statistics.fmean(whole):.1f}")
    print("each COMMIT:", " ".join(f"{ms:.0f}" for ms in commits))


if __name__ == "__main__":
    main()
