"""A writer process: transfers between accounts until stopped or killed.

Run as ``python -m tests.fault.writer CONFIG_JSON`` (see ``WriterConfig``).  After each
commit that returned, it appends ``ack <id>`` to its log and fsyncs, so the parent knows
every acknowledged transfer even after a SIGKILL.  A commit that fails with a
TransientError is retried (what ``transaction``'s ``attempts()`` and Zope do), and unless
it is a conflict, logged as ``retried <id> <error>``; any other error from the commit is an unknown outcome:
logged as ``unknown <id>`` and not retried.
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
import resource
import signal
import sys
import time
import traceback
from typing import Any

import transaction
import ZODB
from BTrees.OOBTree import OOBTree
from transaction.interfaces import TransientError
from ZODB.POSException import ConflictError

import zodbsql
from tests.fault import bank, phases

RETRY_SLEEP = 0.05
#: Attempts at one transfer before the writer gives up (a server down for a minute).
MAX_ATTEMPTS = 1200


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
    filler: int = 0               # bytes stored with each transfer (to fill a disk)
    file_size_limit: int = 0      # RLIMIT_FSIZE of the writer, in bytes (0: none)
    stop_on_error: bool = False   # end at the first commit error, describing it


class AckLog:
    """The transfers whose commit returned, durable before the next one starts."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, kind: str, transfer_id: str, detail: str = "") -> None:
        os.write(self.fd, f"{kind} {transfer_id} {detail}".rstrip().encode() + b"\n")
        os.fsync(self.fd)


def read_log(path: str) -> dict[str, dict[str, str]]:
    """kind (``ack``, ``unknown``, ``retried``) -> transfer id -> detail; a torn last
    line is ignored."""
    entries: dict[str, dict[str, str]] = {"ack": {}, "unknown": {}, "retried": {}}
    try:
        text = open(path).read()
    except FileNotFoundError:
        return entries
    for line in text.split("\n")[:-1]:
        kind, transfer_id, detail = (line.split(" ", 2) + [""])[:3]
        entries[kind][transfer_id] = detail
    return entries


def say(*words: Any) -> None:
    print(*words, flush=True)


def describe(exc: BaseException) -> str:
    """An error as one JSON line: its class (with bases), message and traceback."""
    return json.dumps({
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "bases": [f"{k.__module__}.{k.__qualname__}" for k in type(exc).__mro__],
        "message": str(exc),
        "retryable": isinstance(exc, TransientError),
        "traceback": "".join(traceback.format_exception(exc)),
    })


def transfer_once(tm: transaction.TransactionManager, conn: Any, move: bank.Transfer,
                  config: WriterConfig, log: AckLog) -> bool:
    """Commit one transfer: retried while the error says nothing was committed.
    False when it ended in an unknown outcome (or, with ``stop_on_error``, any error
    from the commit, announced as ``failed ID JSON``)."""
    for attempt in range(MAX_ATTEMPTS):
        try:
            tm.begin()
            move.apply(conn.root(), config.blob_size, config.garbage)
            if config.filler:
                conn.root().setdefault("filler", OOBTree())[move.id] = b"f" * config.filler
        except Exception:
            tm.abort()  # nothing sent for commit yet (a server down, a reconnect)
            if attempt == MAX_ATTEMPTS - 1:
                raise
            time.sleep(RETRY_SLEEP)
            continue
        try:
            tm.commit()
        except Exception as exc:
            tm.abort()
            retryable = isinstance(exc, TransientError)
            if not retryable:
                # The error on one line, so that a failing test can say what it was.
                summary = " ".join(f"{type(exc).__name__}: {exc}".split())
                log.write("unknown", move.id, summary)
            elif not isinstance(exc, ConflictError):
                # Conflicts are found at vote; any other error may have hit the COMMIT.
                log.write("retried", move.id, type(exc).__name__)
            if config.stop_on_error:
                say("failed", move.id, describe(exc))
                return False
            if not retryable:
                say("unknown", move.id, type(exc).__name__)
                return False
            time.sleep(RETRY_SLEEP)
            continue
        log.write("ack", move.id)
        return True
    raise RuntimeError(f"transfer {move.id}: no commit after {MAX_ATTEMPTS} attempts")


def run(config: WriterConfig) -> None:
    if config.file_size_limit:
        # A write past the limit fails with EFBIG instead of killing the process.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE,
                           (config.file_size_limit, config.file_size_limit))
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
        if not transfer_once(tm, conn, move, config, log) and config.stop_on_error:
            break
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
