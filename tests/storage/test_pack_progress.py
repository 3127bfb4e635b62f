"""What a pack reports while it works, how it paces itself, and what it leaves of history.

``progress(phase, done)`` is what ``zodbsql pack`` draws its progress bars from: one
call per walk generation and per batch, ``done`` counting up within each phase.  The
duty cycle (``--duty-cycle``) makes the pack sleep between its locked steps so that
writers get the database for ``1 - duty`` of the time.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any, Iterator

import pytest
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.blob import Blob
from ZODB.POSException import POSKeyError, StorageError

from tests.storage.packing import assert_gone, pause, time_between
from zodbsql.storage import pack

GARBAGE = 5


def _chain_and_garbage(db: Any) -> list[bytes]:
    """root -> a -> b -> c (three generations to walk), ``a`` and ``b`` changed once, and
    ``GARBAGE`` objects linked from the root and then unlinked; returns their oids."""
    with db.transaction() as conn:
        root = conn.root()
        root["a"] = PersistentMapping(b=PersistentMapping(c=PersistentMapping()))
        for i in range(GARBAGE):
            root[i] = PersistentMapping(v=i)
    with db.transaction() as conn:
        root = conn.root()
        garbage = [root[i]._p_oid for i in range(GARBAGE)]
        for i in range(GARBAGE):
            del root[i]
        root["a"]["v"] = "changed"
        root["a"]["b"]["v"] = "changed"
    return garbage


@pytest.fixture
def chained(storage_factory: Any) -> Iterator[tuple[Any, Any, list[bytes]]]:
    """A storage, its DB and the garbage oids of ``_chain_and_garbage``."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        yield storage, db, _chain_and_garbage(db)
    finally:
        db.close()


def _pack_now(storage: Any, **options: Any) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """Pack in batches of two; return the counts and every progress report."""
    reports: list[tuple[str, int]] = []
    counts = pack.pack(storage, time.time(), batch_size=2,
                       progress=lambda phase, done: reports.append((phase, done)), **options)
    return counts, reports


WALK = [("walk", 1), ("walk", 2), ("walk", 3)]


def test_progress_counts_generations_and_batches(chained: Any, storage_factory: Any) -> None:
    storage, db, garbage = chained
    counts, reports = _pack_now(storage)
    gc = [("gc", 2), ("gc", 4), ("gc", 5)]
    if storage_factory.param.keep_history:
        # Root (created by ZODB.DB, then changed twice), a and b have old revisions.
        assert counts == {"garbage": GARBAGE, "old_revisions": 4}
        assert reports == WALK + gc + [("history", 2), ("history", 3)]
    else:
        assert counts == {"garbage": GARBAGE, "old_revisions": 0}
        assert reports == WALK + gc
    assert_gone(storage, garbage)
    with db.transaction() as conn:
        assert conn.root()["a"]["b"]["c"] == {}


def test_dry_run_reports_the_walk_and_removes_nothing(chained: Any) -> None:
    storage, _, garbage = chained
    counts, reports = _pack_now(storage, dry_run=True)
    assert counts["garbage"] == GARBAGE
    assert reports == WALK
    for oid in garbage:
        assert storage.load(oid)[0]


def test_no_gc_keeps_unreachable_objects(chained: Any, storage_factory: Any) -> None:
    storage, _, garbage = chained
    counts, reports = _pack_now(storage, gc=False)
    if storage_factory.param.keep_history:
        assert counts == {"garbage": 0, "old_revisions": 4}
        assert reports == [("history", 2), ("history", 3)]
    else:
        assert counts == {"garbage": 0, "old_revisions": 0}
        assert reports == []
    for oid in garbage:
        assert storage.load(oid)[0]


@contextlib.contextmanager
def _blob_db(storage_factory: Any, tmp_path: Any,
             shared: bool = False) -> Iterator[tuple[Any, Any]]:
    storage = storage_factory.open(blob_dir=str(tmp_path / "blobs"), shared_blob_dir=shared)
    db = ZODB.DB(storage)
    try:
        yield storage, db
    finally:
        db.close()


