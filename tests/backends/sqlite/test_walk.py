"""SQLite's walk in one statement (``SQLiteMover.load_walked``): from the seeds through
the references of current revisions, breadth first, each object once, within the limit,
never on from a state larger than the largest given, each state as of the snapshot."""
from __future__ import annotations

from typing import Any

import transaction
import ZODB
from BTrees.OOBTree import OOBTree
from persistent.mapping import PersistentMapping
from ZODB.utils import u64

storage_backends = ("sqlite",)
storage_backends_reason = "SQLite's own walking statement"


def walked(storage: Any, seeds: list[int], limit: int, largest: int = 4096,
           snapshot: int | None = None) -> list[Any]:
    """``load_walked`` on a connection of its own, at the last commit by default."""
    if snapshot is None:
        snapshot = u64(storage.lastTransaction())
    conn = storage.shared.backend.connect()
    try:
        found = storage.shared.backend.mover.load_walked(conn, seeds, snapshot, limit, largest)
    finally:
        conn.close()
    assert found is not None
    return found


def breadth_first(storage: Any, seeds: list[int], limit: int) -> list[int]:
    """The oids a walk breadth first through ZODB's own reading of each state meets."""
    from ZODB.serialize import referencesf
    order: list[int] = []
    queue = list(seeds)
    while queue and len(order) < limit:
        oid = queue.pop(0)
        if oid in order:
            continue
        order.append(oid)
        queue += sorted(u64(each) for each in referencesf(
            storage.load(oid.to_bytes(8, "big"))[0]))
    return order


def test_a_walk_from_a_bucket_brings_the_next_buckets_and_their_items_in_order(
        storage_factory: Any) -> None:
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["tree"] = tree = OOBTree()
            for i in range(300):
                tree[i] = PersistentMapping(v=i)
        with db.transaction() as conn:
            first = conn.root()["tree"]._firstbucket
            buckets = []
            while first is not None:
                buckets.append(u64(first._p_oid))
                first = first._next
        assert len(buckets) > 5
        reachable = len(breadth_first(storage, [buckets[1]], 10 ** 6))
        for limit in (1, 17, 40, 1000):
            found = walked(storage, [buckets[1]], limit)
            assert [each.oid for each in found] == breadth_first(storage, [buckets[1]], limit)
            assert len(found) == min(limit, reachable)
            for each in found:
                state, tid = storage.load(each.oid.to_bytes(8, "big"))
                assert (each.state, each.tid) == (state, u64(tid))
        everything = walked(storage, [buckets[1]], 1000)
        # Every bucket after the first and every item in them, each once.
        assert len({each.oid for each in everything}) == len(everything)
        assert set(buckets[1:]) <= {each.oid for each in everything}
        assert buckets[0] not in {each.oid for each in everything}
    finally:
        db.close()


def test_a_walk_ends_at_a_cycle_and_at_the_states_larger_than_the_largest(
        storage_factory: Any) -> None:
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            a, b = PersistentMapping(), PersistentMapping()
            a["b"], b["a"] = b, a
            big = PersistentMapping(pad=b"x" * 5000, leaf=PersistentMapping())
            a["big"] = big
            conn.root()["a"] = a
        with db.transaction() as conn:
            a = conn.root()["a"]
            oids = [u64(a._p_oid), u64(a["b"]._p_oid), u64(a["big"]._p_oid),
                    u64(a["big"]["leaf"]._p_oid)]
        found = [each.oid for each in walked(storage, [oids[0]], 100)]
        # The cycle a -> b -> a ends; big comes, but the walk does not go on from it.
        assert sorted(found) == sorted(oids[:3])
        assert found[0] == oids[0]
        found = [each.oid for each in walked(storage, [oids[0]], 100, largest=10 ** 6)]
        assert sorted(found) == sorted(oids)
        # A state of exactly the largest is walked on from, one byte over it is not.
        size = len(storage.load(oids[2].to_bytes(8, "big"))[0])
        for largest, expected in ((size, oids), (size - 1, oids[:3])):
            found = [each.oid for each in walked(storage, [oids[2]], 100, largest=largest)]
            assert sorted(found) == sorted(set(expected) & set(
                breadth_first(storage, [oids[2]], 100))), largest
            assert (oids[3] in found) == (largest == size)
    finally:
        db.close()


