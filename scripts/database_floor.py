"""The least the databases themselves take for what the bench's add and read do,
without zodbsql.

    .venv/bin/python scripts/database_floor.py [--objects 1000] [--trials 60] [--size 180]
        [--postgresql "host=127.0.0.1 dbname=scratch user=postgres"]

In a temporary database (WAL, as zodbsql opens it), with plain ``sqlite3`` calls:

- a commit of --objects new states: one ``executemany`` into a table of revisions keyed
  by (oid, tid), one into a table of current tids, ``COMMIT`` with ``synchronous`` full
  (zodbsql's default) and then normal;
- a read of as many states by oid in one statement, in a read transaction;
- a 64-bit BLAKE2b checksum of each state, as zodbsql checks every state it reads and
  stores (a hasher copied from one made once, ``records.checksummer``).

With --postgresql (a libpq connection string of a scratch database: a table is created
in it and dropped), also a read of as many states by oid in one prepared ``= ANY``
select through psycopg, as zodbsql's batches are read.

Printed: microseconds an object (the median trial, the first ten left out).  Set them
beside the bench's table of each storage's own time beyond MappingStorage (``zodbsql
bench --contender sqlite,filestorage,mappingstorage``) with MappingStorage's own calls
added back (its ``load`` about 1.6 us an object, an add's about 2.3), which that table
keeps in the floor: a storage built on SQLite that checks its states spends at least
these, where FileStorage spends its own part plus those calls.
"""
from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time

from zodbsql.storage.records import checksummer

WARM_UP = 10


def median_us(seconds: list[float], objects: int) -> float:
    return statistics.median(seconds[WARM_UP:]) * 1e6 / objects


def commits(db: sqlite3.Connection, first_oid: int, objects: int, trials: int,
            state: bytes) -> list[float]:
    taken = []
    for trial in range(trials):
        tid = first_oid + trial + 1
        oids = range(first_oid + trial * objects, first_oid + (trial + 1) * objects)
        start = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT INTO revision VALUES (?, ?, ?)", [(o, tid, state) for o in oids])
        db.executemany("INSERT INTO current VALUES (?, ?)", [(o, tid) for o in oids])
        db.execute("COMMIT")
        taken.append(time.perf_counter() - start)
    return taken


def reads(db: sqlite3.Connection, objects: int, trials: int) -> list[float]:
    taken = []
    marks = ",".join("?" * objects)
    for trial in range(trials):
        oids = list(range(trial * objects, (trial + 1) * objects))
        start = time.perf_counter()
        db.execute("BEGIN")
        rows = db.execute(f"SELECT zoid, tid, state FROM revision WHERE zoid IN ({marks})",
                          oids).fetchall()
        db.execute("COMMIT")
        taken.append(time.perf_counter() - start)
        assert len(rows) == objects
    return taken


def server_reads(dsn: str, objects: int, trials: int, state: bytes) -> list[float]:
    import psycopg
    table = "zodbsql_floor"
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(f"CREATE TABLE {table} (zoid BIGINT, tid BIGINT, state BYTEA,"
                   " PRIMARY KEY (zoid, tid))")
        try:
            with db.cursor() as cursor, cursor.copy(
                    f"COPY {table} (zoid, tid, state) FROM STDIN") as copy:
                for oid in range(objects * trials):
                    copy.write_row((oid, 1, state))
            db.execute(f"ANALYZE {table}")
            taken = []
            for trial in range(trials):
                oids = list(range(trial * objects, (trial + 1) * objects))
                start = time.perf_counter()
                rows = db.execute(f"SELECT zoid, tid, state FROM {table}"
                                  " WHERE zoid = ANY(%s)", (oids,), prepare=True).fetchall()
                taken.append(time.perf_counter() - start)
                assert len(rows) == objects
            return taken
        finally:
            db.execute(f"DROP TABLE {table}")


def checksums(objects: int, trials: int, state: bytes) -> list[float]:
    digest = checksummer()
    states = [state + i.to_bytes(4, "big") for i in range(objects)]
    taken = []
    for _ in range(trials):
        start = time.perf_counter()
        for each in states:
            digest(each)
        taken.append(time.perf_counter() - start)
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--size", type=int, default=180,
                        help="bytes a state (the bench's items pickle to about 180)")
    parser.add_argument("--postgresql", metavar="DSN",
                        help="a scratch PostgreSQL database to time a read of states in")
    args = parser.parse_args()
    n, trials, state = args.objects, max(args.trials, WARM_UP + 1), b"x" * args.size
    with tempfile.TemporaryDirectory() as directory:
        db = sqlite3.connect(f"{directory}/floor.sqlite", isolation_level=None)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("CREATE TABLE revision (zoid INTEGER, tid INTEGER, state BLOB,"
                   " PRIMARY KEY (zoid, tid)) WITHOUT ROWID")
        db.execute("CREATE TABLE current (zoid INTEGER PRIMARY KEY, tid INTEGER)")
        db.execute("PRAGMA synchronous = FULL")
        full = commits(db, 0, n, trials, state)
        read = reads(db, n, trials)
        db.execute("PRAGMA synchronous = NORMAL")
        normal = commits(db, trials * n, n, trials, state)
        db.close()
    timed = [("SQLite commit, synchronous full", full),
             ("SQLite commit, synchronous normal", normal),
             ("SQLite read by oid, one statement", read),
             ("checksum (BLAKE2b, 8 bytes)", checksums(n, trials, state))]
    if args.postgresql:
        timed.append(("PostgreSQL read by oid, one select",
                      server_reads(args.postgresql, n, trials, state)))
    print(f"µs an object, {n} objects of {args.size} bytes, median of {trials - WARM_UP}")
    for label, seconds in timed:
        print(f"  {label:36} {median_us(seconds, n):6.2f}")


if __name__ == "__main__":
    main()
