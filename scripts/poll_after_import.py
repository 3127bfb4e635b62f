"""What a transaction start costs a process after another process imported many objects.

A process opens the storage and commits one object; a second process writes
``--objects`` objects into an ``OOBTree`` (the bench's prepopulation: batches of 10,000);
then the first process begins a transaction, which polls every change since its last
start.  It prints that start's time and the first process's current and peak RSS
before and after, for the storage's ``poll-changes-limit`` (``--limit``; 0: none).

    python scripts/poll_after_import.py --backend sqlite --objects 1000000
    python scripts/poll_after_import.py --backend postgresql --limit 0

The database is a scratch one: a SQLite file in a temporary directory, or the
PostgreSQL or MySQL database ``pollimport_zodbsql`` (made and dropped here).
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time

import transaction
import ZODB.config

PG_SERVER = "host=127.0.0.1 user=postgres"
DATABASE = "pollimport_zodbsql"
IMPORT = """
import sys
import ZODB.config
from zodbsql.bench import workloads
db = ZODB.config.databaseFromString(open(sys.argv[1]).read())
workloads.setup_database(db, int(sys.argv[2]))
db.close()
"""


def config(backend: str, directory: str, limit: int) -> str:
    if backend == "sqlite":
        location = f"<sqlite3>\n path {directory}/Data.sqlite\n</sqlite3>"
    elif backend == "mysql":
        location = f"<mysql>\n host 127.0.0.1\n db {DATABASE}\n</mysql>"
    else:
        location = f"<postgresql>\n dsn {PG_SERVER} dbname={DATABASE}\n</postgresql>"
    return ("%import zodbsql\n<zodb main>\n<zodbsql>\n"
            f" poll-changes-limit {limit}\n{location}\n</zodbsql>\n</zodb>\n")


def rss_mb() -> tuple[float, float]:
    """The process's resident memory now and at its peak, in MB."""
    with open("/proc/self/statm") as statm:
        now = int(statm.read().split()[1]) * resource.getpagesize() / 1e6
    return now, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def recreate_mysql_database(drop_only: bool = False) -> None:
    import pymysql
    conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
            if not drop_only:
                cursor.execute(f"CREATE DATABASE {DATABASE}")
    finally:
        conn.close()


def recreate_pg_database(drop_only: bool = False) -> None:
    import psycopg
    with psycopg.connect(f"{PG_SERVER} dbname=postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        if not drop_only:
            conn.execute(f"CREATE DATABASE {DATABASE}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "mysql"), default="sqlite")
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--limit", type=int, default=100_000,
                        help="poll-changes-limit (0: no limit)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        recreate = {"postgresql": recreate_pg_database,
                    "mysql": recreate_mysql_database}.get(args.backend)
        if recreate:
            recreate()
        try:
            text = config(args.backend, directory, args.limit)
            with open(f"{directory}/zodb.conf", "w") as conf:
                conf.write(text)
            db = ZODB.config.databaseFromString(text)
            tm = transaction.TransactionManager()
            conn = db.open(transaction_manager=tm)
            tm.begin()
            conn.root()["before"] = 1
            tm.commit()
            print("before the import: RSS %.0f MB, peak %.0f MB" % rss_mb(), flush=True)
            subprocess.run([sys.executable, "-c", IMPORT, f"{directory}/zodb.conf",
                            str(args.objects)], check=True)
            started = time.perf_counter()
            tm.begin()
            took = time.perf_counter() - started
            print(f"the next start: {took * 1000:.0f} ms;"
                  " RSS %.0f MB, peak %.0f MB" % rss_mb())
            tm.abort()
            db.close()
        finally:
            if recreate:
                recreate(drop_only=True)


if __name__ == "__main__":
    main()
