"""Pack removes exactly the garbage, in batches and while other connections commit.

* An object unreachable at the pack time that a later transaction links again survives.
* A batched pack removes every unreachable object, those at batch edges too, and keeps
  every reachable one (and, history-preserving, only each one's current revision).
* A commit made while the pack runs (between the walk and the deletions, or between two
  batches) that links a garbage object again, or writes it, keeps it; so does a commit
  that has voted and not yet finished when a batch would delete the object, also
  when it votes between the pack's search and its batch.
* Garbage written by the pack tid's own transaction goes, a commit during the walk
  notwithstanding; history-preserving, the pack tid's transaction is marked packed,
  only the transactions the pack emptied go, and an object an undo brings back after
  the pack's search stays (the batch re-checks under the commit lock).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.Connection import TransactionMetaData
from ZODB.serialize import referencesf
from ZODB.utils import p64, u64, z64

from tests.storage.packing import assert_gone, pause, time_between
from zodbsql.errors import CommitLockTimeout
from zodbsql.storage import pack


def _open_db(storage_factory: Any, **options: Any) -> tuple[Any, Any]:
    storage = storage_factory.open(**options)
    return storage, ZODB.DB(storage)


def _after_first_search(monkeypatch: pytest.MonkeyPatch, storage: Any, name: str,
                        action: Callable[[], None]) -> list[list[int]]:
    """Wrap the packer's search ``name`` (``next_deleted``, ``next_garbage``) so that
    ``action`` runs right after its first answer, before the batch that answer feeds;
    the answers, in the list returned."""
    packer = storage.shared.backend.packer
    search = getattr(packer, name)
    found: list[list[int]] = []

    def searched(conn: Any, after: int, limit: int) -> list[int]:
        found.append(search(conn, after, limit))
        if len(found) == 1:
            action()
        return found[-1]
    monkeypatch.setattr(packer, name, searched)
    return found


def _unlinked(tm: Any, root: Any, value: str) -> tuple[PersistentMapping, bytes]:
    """An object the root links, then unlinks (the connection still holds it), and
    the tid of the unlinking transaction."""
    root["g"] = PersistentMapping(v=value)
    tm.commit()
    g = root["g"]
    del root["g"]
    tm.commit()
    return g, root._p_serial


@pytest.mark.parametrize("via", ["root", "new-object"])
def test_object_linked_again_after_the_pack_time_survives(storage_factory: Any,
                                                           via: str) -> None:
    storage, db = _open_db(storage_factory)
    try:
        tm = transaction.TransactionManager()
        conn = db.open(tm)
        root = conn.root()
        g, unlinked = _unlinked(tm, root, "garbage for a while")
        pause()
        if via == "root":
            root["again"] = g      # the connection still holds g: it links it again
        else:
            root["again"] = PersistentMapping(g=g)
        tm.commit()
        linked = root._p_serial
        storage.pack(time_between(unlinked, linked), referencesf)
        assert storage.load(g._p_oid)[1] == g._p_serial
        check = db.open(transaction.TransactionManager())
        again = check.root()["again"]
        assert (again if via == "root" else again["g"])["v"] == "garbage for a while"
        check.close()
        conn.close()
    finally:
        db.close()


def test_batched_pack_removes_every_unreachable_object(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every unreachable object goes, those at batch edges too, every reachable one
    stays; with no commit during the pack no batch is re-checked: the rescue before
    each reaches nothing, so its candidates are still garbage (a batch's re-check after
    a commit that links garbage again: the tests below)."""
    storage, db = _open_db(storage_factory)
    try:
        with db.transaction() as conn:
            for i in range(30):
                conn.root()[i] = PersistentMapping(v=i)
        with db.transaction() as conn:
            root = conn.root()
            oids = {i: root[i]._p_oid for i in range(30)}
            # Consecutive garbage oids: with batches of 3 every batch edge is garbage.
            garbage = [oids[i] for i in range(30) if i % 3 != 1]
            live = {oids[i]: i for i in range(30) if i % 3 == 1}
            for i in range(30):
                if i % 3 != 1:
                    del root[i]
                else:
                    root[i]["v"] = -i     # an old revision for the pack to remove
        packer = storage.shared.backend.packer
        rechecked: list[int] = []
        unreached = packer.unreached

        def counted(conn: Any, oids: Sequence[int]) -> list[int]:
            rechecked.append(len(oids))
            return unreached(conn, oids)
        monkeypatch.setattr(packer, "unreached", counted)
        counts = pack.pack(storage, time.time(), batch_size=3)
        assert counts["garbage"] == len(garbage) == 20
        assert rechecked == []
        assert_gone(storage, garbage)
        assert len(storage) == 1 + len(live)
        with db.transaction() as conn:
            assert {conn.root()[i]._p_oid: conn.root()[i]["v"] for i in live.values()} == {
                oid: -i for oid, i in live.items()}
        for oid in live:
            # History-preserving too, only the current revision is left.
            assert [h["tid"] for h in storage.history(oid, 10)] == [storage.load(oid)[1]]
    finally:
        db.close()


