"""Run the contended BTree + Length workload of issue 11 and check it.

Several processes each run N transactions that insert K fresh keys into one shared
OOBTree and add K to one shared BTrees.Length, every transaction retried on
TransientError (as ``transaction.manager.attempts()`` and Zope do).  Prints the run
time, the commits, the retried errors by class and the server's deadlock counter, and
checks that the Length and the tree hold exactly processes x N x K keys.  The exit
status is 1 when the totals are wrong or the server counted a deadlock.

The database is a scratch one, made for the run and dropped after it: a SQLite file in
a temporary directory, a PostgreSQL database (its deadlock counter is its own) or a
MySQL/MariaDB database (``Innodb_deadlocks`` is server-wide: other sessions' deadlocks
during the run count too).

    python scripts/contention.py --backend postgresql --processes 8 --transactions 500
    python scripts/contention.py --backend mysql --history-free \\
        --mysql-url mysql://root@127.0.0.1:3306/test
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from typing import Any, Iterator

import transaction
import ZODB

import zodbsql
from zodbsql.bench import contenders, hotspot, processes
from zodbsql.bench.deadlocks import counter_for_options

NAME = "hot"


@contextlib.contextmanager
def scratch(args: argparse.Namespace) -> Iterator[Any]:
    """Backend options for a new, empty database; removed at the end."""
    if args.backend == "sqlite":
        from zodbsql.backends.sqlite.options import SQLiteOptions
        with tempfile.TemporaryDirectory(prefix="zodbsql-contention-") as directory:
            yield SQLiteOptions(path=os.path.join(directory, "Data.sqlite"))
        return
    servers = contenders.Servers()
    try:
        if args.backend == "postgresql":
            from zodbsql.backends.postgresql.options import PostgreSQLOptions
            yield PostgreSQLOptions(dsn=servers.scratch_postgresql_database(args.dsn))
        else:
            from zodbsql.api import parse_url
            base, _ = parse_url(args.mysql_url)
            yield servers.scratch_database(base)
    finally:
        servers.close()


def prepare(options: Any, keep_history: bool) -> None:
    db = ZODB.DB(zodbsql.open_storage(options, keep_history=keep_history))
    try:
        tm = transaction.TransactionManager(explicit=True)
        conn = db.open(tm)
        hotspot.make_shared(tm, conn.root, NAME)
        conn.close()
    finally:
        db.close()


def check(options: Any, keep_history: bool, args: argparse.Namespace) -> list[str]:
    db = ZODB.DB(zodbsql.open_storage(options, keep_history=keep_history))
    try:
        with db.transaction() as conn:
            return hotspot.problems(conn.root()[NAME], NAME, args.processes,
                                    args.transactions, args.keys)
    finally:
        db.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "mysql"),
                        default="sqlite")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--transactions", type=int, default=500,
                        help="transactions per process (default: %(default)s)")
    parser.add_argument("--keys", type=int, default=hotspot.KEYS_PER_TRANSACTION,
                        help="keys each transaction inserts (default: %(default)s)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--keep-history", dest="keep_history", action="store_true",
                      default=True, help="history-preserving (the default)")
    mode.add_argument("--history-free", dest="keep_history", action="store_false")
    parser.add_argument("--dsn", default=contenders.POSTGRESQL_DSN,
                        help="PostgreSQL server (a scratch database is made there;"
                        " default: %(default)s)")
    parser.add_argument("--mysql-url", default=contenders.MYSQL_URL,
                        help="MySQL/MariaDB server (a scratch database is made there;"
                        " default: %(default)s)")
    args = parser.parse_args(argv)
    mode_name = "history-preserving" if args.keep_history else "history-free"
    with scratch(args) as options:
        backend = options.create_backend(args.keep_history, 30.0)
        print(f"zodbsql, {backend.describe()} ({mode_name}): {args.processes} processes"
              f" x {args.transactions} transactions x {args.keys} keys")
        prepare(options, args.keep_history)
        counter = counter_for_options(options)
        before = counter.settled() if counter is not None else 0
        finished = processes.run(processes.hotspot_worker, options, args.keep_history,
                                 args.processes, NAME, args.transactions, args.keys)
        # The workers' sessions have ended: PostgreSQL has their statistics.
        deadlocks = counter.settled() - before if counter is not None else None
        wrong = [] if finished.errors else check(options, args.keep_history, args)
    commits = args.processes * args.transactions
    retries = finished.retries
    by_error = ", ".join(f"{name} {count}" for name, count in
                         sorted(retries.by_error.items(), key=lambda item: -item[1]))
    print(f"run time   {finished.seconds:.1f} s")
    print(f"commits    {commits} ({commits / max(finished.seconds, 1e-9):.1f}/s)")
    print(f"retries    {retries.total} ({retries.total / commits:.2f} per commit)"
          + (f": {by_error}" if by_error else ""))
    if counter is None:
        print("deadlocks  - (no server counter)")
    else:
        print(f"deadlocks  {deadlocks} (the {counter.server} {counter.scope}'s counter)")
    for number, error in sorted(finished.errors.items()):
        print(f"FAILED     worker {number}: {error}")
    for problem in wrong:
        print(f"WRONG      {problem}")
    if not finished.errors and not wrong:
        print(f"totals     exact: Length = keys in the tree = {commits * args.keys}")
    return 1 if finished.errors or wrong or deadlocks else 0


if __name__ == "__main__":
    sys.exit(main())
