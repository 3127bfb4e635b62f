"""The storage's own checks, run by ``zodbsql doctor`` in a scratch database.

Store and load, a resolved and an unresolved conflict between two connections, and a
pack with garbage collection: what a site needs from its storage, on the real server.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import transaction
import ZODB
from BTrees.Length import Length
from persistent.mapping import PersistentMapping
from ZODB.POSException import ConflictError

from zodbsql.backends.base.contract import ERROR, OK, BackendOptions, Finding
from zodbsql.options import Options
from zodbsql.storage.storage import SQLStorage


def run_checks(backend_options: BackendOptions, options: Options) -> list[Finding]:
    backend = backend_options.create_backend(options.keep_history, options.commit_lock_timeout)
    db = ZODB.DB(SQLStorage(backend, options.replace(read_only=False, create_schema=True)))
    try:
        return [_check(name, check, db) for name, check in CHECKS]
    finally:
        db.close()


def _check(name: str, check: Callable[[Any], str], db: Any) -> Finding:
    try:
        return Finding(OK, f"check: {name}", check(db))
    except Exception as exc:  # report, don't stop: the other checks still tell something
        return Finding(ERROR, f"check: {name}", f"{type(exc).__name__}: {exc}",
                       "see the error; the storage can't work on this database as it is")


def _store_and_load(db: Any) -> str:
    with db.transaction() as conn:
        conn.root()["data"] = PersistentMapping(payload=b"x" * 100_000)
    other = db.open(transaction.TransactionManager())
    try:
        assert other.root()["data"]["payload"] == b"x" * 100_000
    finally:
        other.close()
    return "a 100 kB object written and read back by another connection"


def _conflicts(db: Any) -> str:
    with db.transaction() as conn:
        conn.root()["counter"] = Length()
        conn.root()["plain"] = PersistentMapping(n=0)
    tm1, tm2 = transaction.TransactionManager(), transaction.TransactionManager()
    c1, c2 = db.open(tm1), db.open(tm2)
    try:
        for conn in (c1, c2):
            conn.root()["counter"].change(1)
            conn.root()["plain"]["n"] += 1
        tm1.commit()
        try:
            tm2.commit()
            raise AssertionError("a conflicting commit was accepted")
        except ConflictError:
            tm2.abort()
        c2.root()["counter"].change(1)
        tm2.commit()  # the resolvable one goes through on its own
        tm1.begin()
        assert c1.root()["counter"].value == 2
    finally:
        c1.close()
        c2.close()
    return "a conflict was detected and a resolvable one resolved"


def _pack(db: Any) -> str:
    with db.transaction() as conn:
        conn.root()["garbage"] = PersistentMapping(x=1)
    with db.transaction() as conn:
        del conn.root()["garbage"]
    before = len(db.storage)
    db.pack(time.time() + 1)
    after = len(db.storage)
    assert after < before, f"pack left {after} of {before} objects"
    return f"pack removed {before - after} unreachable object(s)"


CHECKS: list[tuple[str, Callable[[Any], str]]] = [
    ("store and load", _store_and_load),
    ("conflicts", _conflicts),
    ("pack", _pack),
]