class TestPackedTransactions:
    history_modes = (True,)
    history_modes_reason = "a history-free database keeps no transactions to list"

    def test_the_pack_tids_transaction_cannot_be_undone_after(self, storage_factory: Any) -> None:
        """A pack to the last transaction packs that transaction too: the iterator
        marks it packed, and the undo log lists nothing (its object's revision before
        is gone)."""
        storage, db = _open_db(storage_factory)
        try:
            with db.transaction() as conn:
                conn.root()["o"] = PersistentMapping(v=1)
            added = storage.lastTransaction()
            with db.transaction() as conn:
                conn.root()["o"]["v"] = 2
            changed = storage.lastTransaction()
            assert len(storage.undoLog(0, 10)) == 3
            pause()
            pack.pack(storage, time.time())
            assert storage.undoLog(0, 10) == []
            assert [(t.tid, t.status) for t in storage.iterator()] == [
                (added, "p"), (changed, "p")]
        finally:
            db.close()

    def test_only_the_transactions_a_pack_emptied_go(self, storage_factory: Any) -> None:
        """``g``, unlinked, is written alone by the last transaction, and a pack goes
        to that transaction: it deletes ``g`` and every transaction it left without a
        revision, the pack tid's among them.  An empty transaction made after that,
        and a second pack to a time before it: the empty transaction stays, in the
        undo log and the iterator."""
        storage, db = _open_db(storage_factory)
        try:
            tm = transaction.TransactionManager()
            conn = db.open(tm)
            root = conn.root()
            g, unlinked = _unlinked(tm, root, "garbage")
            g["v"] = "written alone, unlinked"
            tm.commit()
            written = g._p_serial
            assert storage.lastTransaction() == written
            pause()
            pack.pack(storage, time.time())
            assert_gone(storage, [g._p_oid])
            assert [t.tid for t in storage.iterator()] == [unlinked]
            pause()
            empty = TransactionMetaData(description="empty, after the pack time")
            storage.tpc_begin(empty)
            storage.tpc_vote(empty)
            storage.tpc_finish(empty)
            after = storage.lastTransaction()
            pack.pack(storage, time_between(written, after))
            assert [t.tid for t in storage.iterator()] == [unlinked, after]
            assert [u["description"] for u in storage.undoLog(0, 10)] == [
                b"empty, after the pack time"]
            conn.close()
        finally:
            db.close()


