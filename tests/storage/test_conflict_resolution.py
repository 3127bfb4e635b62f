"""Write conflicts that the objects resolve (``_p_resolveConflict``) commit the merged
states: what the second commit stores is the resolution, its references are those of
the resolution (a pack keeps what only the merged state links), and the committed
state it merged with is read from the cache or, in another process's instance, from
the database.  (ZODB's ``checkResolve`` is not collected: only its unresolvable
variants run in the conformance suite.)
"""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import transaction
import ZODB
from persistent import Persistent
from persistent.mapping import PersistentMapping
from ZODB.POSException import ConflictError, POSKeyError
from ZODB.serialize import referencesf

from zodbsql.errors import CommitLockTimeout

TALLIES = 3     # conflicts resolved in one commit


class Tally(Persistent):
    """A count and a list of children that concurrent commits both add to."""

    def __init__(self) -> None:
        self.count = 0
        self.children: list[Any] = []

    def _p_resolveConflict(self, old: dict[str, Any], committed: dict[str, Any],
                           new: dict[str, Any]) -> dict[str, Any]:
        merged = dict(committed)
        merged["count"] = committed["count"] + new["count"] - old["count"]
        merged["children"] = (list(committed["children"])
                              + list(new["children"][len(old["children"]):]))
        return merged


def _add(tm: Any, conn: Any, label: str) -> None:
    for n in range(TALLIES):
        tally = conn.root()[f"t{n}"]
        tally.count += 1
        tally.children = tally.children + [PersistentMapping(label=f"{label}{n}")]
    tm.commit()


@pytest.mark.parametrize("where", ["one instance", "two storages", "no cache"])
def test_resolved_states_are_what_is_stored(storage_factory: Any, where: str) -> None:
    """B commits over A's commit to the same objects; every merged state is stored."""
    options = {"cache_size_mb": 0} if where == "no cache" else {}
    db_a = ZODB.DB(storage_factory.open(**options))
    db_b = db_a if where == "one instance" else ZODB.DB(storage_factory.open(**options))
    try:
        with db_a.transaction() as conn:
            for n in range(TALLIES):
                conn.root()[f"t{n}"] = Tally()
        tm_a, tm_b = transaction.TransactionManager(), transaction.TransactionManager()
        conn_a, conn_b = db_a.open(tm_a), db_b.open(tm_b)
        for n in range(TALLIES):        # B's snapshot: before A's commit
            assert conn_b.root()[f"t{n}"].count == 0
        _add(tm_a, conn_a, "a")
        _add(tm_b, conn_b, "b")         # conflicts on every tally, all resolved
        conn_a.close()
        conn_b.close()

        check = ZODB.DB(storage_factory.open(cache_size_mb=0))
        try:
            with check.transaction() as conn:
                children = []
                for n in range(TALLIES):
                    tally = conn.root()[f"t{n}"]
                    assert tally.count == 2
                    assert [c["label"] for c in tally.children] == [f"a{n}", f"b{n}"]
                    children += [c._p_oid for c in tally.children]
            # The references stored are the merged state's: "a" children are linked by
            # B's resolution only (B's own state did not refer to them).
            check.storage.pack(time.time(), referencesf)
            for oid in children:
                check.storage.load(oid)        # POSKeyError if the pack deleted it
        finally:
            check.close()
    finally:
        db_a.close()
        if db_b is not db_a:
            db_b.close()


def test_an_unresolvable_conflict_among_resolved_ones_stores_nothing(
        storage_factory: Any) -> None:
    db = ZODB.DB(storage_factory.open())
    try:
        with db.transaction() as conn:
            conn.root()["t"] = Tally()
            conn.root()["plain"] = PersistentMapping(v=0)
        tm_a, tm_b = transaction.TransactionManager(), transaction.TransactionManager()
        conn_a, conn_b = db.open(tm_a), db.open(tm_b)
        assert conn_b.root()["t"].count == 0 and conn_b.root()["plain"]["v"] == 0
        read = conn_b.root()["plain"]._p_serial
        conn_a.root()["t"].count += 1
        conn_a.root()["plain"]["v"] = 1
        tm_a.commit()
        committed = conn_a.root()["plain"]._p_serial
        conn_b.root()["t"].count += 10
        conn_b.root()["plain"]["v"] = 2
        with pytest.raises(ConflictError) as info:
            tm_b.commit()
        # The serials ZODB reports: the committed revision, then the one B read.
        assert info.value.get_serials() == (committed, read)
        assert info.value.oid == conn_b.root()["plain"]._p_oid
        tm_b.abort()
        with db.transaction() as conn:
            assert conn.root()["t"].count == 1
            assert conn.root()["plain"]["v"] == 1
        conn_a.close()
        conn_b.close()
    finally:
        db.close()


HOLD = 1.0     # seconds the first commit keeps its locks after its vote


