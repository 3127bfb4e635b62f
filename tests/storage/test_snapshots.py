"""MVCC through the shared state cache: a connection never sees a state outside its snapshot.

The instances of one storage share a cache of states.  A commit puts its new states
there and another connection's reads record them as current; a connection whose
snapshot is older must still get the old states, also for an object it loads for the
first time after the commit.
"""
from __future__ import annotations

import logging
from typing import Any

import pytest
import transaction
import ZODB
from BTrees.Length import Length
from persistent.mapping import PersistentMapping
from ZODB.POSException import ReadConflictError
from ZODB.utils import u64


def test_old_snapshot_ignores_newer_cached_states(storage_factory: Any) -> None:
    db = ZODB.DB(storage_factory.open())
    try:
        with db.transaction() as conn:
            conn.root()["a"] = PersistentMapping({"v": 1})
            conn.root()["b"] = PersistentMapping({"v": 1})

        tm1, tm2, tm3 = (transaction.TransactionManager() for _ in range(3))
        c1, c2, c3 = db.open(tm1), db.open(tm2), db.open(tm3)
        for conn in (c1, c2, c3):
            conn.cacheMinimize()       # a pooled connection may hold the objects already
        tm1.begin()
        a1 = c1.root()["a"]
        b1 = c1.root()["b"]            # a ghost: c1 has not loaded B's state
        assert a1["v"] == 1
        assert b1._p_status == "ghost"

        tm2.begin()
        c2.root()["a"]["v"] = 2
        c2.root()["b"]["v"] = 2
        tm2.commit()                   # B's new state is now in the shared cache

        tm3.begin()                    # a newer snapshot reads the new states, so the
        assert c3.root()["a"]["v"] == 2  # cache's index now names them as current
        assert c3.root()["b"]["v"] == 2

        # c1, not synced, still reads its own snapshot: B loaded for the first time ...
        assert b1["v"] == 1
        # ... and A loaded again from the storage (not from c1's object cache).
        a1._p_deactivate()
        assert a1._p_status == "ghost"
        assert a1["v"] == 1
        assert c1._storage.load(a1._p_oid)[0] != c3._storage.load(a1._p_oid)[0]

        tm1.begin()                    # a new transaction moves c1 to the newest commit
        assert (c1.root()["a"]["v"], c1.root()["b"]["v"]) == (2, 2)
        for tm, conn in ((tm1, c1), (tm2, c2), (tm3, c3)):
            tm.abort()
            conn.close()
    finally:
        db.close()


def test_second_connection_reads_from_shared_cache(storage_factory: Any) -> None:
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            for name in "abcde":
                conn.root()[name] = PersistentMapping({"v": name})
        cache = storage.shared.cache
        tm1, tm2 = transaction.TransactionManager(), transaction.TransactionManager()
        c1, c2 = db.open(tm1), db.open(tm2)  # both open: two separate object caches
        for conn in (c1, c2):
            conn.cacheMinimize()       # the pooled one holds the objects it created
        tm1.begin()
        assert [c1.root()[name]["v"] for name in "abcde"] == list("abcde")
        hits, misses = cache.hits, cache.misses
        tm2.begin()
        assert [c2.root()[name]["v"] for name in "abcde"] == list("abcde")
        # Every state c2 needed was loaded by c1 at the same snapshot: all from the cache.
        assert cache.hits - hits >= 5
        assert cache.misses == misses
        for tm, conn in ((tm1, c1), (tm2, c2)):
            tm.abort()
            conn.close()
    finally:
        db.close()