class TestBatchedPackOfDeletedObjects:
    history_modes = (True,)
    history_modes_reason = (
        "a history-free deleteObject removes the object at once; only a history-preserving"
        " pack removes objects left with nothing but a deletion")

    def test_every_deleted_object_goes(self, storage_factory: Any) -> None:
        storage, db = _open_db(storage_factory)
        try:
            with db.transaction() as conn:
                for i in range(7):
                    conn.root()[i] = PersistentMapping(v=i)
            with db.transaction() as conn:
                oids = [conn.root()[i]._p_oid for i in range(7)]
                for i in range(7):
                    del conn.root()[i]
            txn = TransactionMetaData()
            storage.tpc_begin(txn)
            for oid in oids:
                storage.deleteObject(oid, storage.load(oid)[1], txn)
            storage.tpc_vote(txn)
            storage.tpc_finish(txn)
            reports: list[tuple[str, int]] = []
            pack.pack(storage, time.time(), gc=False, batch_size=2,
                      progress=lambda phase, done: reports.append((phase, done)))
            assert [r for r in reports if r[0] == "deleted"] == [
                ("deleted", 2), ("deleted", 4), ("deleted", 6), ("deleted", 7)]
            assert_gone(storage, oids)
            assert len(storage) == 1
        finally:
            db.close()

    def test_objects_an_undo_brought_back_are_neither_counted_nor_deleted(
            self, storage_factory: Any) -> None:
        """Three objects deleted; an undo brings the first back before the pack time
        and another the second after it.  The pack's deleted phase finds only the
        third: its progress counts one object, and the two brought back load as they
        were.  (A search for candidates that took any deletion in an object's history,
        or one followed by a newer revision, counted them; the batch's re-check kept
        them.)"""
        storage, db = _open_db(storage_factory)
        try:
            names = ("before", "after", "gone")
            with db.transaction() as conn:
                for name in names:
                    conn.root()[name] = PersistentMapping(v=name)
            with db.transaction() as conn:
                oids = {name: conn.root()[name]._p_oid for name in names}
                for name in names:
                    del conn.root()[name]
            deletions = {}
            for name in names:
                txn = TransactionMetaData()
                storage.tpc_begin(txn)
                storage.deleteObject(oids[name], storage.load(oids[name])[1], txn)
                storage.tpc_vote(txn)
                storage.tpc_finish(txn)
                deletions[name] = storage.lastTransaction()
            undone = {}
            for name in ("before", "after"):
                pause()
                txn = TransactionMetaData()
                storage.tpc_begin(txn)
                storage.undo(deletions[name], txn)
                storage.tpc_vote(txn)
                storage.tpc_finish(txn)
                undone[name] = storage.lastTransaction()
            reports: list[tuple[str, int]] = []
            pack.pack(storage, time_between(undone["before"], undone["after"]), gc=False,
                      batch_size=10, progress=lambda phase, done: reports.append((phase, done)))
            assert [r for r in reports if r[0] == "deleted"] == [("deleted", 1)]
            assert_gone(storage, [oids["gone"]])
            check = db.open(transaction.TransactionManager())
            for name in ("before", "after"):
                assert storage.load(oids[name])[1] == undone[name]
                assert check.get(oids[name])["v"] == name
            check.close()
        finally:
            db.close()

    def test_an_object_an_undo_brings_back_after_the_search_stays(
            self, storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        """Two objects are left with nothing but a deletion.  The pack reads both as
        candidates; right after, before its batch takes the commit lock, an undo of the
        first one's deletion commits.  The batch re-checks under the lock and deletes
        only the second.  A re-check that missed the new revision deleted the object
        the undo brought back, that revision with it."""
        storage, db = _open_db(storage_factory)
        try:
            with db.transaction() as conn:
                conn.root()["back"] = PersistentMapping(v="brought back")
                conn.root()["gone"] = PersistentMapping(v="stays deleted")
            with db.transaction() as conn:
                back, gone = conn.root()["back"]._p_oid, conn.root()["gone"]._p_oid
                del conn.root()["back"], conn.root()["gone"]
            deletions = []
            for oid in (back, gone):
                txn = TransactionMetaData()
                storage.tpc_begin(txn)
                storage.deleteObject(oid, storage.load(oid)[1], txn)
                storage.tpc_vote(txn)
                storage.tpc_finish(txn)
                deletions.append(storage.lastTransaction())
            pause()

            def undo_the_first_deletion() -> None:
                undo = TransactionMetaData()
                storage.tpc_begin(undo)
                storage.undo(deletions[0], undo)
                storage.tpc_vote(undo)
                storage.tpc_finish(undo)
            found = _after_first_search(monkeypatch, storage, "next_deleted",
                                        undo_the_first_deletion)
            pack.pack(storage, time.time(), gc=False, batch_size=2)
            assert found[0] == [u64(back), u64(gone)]
            assert_gone(storage, [gone])
            assert storage.load(back)[1] == storage.lastTransaction() > deletions[1]
            check = db.open(transaction.TransactionManager())
            check.cacheMinimize()
            assert check.get(back)["v"] == "brought back"
            check.close()
        finally:
            db.close()


@pytest.mark.parametrize("phase", ["walk", "gc"])
@pytest.mark.parametrize("change", ["link", "write"])
def test_commit_during_pack_keeps_the_object_it_uses(storage_factory: Any, phase: str,
                                                     change: str) -> None:
    """During the pack (after the first step of ``phase``), a connection that still holds
    a garbage object links it from the root again (``link``) or changes it (``write``)."""
    storage, db = _open_db(storage_factory)
    try:
        tm = transaction.TransactionManager()
        conn = db.open(tm)
        root = conn.root()
        root["live"] = PersistentMapping(v="live")   # the walk has one generation to do
        root["first"] = PersistentMapping(v="deleted by the first batch")
        root["g"] = PersistentMapping(v="garbage")
        tm.commit()
        first, g = root["first"], root["g"]
        assert first._p_oid < g._p_oid               # g is in the second batch
        del root["first"], root["g"]
        tm.commit()
        pause()
        fired: list[str] = []

        def commit_once(step: str, done: int) -> None:
            if step != phase or fired:
                return
            fired.append(step)
            if change == "link":
                root["again"] = g
            else:
                g["v"] = "written during the pack"
            tm.commit()

        pack.pack(storage, time.time(), progress=commit_once, batch_size=1)
        assert fired == [phase]
        assert_gone(storage, [first._p_oid])
        state, serial = storage.load(g._p_oid)
        assert serial == g._p_serial
        check = db.open(transaction.TransactionManager())
        check.cacheMinimize()
        if change == "link":
            assert check.root()["again"]["v"] == "garbage"
        else:
            assert check.get(g._p_oid)["v"] == "written during the pack"
        check.close()
        conn.close()
    finally:
        db.close()


def test_commits_between_batches_keep_what_each_links_again(storage_factory: Any) -> None:
    """A commit after every other batch of a pack links a garbage object of a later
    batch again: each of those survives, the rest of the garbage goes."""
    storage, db = _open_db(storage_factory)
    try:
        tm = transaction.TransactionManager()
        conn = db.open(tm)
        root = conn.root()
        objects = [PersistentMapping(v=i) for i in range(8)]
        root.update(enumerate(objects))
        tm.commit()
        root.clear()
        tm.commit()
        pause()
        relinked: list[PersistentMapping] = []

        def commit_every_other(phase: str, done: int) -> None:
            if phase == "gc" and done % 2 == 1:
                relinked.append(objects[-1 - len(relinked)])
                root[f"again{len(relinked)}"] = relinked[-1]
                tm.commit()

        counts = pack.pack(storage, time.time(), progress=commit_every_other, batch_size=1)
        assert counts["garbage"] == 8 and len(relinked) >= 2
        kept = {o._p_oid for o in relinked}
        assert_gone(storage, [o._p_oid for o in objects if o._p_oid not in kept])
        check = db.open(transaction.TransactionManager())
        assert sorted(check.root()[f"again{i + 1}"]["v"] for i in range(len(relinked))) == \
            sorted(o["v"] for o in relinked)
        check.close()
        conn.close()
    finally:
        db.close()


def test_commit_during_pack_keeps_what_the_relinked_object_references(
        storage_factory: Any) -> None:
    """Garbage ``g -> child`` linked again during the gc phase: the child stays too, and
    the walk's progress only counts up (it goes on after the earlier generations)."""
    storage, db = _open_db(storage_factory)
    try:
        tm = transaction.TransactionManager()
        conn = db.open(tm)
        root = conn.root()
        root["live"] = PersistentMapping(inner=PersistentMapping(v="deep"))
        root["first"] = PersistentMapping(v="deleted by the first batch")
        root["g"] = PersistentMapping(child=PersistentMapping(v="child of garbage"))
        tm.commit()
        g, first = root["g"], root["first"]
        del root["g"], root["first"]
        tm.commit()
        pause()
        walked: list[int] = []

        def link_once(phase: str, done: int) -> None:
            if phase == "walk":
                walked.append(done)
            elif phase == "gc" and "again" not in root:
                root["again"] = g
                tm.commit()

        pack.pack(storage, time.time(), progress=link_once, batch_size=1)
        assert len(walked) > 2 and walked == sorted(set(walked))
        assert_gone(storage, [first._p_oid])
        check = db.open(transaction.TransactionManager())
        check.cacheMinimize()
        assert check.root()["again"]["child"]["v"] == "child of garbage"
        check.close()
        conn.close()
    finally:
        db.close()


def test_garbage_written_at_the_pack_tid_goes_despite_a_commit_during_the_walk(
        storage_factory: Any) -> None:
    """``g -> child`` is written by the very transaction that unlinks it, and the pack
    time is that transaction.  A commit during the walk that touches neither makes the
    pack look for what was committed since the walk began: that is after the pack tid,
    so ``g`` and its child still go (a rescue that also took the pack tid's own
    revisions kept both)."""
    storage, db = _open_db(storage_factory)
    try:
        tm = transaction.TransactionManager()
        conn = db.open(tm)
        root = conn.root()
        root["live"] = PersistentMapping(inner=PersistentMapping(v="deep"))
        root["g"] = PersistentMapping(child=PersistentMapping(v="child of garbage"))
        tm.commit()
        g = root["g"]
        child = g["child"]
        g["v"] = "written as it is unlinked"
        del root["g"]
        tm.commit()
        assert g._p_serial == root._p_serial == storage.lastTransaction()
        pause()
        fired: list[int] = []

        def commit_once(phase: str, done: int) -> None:
            if phase == "walk" and not fired:
                fired.append(done)
                root["live"]["v"] = "written during the walk"
                tm.commit()

        counts = pack.pack(storage, time.time(), progress=commit_once, batch_size=1)
        assert fired and counts["garbage"] == 2
        assert_gone(storage, [g._p_oid, child._p_oid])
        check = db.open(transaction.TransactionManager())
        check.cacheMinimize()
        assert check.root()["live"]["inner"]["v"] == "deep"
        assert check.root()["live"]["v"] == "written during the walk"
        check.close()
        conn.close()
    finally:
        db.close()


class DuringVote:
    """A data manager that votes after every ZODB connection of its transaction: when
    its ``tpc_vote`` runs, the connections' commits have voted and not finished."""

    def __init__(self, during_vote: Any) -> None:
        self.during_vote = during_vote

    def sortKey(self) -> str:
        return "~ after every storage"

    def tpc_vote(self, txn: Any) -> None:
        self.during_vote()

    def tpc_begin(self, txn: Any) -> None: ...
    def commit(self, txn: Any) -> None: ...
    def tpc_finish(self, txn: Any) -> None: ...
    def tpc_abort(self, txn: Any) -> None: ...
    def abort(self, txn: Any) -> None: ...


def _two_garbage(db: Any, value: str) -> tuple[Any, Any, PersistentMapping, PersistentMapping]:
    """Two objects the root linked and unlinked (``g`` with ``value``, and ``gone``),
    then a pause past their tid: a transaction manager, its open connection (which
    still holds them), and the two."""
    with db.transaction() as conn:
        conn.root()["g"] = PersistentMapping(v=value)
        conn.root()["gone"] = PersistentMapping(v="garbage too")
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    g, gone = conn.root()["g"], conn.root()["gone"]
    del conn.root()["g"], conn.root()["gone"]
    tm.commit()
    pause()
    return tm, conn, g, gone


@pytest.mark.parametrize("change", ["link", "write"])
def test_a_pack_waits_for_a_voted_commit_and_keeps_what_it_uses(storage_factory: Any,
                                                                 change: str) -> None:
    """A commit that has voted links a garbage object again (``link``) or writes it
    (``write``) while a pack starts.  Its new references become visible only when it
    finishes, so the pack's deleting batch waits for it (the pack gate on the servers,
    the write lock on SQLite) and then keeps the object; the rest of the garbage goes.
    A batch that went ahead deleted the object under the commit: a dangling reference."""
    storage, db = _open_db(storage_factory)
    try:
        tm, conn, g, gone = _two_garbage(db, "garbage")
        counts: dict[str, int] = {}
        errors: list[BaseException] = []

        def run_pack() -> None:
            try:
                counts.update(pack.pack(storage, time.time(), batch_size=1))
            except BaseException as exc:   # reported by the test below
                errors.append(exc)
        packing = threading.Thread(target=run_pack)
        waited: list[bool] = []

        def start_the_pack() -> None:
            packing.start()
            time.sleep(2.0)                 # time enough to delete, were it not held
            waited.append(packing.is_alive())

        if change == "link":
            conn.root()["again"] = g
        else:
            g["v"] = "written while the pack starts"
        tm.get().join(DuringVote(start_the_pack))
        tm.commit()
        packing.join(60)
        assert not errors and not packing.is_alive()
        assert waited == [True]             # the pack waited for the commit to finish
        assert counts["garbage"] >= 1
        assert_gone(storage, [gone._p_oid])
        assert storage.history(g._p_oid)    # in the database, not only in a cache
        check = db.open(transaction.TransactionManager())
        check.cacheMinimize()
        expected = "garbage" if change == "link" else "written while the pack starts"
        assert check.get(g._p_oid)["v"] == expected
        check.close()
        conn.close()
    finally:
        db.close()


def test_a_pack_deletes_only_under_the_commit_lock(storage_factory: Any) -> None:
    """The pack's deleting steps hold the commit lock (under which commits allocate
    tids and publish): while another session holds it, a pack waits commit-lock-timeout
    and fails, deleting nothing; then it packs."""
    storage, db = _open_db(storage_factory, commit_lock_timeout=1)
    try:
        with db.transaction() as conn:
            conn.root()["g"] = PersistentMapping(v="garbage")
        with db.transaction() as conn:
            g = conn.root()["g"]._p_oid
            del conn.root()["g"]
        pause()
        backend = storage.shared.backend
        holder = backend.connect()
        try:
            backend.locker.begin_commit(holder, 5)
            backend.locker.lock_commit(holder, 5)
            with pytest.raises(CommitLockTimeout):
                pack.pack(storage, time.time())
            assert storage.history(g)                 # still in the database
        finally:
            holder.rollback()
            holder.close()
        pack.pack(storage, time.time())
        assert_gone(storage, [g])
    finally:
        db.close()


def test_pack_of_transactions_with_the_smallest_tids(storage_factory: Any) -> None:
    """A database restored with the smallest tids (1, as ZODB's own tests restore) packs
    like any other: an object the root does not reach goes."""
    source = ZODB.DB(None)
    unreachable = PersistentMapping(v="unreachable")
    with source.transaction() as conn:
        conn.root()["v"] = 1
        conn.add(unreachable)
    orphan = unreachable._p_oid
    states = {oid: source.storage.load(oid)[0] for oid in (z64, orphan)}
    source.close()
    storage = storage_factory.open()
    txn = TransactionMetaData()
    storage.tpc_begin(txn, p64(1))
    for oid, state in states.items():
        storage.restore(oid, p64(1), state, "", None, txn)
    storage.tpc_vote(txn)
    storage.tpc_finish(txn)
    counts = pack.pack(storage, time.time())
    assert counts["garbage"] == 1
    assert_gone(storage, [orphan])
    assert storage.load(z64)[0] == states[z64]


def test_a_commit_voted_between_the_search_and_the_batch_keeps_what_it_links(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two garbage objects; right after the pack's search finds them, a commit links the
    first again and votes (its references are visible only once it finishes).  The
    batch waits for it (the pack gate; SQLite's write lock) and keeps that object; the
    other goes.  A batch that did not wait deleted the object under the commit."""
    storage, db = _open_db(storage_factory)
    try:
        tm, conn, g, gone = _two_garbage(db, "linked again")
        voted, errors = threading.Event(), []

        def say_voted_then_hold() -> None:
            voted.set()
            time.sleep(2.0)

        def link_again() -> None:
            try:
                conn.root()["again"] = g
                tm.get().join(DuringVote(say_voted_then_hold))
                tm.commit()
            except BaseException as exc:   # reported by the test below
                errors.append(exc)
                voted.set()
        linking = threading.Thread(target=link_again)

        def link_and_wait_for_the_vote() -> None:
            linking.start()
            assert voted.wait(30)
        found = _after_first_search(monkeypatch, storage, "next_garbage",
                                    link_and_wait_for_the_vote)
        counts = pack.pack(storage, time.time(), batch_size=2)
        linking.join(60)
        assert not errors
        assert sorted(found[0]) == sorted([u64(g._p_oid), u64(gone._p_oid)])
        assert counts["garbage"] >= 1
        assert_gone(storage, [gone._p_oid])
        assert storage.history(g._p_oid)    # in the database, not only in a cache
        check = db.open(transaction.TransactionManager())
        check.cacheMinimize()
        assert check.root()["again"]["v"] == "linked again"
        check.close()
        conn.close()
    finally:
        db.close()
