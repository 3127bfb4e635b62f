"""A writer process of the cluster suite: the BTree + Length workload on one node.

Run as ``python -m tests.cluster.writer CONFIG_JSON`` (``ClusterWriterConfig``).  Each
transaction adds one to the shared ``BTrees.Length.Length`` and its own key to the
shared ``OOBTree``; a TransientError (a conflict, a Galera certification failure, a
lost or not-ready node) is retried, and after each commit that returned it appends
``ack KEY`` to its log and fsyncs (``tests.fault.writer.AckLog``).  A commit error that
is not retryable is logged as ``unknown KEY``.  It prints ``ready`` once connected,
``progress N`` every ten commits and ``done N CONFLICTS OTHER`` at the end.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any

import transaction
import ZODB
from transaction.interfaces import TransientError
from ZODB.POSException import ConflictError

import zodbsql
from tests.fault.writer import AckLog, say

RETRY_SLEEP = 0.05
#: Seconds one commit may keep failing before the writer gives up (a node down).
GIVE_UP = 120.0


@dataclasses.dataclass
class ClusterWriterConfig:
    url: str
    log: str
    name: str
    commits: int
    stop_file: str = ""   # stop early when it exists


def commit_one(tm: transaction.TransactionManager, conn: Any, key: str, number: int,
               log: AckLog, counts: dict[str, int]) -> None:
    deadline = time.monotonic() + GIVE_UP
    while True:
        committing = False
        try:
            tm.begin()
            root = conn.root()
            root["length"].change(1)
            root["tree"][key] = number
            committing = True
            tm.commit()
            log.write("ack", key)
            return
        except Exception as exc:
            tm.abort()
            if committing and not isinstance(exc, TransientError):
                log.write("unknown", key, type(exc).__name__)
                say("unknown", key, type(exc).__name__)
                return
            # Retryable, or before the commit (a node down, a reconnect).
            if committing:
                counts["conflicts" if isinstance(exc, ConflictError) else "other"] += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(RETRY_SLEEP)


def main(config: ClusterWriterConfig) -> None:
    db = ZODB.DB(zodbsql.open_storage(config.url))
    counts = {"conflicts": 0, "other": 0}
    try:
        tm = transaction.TransactionManager(explicit=True)
        conn = db.open(tm)
        log = AckLog(config.log)
        say("ready")
        done = 0
        for number in range(config.commits):
            if config.stop_file and os.path.exists(config.stop_file):
                break
            commit_one(tm, conn, f"{config.name}-{number:05d}", number, log, counts)
            done += 1
            if done % 10 == 0:
                say("progress", done)
        say("done", done, counts["conflicts"], counts["other"])
        conn.close()
    finally:
        db.close()


if __name__ == "__main__":
    main(ClusterWriterConfig(**json.loads(sys.argv[1])))