def test_no_stale_state_after_the_changed_oid_index_is_reset(storage_factory: Any) -> None:
    """A poll that sees more changed oids than the cache's index holds empties it; an
    older snapshot's load after that must not be recorded as current for newer ones."""
    storage = storage_factory.open(cache_size_mb=0.01)   # the smallest index: 1000 oids
    cache = storage.shared.cache
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["a"] = PersistentMapping(v=1)
            conn.root()["many"] = many = PersistentMapping()
            for i in range(1005):
                many[i] = PersistentMapping(v=0)
        a_oid = _oid(db, "a")
        old_state, old_serial = storage.load(a_oid)
        old = storage.new_instance()
        old.poll_invalidations()                   # a snapshot before the big commit
        with db.transaction() as conn:
            conn.root()["a"]["v"] = 2
            for child in conn.root()["many"].values():
                child["v"] = 1                     # more oids than the index holds
        new_state, new_serial = storage.load(a_oid)
        assert new_serial != old_serial
        new = storage.new_instance()
        new.poll_invalidations()
        assert cache.base == storage.shared.cache.polled  # the index was reset just now
        # The old snapshot reads its own revision, from the database ...
        assert old.load(a_oid) == (old_state, old_serial)
        # ... and no newer snapshot takes that revision for the current one.
        assert new.load(a_oid) == (new_state, new_serial)
        third = storage.new_instance()
        third.poll_invalidations()
        assert third.load(a_oid) == (new_state, new_serial)
        for instance in (old, new, third):
            instance.release()
    finally:
        db.close()


def _oid(db: Any, name: str) -> bytes:
    with db.transaction() as conn:
        return conn.root()[name]._p_oid


def test_a_poll_names_each_changed_object_once_at_its_newest_revision(
        storage_factory: Any) -> None:
    """The poll reads the revisions committed since the snapshot (history-preserving:
    object_state's, by tid): an object changed by two commits is one invalidation, and
    the new snapshot reads its newest state; one changed before the snapshot is not
    named."""
    reader_db = ZODB.DB(storage_factory.open())
    writer_db = ZODB.DB(storage_factory.open())     # another storage: no shared cache
    try:
        with writer_db.transaction() as conn:
            for name in "xyz":
                conn.root()[name] = PersistentMapping({"v": 0})
        tm = transaction.TransactionManager()
        reader = reader_db.open(tm)
        tm.begin()
        oids = {name: reader.root()[name]._p_oid for name in "xyz"}
        assert [reader.root()[name]["v"] for name in "xyz"] == [0, 0, 0]
        storage = reader._storage
        storage.poll_invalidations()            # the instance's snapshot is now
        for values in ({"x": 1, "y": 1}, {"x": 2}):
            with writer_db.transaction() as conn:
                for name, value in values.items():
                    conn.root()[name]["v"] = value
        changed = storage.poll_invalidations()
        assert sorted(changed) == sorted([oids["x"], oids["y"]])
        tid = storage.lastTransaction()
        assert storage.load(oids["x"])[1] == tid    # the second commit's revision
        assert storage.load(oids["y"])[1] < tid     # the first's
        assert storage.poll_invalidations() == []
        tm.abort()
        reader.close()
    finally:
        writer_db.close()
        reader_db.close()


def test_a_new_instance_starts_from_the_cache_it_shares(storage_factory: Any) -> None:
    """A new instance (a new ZODB connection) polls from where the shared cache last
    polled, not from nothing: the states the cache holds stay, so what another instance
    loaded is served without a statement, and what another storage changed meanwhile
    is read at its new revision."""
    storage = storage_factory.open()
    writer_db = ZODB.DB(storage_factory.open())     # another storage: no shared cache
    first, second = storage.new_instance(), storage.new_instance()
    try:
        with writer_db.transaction() as conn:
            conn.root()["kept"] = PersistentMapping(v=0)
            conn.root()["changed"] = PersistentMapping(v=0)
        with writer_db.transaction() as conn:
            kept_oid = conn.root()["kept"]._p_oid
            changed_oid = conn.root()["changed"]._p_oid
        first.poll_invalidations()
        kept = first.load(kept_oid)
        first.load(changed_oid)
        with writer_db.transaction() as conn:
            conn.root()["changed"]["v"] = 1
        changed = writer_db.storage.load(changed_oid)
        second.poll_invalidations()
        cache = storage.shared.cache
        hits, misses, before = cache.hits, cache.misses, storage.statement_count()
        assert second.load(kept_oid) == kept
        assert (cache.hits - hits, cache.misses - misses) == (1, 0)
        assert storage.statement_count() == before
        assert second.load(changed_oid) == changed
    finally:
        for instance in (first, second):
            instance.release()
        writer_db.close()
        storage.close()


