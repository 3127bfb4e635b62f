"""What a DB opened, used and closed costs: server sessions and CPU, client and server.

ZODB's race tests (and processes that open a DB per job) open a storage and a DB, use
it for a few transactions and close it, over and over.  Each server session a storage
opens is a backend process the server starts and warms up.  This opens a DB on a
zodbsql URL ``--cycles`` times, reads the root in ``--transactions`` transactions each
time, and prints per cycle: the server sessions (connections) its storages opened, the
wall time, this process's CPU and the CPU of everything else on the machine (the
server's, on a machine doing nothing else):

    python scripts/open_cost.py "postgresql://127.0.0.1/test?schema=scratch"

The database must be a scratch one: the script writes into its root.
"""
from __future__ import annotations

import argparse
import os
import time

import transaction

from zodbsql.api import open_db


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (``/proc/stat``)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]      # idle and iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def count_sessions(backend_class: type) -> list[int]:
    """Count the server sessions (connections) every storage of this backend opens
    from now on: load, commit and listening sessions alike."""
    opened = [0]
    connect = getattr(backend_class, "connect")

    def counted(self: object, *args: object, **kwargs: object) -> object:
        opened[0] += 1
        return connect(self, *args, **kwargs)

    setattr(backend_class, "connect", counted)
    return opened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="a zodbsql URL of a scratch database")
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--transactions", type=int, default=4)
    args = parser.parse_args()
    db = open_db(args.url)
    with db.transaction() as conn:
        conn.root()["open_cost"] = 1
    opened = count_sessions(type(db.storage.shared.backend))
    db.close()
    busy, own, wall = machine_busy_seconds(), time.process_time(), time.perf_counter()
    for _ in range(args.cycles):
        db = open_db(args.url)
        for _ in range(args.transactions):
            with db.transaction() as conn:
                assert conn.root()["open_cost"] == 1
        db.close()
    wall = time.perf_counter() - wall
    own = time.process_time() - own
    others = max(0.0, machine_busy_seconds() - busy - own)
    per = 1000 / args.cycles
    print(f"per DB opened, used {args.transactions} times and closed:"
          f" {opened[0] / args.cycles:.2f} server sessions, "
          f"{wall * per:.1f} ms, this process's CPU {own * per:.1f} ms,"
          f" the rest of the machine's {others * per:.1f} ms")


if __name__ == "__main__":
    main()
