"""A writer process: transfers between accounts until stopped or killed.

Run as ``python -m tests.fault.writer CONFIG_JSON`` (see ``WriterConfig``).  After each
commit that returned, it appends ``ack <id>`` to its log and fsyncs, so the parent knows
every acknowledged transfer even after a SIGKILL.  A commit that fails with a
TransientError is retried (what ``transaction``'s ``attempts()`` and Zope do); any other
error from the commit is an unknown outcome: logged as ``unknown <id>`` and not retried.
Errors before the commit (reconnecting to a server that is down) are retried.

``phase`` arms a hook (``tests.fault.phases``): at its ``at``-th passage the writer prints
``phase NAME`` and sleeps, for the parent to kill it right there.  ``pack_after`` runs a
pack after that many transfers (with the pack hooks armed when ``phase`` is ``pack``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
import time
from typing import Any

import transaction
import ZODB
from transaction.interfaces import TransientError

import zodbsql
from tests.fault import bank, phases

RETRY_SLEEP = 0.05


@dataclasses.dataclass
class WriterConfig:
    url: str
    log: str
    name: str = "w"
    accounts: int = 10
    transfers: int = 0            # 0: until the stop file appears (or the kill)
    stop_file: str = ""
    phase: str = ""
    at: int = 1
    hold: float = 60.0
    blob_size: int = 0
    blob_dir: str = ""
    garbage: bool = False
    pack_after: int = 0
    seed: int = 0


class AckLog:
    """The transfers whose commit returned, durable before the next one starts."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, kind: str, transfer_id: str) -> None:
        os.write(self.fd, f"{kind} {transfer_id}\n".encode())
        os.fsync(self.fd)


def read_log(path: str) -> tuple[set[str], set[str]]:
    """``(acknowledged, unknown outcome)`` transfer ids; a torn last line is ignored."""
    acked: set[str] = set()
    unknown: set[str] = set()
    try:
        text = open(path).read()
    except FileNotFoundError:
        return acked, unknown
    for line in text.split("\n")[:-1]:
        kind, _, transfer_id = line.partition(" ")
        (acked if kind == "ack" else unknown).add(transfer_id)
    return acked, unknown


def say(*words: Any) -> None:
    print(*words, flush=True)


def transfer_once(tm: transaction.TransactionManager, conn: Any, move: bank.Transfer,
                  config: WriterConfig, log: AckLog) -> None:
    """Commit one transfer: retried while the error says nothing was committed."""
    while True:
        try:
            tm.begin()
            move.apply(conn.root(), config.blob_size, config.garbage)
        except Exception:
            tm.abort()  # nothing sent for commit yet (a server down, a reconnect)
            time.sleep(RETRY_SLEEP)
            continue
        try:
            tm.commit()
        except TransientError:
            tm.abort()
            time.sleep(RETRY_SLEEP)
            continue
        except Exception as exc:
            tm.abort()
            log.write("unknown", move.id)
            say("unknown", move.id, type(exc).__name__)
            return
        log.write("ack", move.id)
        return


def run(config: WriterConfig) -> None:
    options: dict[str, Any] = {}
    if config.blob_dir:
        options = {"blob_dir": config.blob_dir, "blob_chunk_size": 16384}
    storage = zodbsql.open_storage(config.url, **options)
    if config.phase:
        phases.arm(storage, config.phase, config.at, config.hold, say)
    db = ZODB.DB(storage)
    tm = transaction.TransactionManager(explicit=True)
    conn = db.open(tm)
    log = AckLog(config.log)
    rng = random.Random(config.seed)
    say("ready")
    number = 0
    while config.transfers == 0 or number < config.transfers:
        if config.stop_file and os.path.exists(config.stop_file):
            break
        number += 1
        move = bank.Transfer.random(f"{config.name}-{config.seed}-{number}",
                                    config.accounts, rng)
        transfer_once(tm, conn, move, config, log)
        if number == config.pack_after:
            say("packing")
            db.pack(time.time())
    say("done", number)
    conn.close()
    db.close()


def main(argv: list[str]) -> None:
    run(WriterConfig(**json.loads(argv[1])))


if __name__ == "__main__":
    main(sys.argv)