class SlowVoter:
    """A data manager that votes last (after the storage has locked its rows), lets
    another commit start, and holds the transaction there for HOLD seconds."""

    def __init__(self, voted: threading.Event, waiting: list[Any]) -> None:
        self.voted = voted
        self.waiting = waiting

    def sortKey(self) -> str:
        return "~ last"

    def tpc_vote(self, txn: Any) -> None:
        self.voted.set()
        time.sleep(HOLD)
        self.waiting.append(list(self.waiting))     # what B had reported by then

    def abort(self, txn: Any) -> None: ...
    def tpc_begin(self, txn: Any) -> None: ...
    def commit(self, txn: Any) -> None: ...
    def tpc_finish(self, txn: Any) -> None: ...
    def tpc_abort(self, txn: Any) -> None: ...


@pytest.mark.parametrize("resolvable", [False, True])
def test_a_vote_waits_for_the_lock_then_meets_the_commit_it_waited_for(
        storage_factory: Any, resolvable: bool) -> None:
    """B votes on an object A has voted to change: B waits (well within its lock
    timeout) until A finishes, then sees A's commit: a ConflictError for a plain
    object, the merged state for one that resolves; never a lock timeout."""
    db = ZODB.DB(storage_factory.open())
    db_a = ZODB.DB(storage_factory.open(commit_lock_timeout=30))
    db_b = ZODB.DB(storage_factory.open(commit_lock_timeout=30, row_lock_timeout=30))
    try:
        with db.transaction() as conn:
            conn.root()["x"] = Tally() if resolvable else PersistentMapping(count=0)
        tm_a, tm_b = transaction.TransactionManager(), transaction.TransactionManager()
        conn_a, conn_b = db_a.open(tm_a), db_b.open(tm_b)
        for conn in (conn_a, conn_b):
            x = conn.root()["x"]
            if resolvable:
                x.count += 1
            else:
                x["count"] += 1
        voted = threading.Event()
        outcome: list[Any] = []

        def commit_b() -> None:
            voted.wait(30)
            try:
                tm_b.commit()
                outcome.append("committed")
            except Exception as exc:           # checked below, in the test's thread
                outcome.append(exc)
                tm_b.abort()
        thread = threading.Thread(target=commit_b)
        thread.start()
        tm_a.get().join(SlowVoter(voted, outcome))
        started = time.monotonic()
        tm_a.commit()
        thread.join(60)
        assert outcome[0] == []                # B was still waiting when A finished
        assert time.monotonic() - started >= HOLD
        if resolvable:
            assert outcome[1:] == ["committed"]
        else:
            assert len(outcome) == 2 and isinstance(outcome[1], ConflictError), outcome
            assert not isinstance(outcome[1], CommitLockTimeout), outcome
        check = ZODB.DB(storage_factory.open(cache_size_mb=0))
        with check.transaction() as conn:
            x = conn.root()["x"]
            assert (x.count if resolvable else x["count"]) == (2 if resolvable else 1)
        check.close()
        conn_a.close()
        conn_b.close()
    finally:
        db.close()
        db_a.close()
        db_b.close()


def resolved_conflict(db_a: Any, db_b: Any, b_adds: int) -> tuple[Any, Any, Tally, bytes]:
    """A Tally made; B reads it, A adds 1 and commits, B adds ``b_adds`` and commits:
    a conflict the resolution merges.  Both connections (open), B's tally and the
    serial B read."""
    with db_a.transaction() as conn:
        conn.root()["t"] = Tally()
    tm_a, tm_b = transaction.TransactionManager(), transaction.TransactionManager()
    conn_a, conn_b = db_a.open(tm_a), db_b.open(tm_b)
    tally_b = conn_b.root()["t"]
    assert tally_b.count == 0           # loaded: its serial is the revision B read
    read = tally_b._p_serial
    conn_a.root()["t"].count += 1
    tm_a.commit()
    tally_b.count += b_adds
    tm_b.commit()                       # resolved with the revision B read
    assert tally_b.count == 1 + b_adds  # what was stored, not B's own
    return conn_a, conn_b, tally_b, read


def test_after_a_resolution_load_serial_asks_the_database_again(
        storage_factory: Any) -> None:
    """During a resolution ``loadSerial`` may answer from the cache (the revision the
    transaction read); afterwards it asks the database, so a revision the database no
    longer holds (packed away; history-free, replaced at once) is not served from the
    cache that still holds it."""
    db = ZODB.DB(storage_factory.open())
    try:
        conn_a, conn_b, tally_b, read = resolved_conflict(db, db, 10)
        oid = tally_b._p_oid
        storage = conn_b._storage
        if storage_factory.param.keep_history:
            assert storage.loadSerial(oid, read)    # not packed yet
            db.storage.pack(time.time(), referencesf)
        with pytest.raises(POSKeyError):
            storage.loadSerial(oid, read)
        conn_a.close()
        conn_b.close()
    finally:
        db.close()