def test_a_read_transaction_ends_before_the_snapshot_moves(storage_factory: Any) -> None:
    """Where loads read inside a read transaction (history-free; history-preserving
    SQLite, ``reads_in_transaction``), the one a load began must not outlive its
    snapshot: after another process's commit, a poll (a new ZODB transaction, or a
    ``sync``) moves the snapshot and the database answers with the new state.  The
    cache is off, so every load is the database's answer."""
    reader = storage_factory.open(cache_size_mb=0)
    writer_db = ZODB.DB(storage_factory.open())
    try:
        with writer_db.transaction() as conn:
            conn.root()["a"] = PersistentMapping({"v": 1})
        with writer_db.transaction() as conn:
            oid = conn.root()["a"]._p_oid
        instance = reader.new_instance()
        for value, move in ((2, instance.poll_invalidations), (3, instance.sync)):
            instance.poll_invalidations()
            before = instance.load(oid)[0]
            with writer_db.transaction() as conn:
                conn.root()["a"]["v"] = value
            assert instance.load(oid)[0] == before       # the same snapshot
            move()
            if move == instance.sync:
                instance.poll_invalidations()
            with writer_db.transaction() as conn:
                expected = conn._storage.load(oid)[0]
            assert instance.load(oid)[0] == expected != before
        instance.release()
    finally:
        writer_db.close()


def test_a_first_poll_racing_another_instances_poll_is_not_a_database_gone_back(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A new instance's first poll starts where the shared cache last polled.  If
    another instance moves that on after this poll's snapshot began (on SQLite the
    commit check begins it), the start must still be the one from before: read after,
    it lay past the snapshot, and the poll took the database for one restored from a
    backup (every cached state dropped, every instance told to forget everything)."""
    storage = storage_factory.open()
    writer_db = ZODB.DB(storage_factory.open())     # another storage: no shared cache
    first, mover = storage.new_instance(), storage.new_instance()
    watch = storage.shared.watch
    checked = watch.quiet

    def check_then_race(*args: Any) -> Any:
        found = checked(*args)
        monkeypatch.setattr(watch, "quiet", checked)    # once
        with writer_db.transaction() as conn:
            conn.root()["v"] = 2
        mover.poll_invalidations()                       # the shared cache moves on
        return found

    try:
        with writer_db.transaction() as conn:
            conn.root()["v"] = 1
        mover.poll_invalidations()
        monkeypatch.setattr(watch, "quiet", check_then_race)
        with caplog.at_level(logging.WARNING, logger="zodbsql"):
            assert first.poll_invalidations() == []
        assert watch.quiet is checked                    # the race was run
        assert [r.getMessage() for r in caplog.records] == []
        assert storage.shared.resets == 0
        assert mover.poll_invalidations() == []
    finally:
        for instance in (first, mover):
            instance.release()
        writer_db.close()
        storage.close()


def test_a_retired_state_is_kept_only_while_a_transaction_reads_before_it(
        storage_factory: Any) -> None:
    """A poll that sees a cached state change keeps the old one as an exact revision
    (conflict resolution asks for the revision its transaction read) while another
    instance of the process is in a transaction at an older snapshot; with none, the
    old state goes (a reader alone in its process paid 4-5 ms a start to keep 1,000)."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    writer_db = ZODB.DB(storage_factory.open())     # another process: no shared cache
    cache = storage.shared.cache

    def change(value: int) -> None:
        with writer_db.transaction() as conn:
            conn.root()["a"]["v"] = value

    try:
        with writer_db.transaction() as conn:
            conn.root()["a"] = PersistentMapping({"v": 0})
        tm1, tm2 = transaction.TransactionManager(), transaction.TransactionManager()
        c1, c2 = db.open(tm1), db.open(tm2)
        tm1.begin()
        a = c1.root()["a"]
        assert a["v"] == 0
        oid, first = u64(a._p_oid), u64(a._p_serial)
        tm2.begin()                     # c2 reads at the snapshot of state 0 ...
        change(1)
        tm1.abort()                     # ... when c1's poll retires it
        assert cache.get_revision(oid, first) is not None
        assert c2.root()["a"]["v"] == 0
        tm2.abort()
        c2.close()                      # no other instance reads at an older snapshot
        tm1.begin()
        assert a["v"] == 1
        second = u64(a._p_serial)
        change(2)
        tm1.abort()
        assert cache.get_revision(oid, second) is None
        tm1.begin()
        assert a["v"] == 2
        third = u64(a._p_serial)
        tm1.abort()
        # Changed while c1 waits between transactions, seen by its begin's poll: its
        # own last snapshot, older, is no other reader's.
        change(3)
        tm1.begin()
        assert cache.get_revision(oid, third) is None
        assert a["v"] == 3
        tm1.abort()
        c1.close()
    finally:
        writer_db.close()
        db.close()