def test_a_walk_brings_each_state_as_of_the_snapshot(storage_factory: Any) -> None:
    """History-preserving, the revision the snapshot sees; history-free, the current
    one, whose newer tid the caller leaves out of the cache."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["items"] = PersistentMapping(
                {i: PersistentMapping(v=0) for i in range(5)})
        snapshot = u64(storage.lastTransaction())
        with db.transaction() as conn:
            container = conn.root()["items"]
            seed = u64(container._p_oid)
            container[0]["v"] = 1
            changed = u64(container[0]._p_oid)
        newest = u64(storage.lastTransaction())
        found = {each.oid: each for each in walked(storage, [seed], 100, snapshot=snapshot)}
        assert len(found) == 6
        if storage.shared.options.keep_history:
            assert all(each.tid == snapshot for each in found.values())
        else:
            assert found[changed].tid == newest
            assert all(each.tid == snapshot for oid, each in found.items() if oid != changed)
    finally:
        db.close()
    transaction.abort()


def test_a_walk_follows_the_references_of_current_revisions(storage_factory: Any) -> None:
    """A container that referred to one child, then to another: the walk from it goes
    to the child it refers to now, not to the one an older revision named."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["old"] = old = PersistentMapping()
            conn.root()["box"] = PersistentMapping(child=old)
        with db.transaction() as conn:
            conn.root()["box"]["child"] = PersistentMapping()
        with db.transaction() as conn:
            box = conn.root()["box"]
            oids = [u64(box._p_oid), u64(box["child"]._p_oid), u64(conn.root()["old"]._p_oid)]
        found = [each.oid for each in walked(storage, [oids[0]], 100)]
        assert found == oids[:2]
    finally:
        db.close()


def test_a_walk_at_an_older_snapshot_brings_the_revision_it_sees(
        storage_factory: Any) -> None:
    """A child written at the first, second and fourth commits, the snapshot at the
    third (which wrote another object): history-preserving, the second revision comes,
    not the first, the fourth or none; history-free, the current one."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    tids = []
    try:
        for step in range(4):
            with db.transaction() as conn:
                root = conn.root()
                if step == 0:
                    root["box"] = PersistentMapping(child=PersistentMapping(v=0))
                if step == 2:
                    root["other"] = step
                else:
                    root["box"]["child"]["v"] = step
            tids.append(u64(storage.lastTransaction()))
        with db.transaction() as conn:
            box, child = conn.root()["box"], conn.root()["box"]["child"]
            oids = (u64(box._p_oid), u64(child._p_oid))
        found = {each.oid: each.tid for each in walked(storage, [oids[0]], 10,
                                                       snapshot=tids[2])}
        expected = tids[1] if storage.shared.options.keep_history else tids[3]
        assert found == {oids[0]: tids[0], oids[1]: expected}
    finally:
        db.close()


def test_no_seed_or_no_room_walks_nothing(storage_factory: Any) -> None:
    storage = storage_factory.open()
    db = ZODB.DB(storage)               # the root, oid 0
    try:
        assert walked(storage, [], 10) == []
        assert walked(storage, [0], 0) == []
        assert [each.oid for each in walked(storage, [0], 1)] == [0]
        assert walked(storage, [10 ** 12], 10) == []        # no such object
        # No seed, or no room: not a statement.
        conn = storage.shared.backend.connect()
        try:
            mover = storage.shared.backend.mover
            for seeds, limit in (([], 10), ([0], 0), ([0], -1)):
                assert mover.load_walked(conn, seeds, 1, limit, 4096) == []
            assert conn.statements == 0
        finally:
            conn.close()
    finally:
        db.close()
