"""Where a commit's time goes in SQL: each statement's time, summed per commit.

Commits ``--commits`` transactions of ``--objects`` new objects each (the bench's
``add``: a new mapping of small items) through a zodbsql storage with its SQL trace on,
and prints, per commit, each statement's mean time and how often it ran, by the
statement's first words, the most expensive first; the first ``--warmup`` commits
(statements prepared, oid blocks grown) are not counted.  Seconds move between runs on
a busy machine: run the code before and after a change in turn, as with
``PYTHONPATH=old/src``, and compare within the same minutes.  ``--prepopulate N``
first fills the database as the bench's option does (an OOBTree of N items).

    python scripts/commit_sql.py "sqlite:///tmp/scratch.db"
    python scripts/commit_sql.py "postgresql://127.0.0.1/test?schema=scratch"

The database must be a scratch one: the script writes into its root.
"""
from __future__ import annotations

import argparse
import collections
import logging
import re

import transaction
from persistent.mapping import PersistentMapping

from zodbsql.api import open_db
from zodbsql.bench.workloads import Item, setup_database

#: A trace line's duration and the statement's beginning (``storage/trace``'s format).
TRACED = re.compile(r" ([0-9.]+) ms: (.{0,60})")


class StatementTimes(logging.Handler):
    """Sums the traced statements' milliseconds by their first words."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.ms: dict[str, float] = collections.defaultdict(float)
        self.count: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        found = TRACED.search(record.getMessage())
        if found:
            self.ms[found.group(2)] += float(found.group(1))
            self.count[found.group(2)] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("url", help="a zodbsql URL of a scratch database")
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--commits", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--prepopulate", type=int, default=0)
    args = parser.parse_args()
    url = args.url + ("&" if "?" in args.url else "?") + "sql-trace=true"
    db = open_db(url)
    if args.prepopulate:
        setup_database(db, args.prepopulate)
    times = StatementTimes()
    trace = logging.getLogger("zodbsql.sql")
    trace.setLevel(logging.DEBUG)
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    try:
        for number in range(args.warmup + args.commits):
            if number == args.warmup:
                trace.addHandler(times)
            tm.begin()
            mapping = conn.root()[f"commit_sql_{number}"] = PersistentMapping()
            for key in range(args.objects):
                mapping[key] = Item(b"x" * 128)
            tm.commit()
    finally:
        trace.removeHandler(times)
        conn.close()
        db.close()
    total = 0.0
    print(f"per commit of {args.objects} new objects, mean of {args.commits}:")
    for statement, ms in sorted(times.ms.items(), key=lambda item: -item[1]):
        print(f"{ms / args.commits:8.3f} ms {times.count[statement] / args.commits:5.1f}x"
              f"  {statement}")
        total += ms / args.commits
    print(f"{total:8.3f} ms in all")


if __name__ == "__main__":
    main()