def test_conflict_resolution_reads_the_retired_revision_from_the_cache(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two connections of one process change a ``Length``; the second to commit
    resolves the conflict with the state its transaction read, which the first one's
    poll retired while the second was still in its transaction: no load for it."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["n"] = Length(0)
        tm1, tm2 = transaction.TransactionManager(), transaction.TransactionManager()
        c1, c2 = db.open(tm1), db.open(tm2)
        for tm, conn in ((tm1, c1), (tm2, c2)):
            conn.cacheMinimize()
            tm.begin()
            conn.root()["n"].change(1)      # both read state 0 (the cache's current)
        tm1.commit()                        # c1's next poll retires state 0
        serials: list[int] = []
        mover = storage.shared.backend.mover
        load_serial = mover.load_serial

        def counted(conn: Any, oid: int, tid: int) -> Any:
            serials.append(tid)
            return load_serial(conn, oid, tid)

        monkeypatch.setattr(mover, "load_serial", counted)
        tm2.commit()                        # a conflict, resolved
        assert serials == []
        tm1.begin()
        assert c1.root()["n"]() == 2
        tm1.abort()
        for conn in (c1, c2):
            conn.close()
    finally:
        db.close()


def test_each_poll_moves_the_snapshot_though_loads_came_between(storage_factory: Any) -> None:
    """An instance polled twice with loads between and nothing telling it the ZODB
    transaction ended (no afterCompletion, no sync): each poll still sees every commit
    made before it, and the loads after it read those states, poll after poll (from
    the database: no state cache)."""
    db = ZODB.DB(storage_factory.open(cache_size_mb=0))
    try:
        with db.transaction() as conn:
            conn.root()["a"] = PersistentMapping({"v": 0})
        with db.transaction() as conn:
            oid = conn.root()["a"]._p_oid
        instance = db.storage.new_instance()
        try:
            instance.poll_invalidations()
            for value in (1, 2, 3):
                before = instance.load(oid)
                with db.transaction() as conn:
                    conn.root()["a"]["v"] = value
                assert oid in instance.poll_invalidations()
                state, tid = instance.load(oid)
                assert tid > before[1] and state != before[0]
                assert tid == db.storage.lastTransaction()
        finally:
            instance.release()
    finally:
        db.close()


def test_with_the_cache_off_a_load_is_one_statement_as_of_the_snapshot(
        storage_factory: Any) -> None:
    """cache-size-mb 0: a load looks in no cache and fills none, one statement each,
    and it answers as of the snapshot: where history is kept, the revision the snapshot
    sees after another process changed the object; history-free, once the read
    transaction ended, a read conflict (never the newer state)."""
    storage = storage_factory.open(cache_size_mb=0)
    writer_db = ZODB.DB(storage_factory.open())
    try:
        with writer_db.transaction() as conn:
            conn.root()["a"] = PersistentMapping({"v": 1})
            conn.root()["b"] = PersistentMapping({"v": 1})
        with writer_db.transaction() as conn:
            oids = [conn.root()[key]._p_oid for key in "ab"]
            old = [conn._storage.load(oid) for oid in oids]
        instance = storage.new_instance()
        instance.poll_invalidations()
        assert instance.load(oids[0]) == old[0]
        before = storage.statement_count()
        assert [instance.load(oid) for oid in oids] == old
        assert storage.statement_count() - before == 2
        assert len(storage.shared.cache) == 0
        instance.afterCompletion()
        with writer_db.transaction() as conn:
            conn.root()["b"]["v"] = 2
        if storage_factory.param.keep_history:
            assert instance.load(oids[1]) == old[1]
        else:
            with pytest.raises(ReadConflictError):
                instance.load(oids[1])
        instance.release()
    finally:
        writer_db.close()
        storage.close()
