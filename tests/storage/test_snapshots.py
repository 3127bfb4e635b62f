"""MVCC through the shared state cache: a connection never sees a state outside its snapshot.

The instances of one storage share a cache of states.  A commit puts its new states
there and another connection's reads record them as current; a connection whose
snapshot is older must still get the old states, also for an object it loads for the
first time after the commit.
"""
from __future__ import annotations

from typing import Any

import transaction
import ZODB
from persistent.mapping import PersistentMapping


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
