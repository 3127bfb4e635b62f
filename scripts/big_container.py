"""What a commit into one ever-growing container costs (zodbshootout's ``add`` pattern).

Every transaction adds ``--per-commit`` new small objects to the same
``PersistentMapping``, so the mapping's state, and the references recorded with it,
grow by that many children per commit. The commit's time is printed every few steps,
for a zodbsql URL or for FileStorage (in a temporary directory), to compare how each
grows:

    python scripts/big_container.py filestorage --steps 31
    python scripts/big_container.py "postgresql://127.0.0.1/test?schema=scratch" --steps 31

The zodbsql database must be a scratch one (an empty schema or SQLite file): the
script writes into its root.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import transaction
import ZODB
import ZODB.FileStorage
from persistent.mapping import PersistentMapping

from zodbsql.api import open_db
from zodbsql.bench.workloads import Item


def open_target(target: str, directory: str) -> Any:
    if target == "filestorage":
        return ZODB.DB(ZODB.FileStorage.FileStorage(os.path.join(directory, "Data.fs")))
    return open_db(target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="a zodbsql URL, or 'filestorage'")
    parser.add_argument("--steps", type=int, default=31, help="commits (default 31)")
    parser.add_argument("--per-commit", type=int, default=1000,
                        help="new children per commit (default 1,000)")
    parser.add_argument("--every", type=int, default=5, help="print every N commits")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        db = open_target(args.target, directory)
        tm = transaction.TransactionManager()
        conn = db.open(tm)
        try:
            tm.begin()
            conn.root()["big_container"] = PersistentMapping()
            tm.commit()
            children = 0
            data = b"x" * 128
            for step in range(args.steps):
                tm.begin()
                mapping = conn.root()["big_container"]
                for key in range(children, children + args.per_commit):
                    mapping[key] = Item(data)
                children += args.per_commit
                started = time.perf_counter()
                tm.commit()
                elapsed = time.perf_counter() - started
                if step < 2 or step % args.every == 0 or step == args.steps - 1:
                    print(f"{children:,} children: a commit of {args.per_commit:,} new"
                          f" took {elapsed * 1000:.1f} ms", flush=True)
        finally:
            conn.close()
            db.close()


if __name__ == "__main__":
    main()