@pytest.mark.parametrize("shared", [False, True], ids=["in-database", "shared-dir"])
def test_freed_blobs_are_counted_in_batches(storage_factory: Any, tmp_path: Any,
                                            shared: bool) -> None:
    """In the database the contents no object uses are freed (and counted); in a shared
    blob directory, the files of the revisions pack removed (in-database, committed()
    names a file of the local cache, which pack leaves to the cache's pruning)."""
    with _blob_db(storage_factory, tmp_path, shared) as (storage, db):
        with db.transaction() as conn:
            for i in range(3):
                conn.root()[i] = Blob(b"content %d" % i)
        with db.transaction() as conn:
            oids = [conn.root()[i]._p_oid for i in range(3)]
            files = [conn.root()[i].committed() for i in range(3)]
            for i in range(3):
                del conn.root()[i]
        _, reports = _pack_now(storage)
        blobs = [r for r in reports if r[0] == "blobs"]
        assert blobs == ([] if shared else [("blobs", 2), ("blobs", 3)])
        if shared:
            assert [path for path in files if os.path.exists(path)] == []
        for oid in oids:
            with pytest.raises(POSKeyError):
                storage.loadBlob(oid, storage.lastTransaction())


def test_pack_without_gc_frees_replaced_blob_contents(storage_factory: Any,
                                                      tmp_path: Any) -> None:
    """A blob written again leaves its old content unused once the old revision is gone
    (history-free: at once): a pack without gc frees it, a dry run does not."""
    with _blob_db(storage_factory, tmp_path) as (storage, db):
        with db.transaction() as conn:
            conn.root()["b"] = Blob(b"old content")
        with db.transaction() as conn:
            with conn.root()["b"].open("w") as f:
                f.write(b"new content")
        _, reports = _pack_now(storage, gc=False, dry_run=True)
        assert [r for r in reports if r[0] == "blobs"] == []
        _, reports = _pack_now(storage, gc=False)
        assert [r for r in reports if r[0] == "blobs"] == [("blobs", 1)]
        with db.transaction() as conn:
            with conn.root()["b"].open() as f:
                assert f.read() == b"new content"


def test_a_second_pack_while_one_runs_is_refused(chained: Any) -> None:
    storage, _, _ = chained
    outcome: list[str] = []

    def pack_again(phase: str, done: int) -> None:
        if outcome:
            return

        def attempt() -> None:
            try:
                pack.pack(storage, time.time())
            except StorageError as exc:
                outcome.append(str(exc))
        thread = threading.Thread(target=attempt, daemon=True)
        thread.start()
        thread.join(10)
        outcome.append("still waiting" if thread.is_alive() else "returned")
    pack.pack(storage, time.time(), progress=pack_again)
    assert outcome == ["a pack of this storage is already running", "returned"]


class _Clock:
    """Pack's clock in a test: every reading is one second after the previous one, and
    sleeps are recorded instead of slept."""

    gmtime = staticmethod(time.gmtime)

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


@pytest.mark.parametrize("duty", [0.25, 1.0])
def test_duty_cycle_sleeps_in_proportion_to_each_locked_step(
        chained: Any, monkeypatch: pytest.MonkeyPatch, duty: float) -> None:
    """Each locked step here takes one (fake) second; with duty D the pack then sleeps
    (1 - D) / D seconds, and not at all with D = 1."""
    storage, _, _ = chained
    clock = _Clock()
    monkeypatch.setattr(pack, "time", clock)
    _, reports = _pack_now(storage, duty_cycle=duty)
    batches = len([r for r in reports if r[0] != "walk"])
    # Raising the floor of the deletion records (none to prune in a first pack), every
    # batch, then marking the pack done and freeing blob contents.
    assert clock.slept == ([] if duty == 1.0 else [3.0] * (batches + 3))


class TestPackedHistory:
    history_modes = (True,)
    history_modes_reason = "a history-free storage keeps no transactions to mark as packed"

    def test_iterator_marks_packed_transactions_and_drops_emptied_ones(
            self, storage_factory: Any) -> None:
        storage = storage_factory.open()
        db = ZODB.DB(storage)
        try:
            with db.transaction() as conn:
                conn.root()["x"] = PersistentMapping(v=1)
            emptied = storage.lastTransaction()       # only x's first revision
            with db.transaction() as conn:
                conn.root()["x"]["v"] = 2
                conn.root()["y"] = 1
            kept = storage.lastTransaction()          # x's and root's current revision
            pause()
            with db.transaction() as conn:
                conn.root()["x"]["v"] = 3
            later = storage.lastTransaction()
            pack.pack(storage, time_between(kept, later))
            status = {txn.tid: txn.status for txn in storage.iterator()}
            assert emptied not in status
            assert status[kept] == "p" and status[later] == " "
            assert [entry["id"] for entry in db.undoLog(0, 10)] == [later]
        finally:
            db.close()
