"""Prefetch: states loaded ahead into the shared cache, in one statement, never outside
the snapshot of the instance that loads them.

``prefetch(oids)`` (ZODB's ``Connection.prefetch``) loads the states it is given.
Statements are counted with ``statement_count()``; "another process" is a second storage
opened on the same database, with its own cache.
"""
from __future__ import annotations

import io
import logging
import pickle
from typing import Any, Callable, Iterator

import pytest
import transaction
import ZODB
from BTrees.OOBTree import OOBTree
from persistent.mapping import PersistentMapping
from ZODB import POSException
from ZODB.utils import p64, u64

from tests.storage.test_verify import CORRUPT, run_sql
from zodbsql.backends.base.mover import REFERENCES_EACH
from zodbsql.cache.compression import LIBRARY_BYTES
from zodbsql.cache.prefetch import (FRESH_ENTRY_BYTES, IN_FLIGHT_ENTRY_BYTES,
                                     QUEUED_ENTRY_BYTES, START, WINDOW, working_bytes)
from zodbsql.errors import CorruptRecordError, DatabaseError
from zodbsql.backends.base.contract import StateRow
from zodbsql.backends.base.mover import BYTES_STEP
from zodbsql.backends.postgresql.mover import FIRST_OF_PARENT
from zodbsql.storage.records import verified
from zodbsql.storage import storage as storage_module
from zodbsql.storage.storage import SEND_AHEAD_AFTER

CHILDREN = 500


def fill(db: Any, count: int = CHILDREN) -> list[bytes]:
    """A mapping of ``count`` small mappings under the root; their oids."""
    with db.transaction() as conn:
        conn.root()["items"] = items = PersistentMapping()
        for i in range(count):
            items[i] = PersistentMapping(v=0)
    with db.transaction() as conn:
        return [child._p_oid for child in conn.root()["items"].values()]


def state_sizes(conn: Any, oids: list[int]) -> dict[int, int]:
    """The stored size of each of ``oids`` (objects of one revision), read on ``conn``."""
    listed = ", ".join(["%s"] * len(oids))
    return dict(conn.fetchall(
        f"SELECT zoid, state_size FROM object_state WHERE zoid IN ({listed})", oids))


def change_all(db: Any, value: int) -> None:
    with db.transaction() as conn:
        for child in conn.root()["items"].values():
            child["v"] = value


def mapping_data(state: bytes | None) -> dict[str, Any]:
    """The items of a ``PersistentMapping``'s state (its second pickle's ``data``)."""
    assert state is not None
    unpickler = pickle.Unpickler(io.BytesIO(state))
    unpickler.load()                 # the class
    data: dict[str, Any] = unpickler.load()["data"]
    return data


def value_in(state: bytes | None) -> int:
    """The ``v`` of a child mapping's state."""
    return int(mapping_data(state)["v"])


def value_of(instance: Any, oid: bytes) -> int:
    """The ``v`` of the child mapping ``oid`` as ``instance`` loads it."""
    return value_in(instance.load(oid)[0])


@pytest.fixture
def polled() -> Iterator[Callable[[Any], Any]]:
    """``polled(storage)``: a new instance at the newest commit, released after the test
    (also when it fails: an open read transaction would block dropping the database)."""
    made: list[Any] = []

    def new_instance(storage: Any) -> Any:
        instance = storage.new_instance()
        made.append(instance)
        instance.poll_invalidations()
        return instance
    yield new_instance
    for instance in made:
        instance.release()


def test_prefetch_is_one_statement_and_serves_the_loads(storage_and_db: Any,
                                                        polled: Any) -> None:
    storage, db = storage_and_db
    oids = fill(db)
    storage.shared.cache.clear()
    instance = polled(storage)
    before = storage.statement_count()
    instance.prefetch(oids)
    assert storage.statement_count() - before == 1 + begins_reading(storage)
    before = storage.statement_count()
    assert [value_of(instance, oid) for oid in oids] == [0] * CHILDREN
    assert storage.statement_count() - before == 0
    before = storage.statement_count()
    instance.prefetch(oids)              # all cached: nothing to ask
    assert storage.statement_count() - before == 0
    instance.release()


def test_prefetch_skips_what_does_not_exist(storage_and_db: Any, polled: Any) -> None:
    storage, db = storage_and_db
    oids = fill(db, 3)
    instance = polled(storage)
    missing = b"\x00" * 7 + b"\x7f"
    instance.prefetch(oids + [missing])
    assert [value_of(instance, oid) for oid in oids] == [0, 0, 0]
    with pytest.raises(POSException.POSKeyError):
        instance.load(missing)
    instance.release()


def test_prefetch_at_an_old_snapshot_reads_that_snapshot(storage_factory: Any,
                                                         storage_and_db: Any,
                                                         polled: Any) -> None:
    storage, db = storage_and_db
    other = storage_factory.open(storage_factory.path)   # another process
    oids = fill(db)
    storage.shared.cache.clear()
    old = polled(storage)
    change_all(ZODB.DB(other), 1)    # committed after old's snapshot
    new = polled(storage)
    new.prefetch(oids)               # newer revisions in the shared cache
    old.prefetch(oids)               # old's own revisions, from the database
    assert {value_of(old, oid) for oid in oids} == {0}
    assert {value_of(new, oid) for oid in oids} == {1}
    third = polled(storage)          # a newer snapshot reads the newest from the cache
    before = storage.statement_count()
    assert {value_of(third, oid) for oid in oids} == {1}
    assert storage.statement_count() - before == 0
    for instance in (old, new, third):
        instance.release()


# -- reference-driven prefetch ----------------------------------------------------------------
def always_picks(storage: Any) -> bool:
    """Does the client pick every batch (SQLite), rather than only those it finds full
    (PostgreSQL) or none (MySQL)?"""
    mover = storage.shared.backend.mover
    return mover.LOOKS_AHEAD and mover.LOOKAHEAD_AT_LEAST is None


def begins_reading(storage: Any) -> int:
    """The statement a snapshot's first load adds where it begins a read transaction
    (history-preserving SQLite, ``reads_in_transaction``; history-free polls begin it)."""
    conn = storage.shared.backend.connect()
    try:
        return int(storage.shared.options.keep_history and conn.reads_in_transaction)
    finally:
        conn.close()


def children_of(instance: Any, container: bytes) -> list[bytes]:
    """The oids the container's state refers to (ZODB's own reading of the pickle)."""
    from ZODB.serialize import referencesf
    return referencesf(instance.load(container)[0])


def container_oid(db: Any) -> bytes:
    with db.transaction() as conn:
        return conn.root()["items"]._p_oid


def test_a_load_brings_the_states_it_refers_to(storage_and_db: Any, polled: Any) -> None:
    storage, db = storage_and_db
    fill(db, START)                  # as many children as a first load brings along
    container = container_oid(db)
    storage.shared.cache.clear()
    instance = polled(storage)
    before = storage.statement_count()
    children = children_of(instance, container)
    # A client that looks ahead (SQLite) reads the row with its first references, then
    # the states not cached: two statements of microseconds.
    assert storage.statement_count() - before == (
        2 if always_picks(storage) else 1) + begins_reading(storage)
    before = storage.statement_count()
    assert [value_of(instance, oid) for oid in children] == [0] * START
    assert storage.statement_count() - before == 0       # served from the cache
    assert storage.shared.prefetcher.used == START
    instance.release()


def test_a_load_brings_at_most_references_each_of_every_state(storage_and_db: Any,
                                                              polled: Any) -> None:
    """A process that loads the root again must not bring every child of every
    container it holds: at most REFERENCES_EACH references of each state come along."""
    storage, db = storage_and_db
    children = REFERENCES_EACH + 36
    with db.transaction() as conn:
        for name in ("a", "b", "c"):
            conn.root()[name] = PersistentMapping(
                (i, PersistentMapping(v=0)) for i in range(children))
    with db.transaction() as conn:
        containers = {u64(conn.root()[name]._p_oid): {u64(child._p_oid) for child in
                                                     conn.root()[name].values()}
                      for name in ("a", "b", "c")}
    instance = polled(storage)
    row, states, references = storage.shared.backend.mover.load_with_references(
        instance._snapshot_conn(), 0, instance._snapshot, [], 1000, 10 ** 8, 10 ** 6)
    assert row is not None
    assert {state[0] for state in states} == set(containers)
    found: dict[int, set[int]] = {}
    for from_oid, to_oid in references:
        found.setdefault(from_oid, set()).add(to_oid)
    assert found.pop(0) == set(containers)        # the loaded state's own come too
    assert set(found) == set(containers)
    for container, kept in found.items():
        assert len(kept) == REFERENCES_EACH
        assert kept <= containers[container]
        if storage.shared.backend.name != "postgresql":   # LATERAL: any of them
            assert kept == set(sorted(containers[container])[:REFERENCES_EACH])


def cold_walk(storage: Any, db: Any, key: str = "items") -> int:
    """Statements of reading every child of the container under ``key`` with every
    cache empty (the transaction's poll included, its end not)."""
    storage.shared.cache.clear()
    db.cacheMinimize()
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    conn.cacheMinimize()
    before = storage.statement_count()
    tm.begin()
    values = [child["v"] for child in conn.root()[key].values()]
    statements = storage.statement_count() - before
    tm.abort()
    conn.close()
    assert values == [0] * len(values)
    return statements


def bucket_chain(db: Any, key: str) -> list[tuple[int, list[int]]]:
    """The buckets of the OOBTree under ``key``, in order: (oid, its items' oids)."""
    with db.transaction() as conn:
        found, bucket = [], conn.root()[key]._firstbucket
        while bucket is not None:
            found.append((u64(bucket._p_oid), [u64(v._p_oid) for v in bucket.values()]))
            bucket = bucket._next
    return found


def fill_tree(db: Any, **fields: Any) -> None:
    """An OOBTree of 6,000 small mappings (``v=0`` and ``fields``) under "tree": 200 and
    more buckets."""
    with db.transaction() as conn:
        conn.root()["tree"] = tree = OOBTree()
        for i in range(6000):
            tree[i] = PersistentMapping(v=0, **fields)


def test_a_cold_walk_of_a_thousand_children_is_a_few_statements(storage_factory: Any,
                                                                storage_and_db: Any) -> None:
    storage, db = storage_and_db
    fill(db, 1000)
    # SQLite's lookahead asks for the container's references after each miss, then
    # reads the batch in statements bounded by bytes (two for a batch of more than
    # BYTES_STEP): two or three statements a miss, of a few microseconds each.
    assert cold_walk(storage, db) <= (17 if always_picks(storage) else 10)


def test_a_cold_btree_walk_brings_the_next_buckets_with_their_items(
        storage_factory: Any) -> None:
    """PostgreSQL's prefetch and SQLite's walk onward (``Mover.load_walked``) follow
    references breadth first, so one statement brings several buckets and their items;
    MySQL's brings one bucket's items at a time."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        fill_tree(db)
        buckets = len(bucket_chain(db, "tree"))
        statements = cold_walk(storage, db, "tree")
    finally:
        db.close()
    assert buckets > 200
    if storage_factory.param.backend in ("postgresql", "sqlite"):
        # SQLite before its walk in one statement: a statement a bucket (401 for 399).
        assert statements <= buckets // 10, (statements, buckets)
    else:
        assert statements <= buckets + 20


def test_a_cold_btree_walk_misses_once_in_several_buckets_where_the_client_picks(
        storage_factory: Any) -> None:
    """SQLite: a miss whose pick came short (a bucket's last items and the next bucket)
    walks on from what came (``lookahead.walked_on``), the next buckets and their items
    in one more statement, so that a walk misses once in several buckets, not once in
    each, and every item reads right."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        if not always_picks(storage):
            pytest.skip("only a mover whose client picks every batch walks on (SQLite)")
        fill_tree(db)
        buckets = len(bucket_chain(db, "tree"))
        misses = storage.shared.cache.misses
        statements = cold_walk(storage, db, "tree")
        misses = storage.shared.cache.misses - misses
    finally:
        db.close()
    assert buckets > 200
    assert statements <= buckets + 20
    assert misses <= buckets // 4, (misses, buckets)


def state_bytes(loaded: Any) -> int:
    """The bytes of the states of ``loaded`` (LoadedState rows)."""
    return sum(len(each.state) for each in loaded if each.state)


def note_walks(monkeypatch: pytest.MonkeyPatch,
               note: Callable[[Any, int, Any], None]) -> None:
    """Every ``_walked_on`` call of the test's storages is passed on, then told to
    ``note(came, count, brought)``."""
    walked_on = storage_module.SQLStorage._walked_on

    def noted(self: Any, conn: Any, snapshot: int, oid: int, came: Any,
              count: int) -> Any:
        brought = walked_on(self, conn, snapshot, oid, came, count)
        note(came, count, brought)
        return brought
    monkeypatch.setattr(storage_module.SQLStorage, "_walked_on", noted)


def test_a_walk_onward_stays_within_the_prefetch_bytes_its_miss_left(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite: the steps a miss walks on from what came (``_walked_on``) bring at most
    the bytes of ``prefetch-bytes`` the miss's batch left, and none once it took them
    all, so the bound holds for the walk as for the batch."""
    storage = storage_factory.open(prefetch_bytes=20000)
    db = ZODB.DB(storage)
    try:
        if not always_picks(storage):
            pytest.skip("only a mover whose client picks every batch walks on (SQLite)")
        fill_tree(db, pad=b"p" * 100)
        prefetcher = storage.shared.prefetcher
        prefetcher.bound = prefetcher.limit             # a warm process's bound
        walks: list[tuple[int, int]] = []
        note_walks(monkeypatch, lambda came, count, got: walks.append(
            (state_bytes(came), state_bytes(got))))
        cold_walk(storage, db, "tree")
    finally:
        db.close()
    assert sum(1 for _, walked in walks if walked) >= 10      # it walked on
    assert [(came, walked) for came, walked in walks
            if walked > max(0, 20000 - came)] == []


def test_a_pick_of_a_containers_children_does_not_walk_on_for_a_few_states(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite: a pick that filled its bound but for a few states (a container's 999
    children at a bound of 1,000) does not read every state that came for the
    references a walk of those few would follow (``lookahead.WALKED_FROM_EACH``)."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        if not always_picks(storage):
            pytest.skip("only a mover whose client picks every batch walks on (SQLite)")
        fill(db, 1000)
        prefetcher = storage.shared.prefetcher
        prefetcher.bound = prefetcher.limit
        walks: list[tuple[int, int]] = []
        note_walks(monkeypatch, lambda came, count, got: walks.append((len(came), count)))
        cold_walk(storage, db)
        assert walks == []
        fill(db, 200)                                   # 801 states left: a walk
        prefetcher.bound = prefetcher.limit
        cold_walk(storage, db)
    finally:
        db.close()
    assert walks == [(200, 801)]


def test_a_miss_without_a_cached_parent_brings_only_its_uncached_references(
        storage_factory: Any, storage_and_db: Any, polled: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite: a miss no cached state refers to (a container loaded by oid) comes with
    its first references, then those of them the cache does not hold in one batch: a
    child cached already is never read again, and every other one comes; the batch
    stops at prefetch-bytes."""
    storage, db = storage_and_db
    if not always_picks(storage):
        pytest.skip("only a mover whose client picks every batch looks ahead this way")
    oids = [u64(oid) for oid in fill(db, 300)]
    container = container_oid(db)
    storage.shared.cache.clear()
    prefetcher = storage.shared.prefetcher
    prefetcher.bound = prefetcher.limit                 # a warm process's bound
    instance = polled(storage)
    cached = set(oids[::3])
    for oid in sorted(cached):
        instance.load(p64(oid))
    mover = storage.shared.backend.mover
    asked: list[int] = []
    load_many_at = mover.load_many_at

    def recorded(conn: Any, wanted: Any, *args: Any, **kw: Any) -> Any:
        asked.extend(wanted)
        return load_many_at(conn, wanted, *args, **kw)
    monkeypatch.setattr(mover, "load_many_at", recorded)
    before = storage.statement_count()
    instance.load(container)
    assert storage.statement_count() - before <= 3
    assert set(asked).isdisjoint(cached)
    assert set(asked) == set(oids) - cached
    snapshot = instance._snapshot
    assert all(storage.shared.cache.has(oid, snapshot) for oid in oids)
    # The batch stops at prefetch-bytes: after its first statement (BYTES_STEP oids),
    # which brings more than 1,500 bytes.
    small = storage_factory.open(prefetch_bytes=1500)
    small.shared.prefetcher.bound = small.shared.prefetcher.limit
    reader = polled(small)
    reader.load(container)
    came = [oid for oid in oids if small.shared.cache.has(oid, reader._snapshot)]
    assert 0 < len(came) <= BYTES_STEP < len(oids)


def test_a_walk_among_cached_states_brings_only_the_uncached(
        storage_factory: Any, storage_and_db: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A BTree walk whose items are partly cached (a second pass over more than the
    cache holds): on SQLite the client picks what comes along, and never a state the
    cache holds; on every backend each item reads right."""
    storage, db = storage_and_db
    with db.transaction() as conn:
        conn.root()["tree"] = tree = OOBTree()
        for i in range(600):
            tree[i] = PersistentMapping(v=i)
    with db.transaction() as conn:
        oids = [item._p_oid for item in conn.root()["tree"].values()]
    storage.shared.cache.clear()
    conn = db.open()
    conn.cacheMinimize()
    cached = set(oids[::3])
    conn._storage.prefetch(sorted(cached))
    mover = storage.shared.backend.mover
    assert always_picks(storage) == (storage_factory.param.backend == "sqlite")
    asked: list[int] = []
    load_many_at = mover.load_many_at

    def recorded(conn: Any, wanted: Any, snapshot: int, max_bytes: Any = None,
                 largest: Any = None) -> Any:
        asked.extend(wanted)
        return load_many_at(conn, wanted, snapshot, max_bytes, largest)
    monkeypatch.setattr(mover, "load_many_at", recorded)
    before = storage.statement_count()
    assert [item["v"] for item in conn.root()["tree"].values()] == list(range(600))
    statements = storage.statement_count() - before
    conn.close()
    if always_picks(storage):
        assert asked and not {u64(oid) for oid in cached} & set(asked)
        assert len(asked) == len(set(asked))
        assert statements <= 60


def test_the_state_cache_counts_what_prefetch_takes_outside_it(storage_factory: Any) -> None:
    """A 10 MB cache's process took 3 MB more with prefetch than without (PostgreSQL,
    ``scripts/cache_memory.py``): its batches on their way in and what an instance
    holds of them.  The cache counts that much against its bound, and nothing when
    prefetch is off."""
    assert working_bytes(0, 1 << 20) == working_bytes(1000, 0) == 0
    assert working_bytes(1000, 512 << 10) == (1000 * IN_FLIGHT_ENTRY_BYTES + 3 * (512 << 10)
                                              + 4000 * FRESH_ENTRY_BYTES)
    assert working_bytes(1, 1) == 1 * IN_FLIGHT_ENTRY_BYTES + 3 + 64 * FRESH_ENTRY_BYTES
    for megabytes in (32, 64):
        storage = storage_factory.open(cache_size_mb=megabytes)
        try:
            prefetcher, cache = storage.shared.prefetcher, storage.shared.cache
            working = working_bytes(prefetcher.limit, prefetcher.max_bytes)
            # The compressor's memory too (cache-compress auto, the default).
            assert cache._reserved == working + LIBRARY_BYTES
            assert cache.bytes_used >= cache._reserved
            # References read and never loaded (a querier's, whose bound stays 0) fill
            # the queue for the process's whole life: the cache counts them as they come.
            prefetcher.loaded(-1, [], [(1, oid) for oid in range(10 ** 9, 10 ** 9 + 4000)])
            cost = prefetcher.bookkeeping_bytes()
            assert cost >= 4000 * QUEUED_ENTRY_BYTES
            assert cache._reserved == working + cost + LIBRARY_BYTES
        finally:
            storage.close()
    storage = storage_factory.open(cache_size_mb=10, prefetch_count=0)
    try:
        assert storage.shared.cache._reserved == LIBRARY_BYTES     # the compressor's alone
    finally:
        storage.close()


def test_prefetch_off_loads_one_state_per_statement(storage_factory: Any) -> None:
    storage = storage_factory.open(prefetch_count=0)
    db = ZODB.DB(storage)
    try:
        fill(db, 200)
        assert cold_walk(storage, db) >= 202               # root, container, children
        assert storage.shared.prefetcher.prefetched == 0
    finally:
        db.close()


def test_a_prefetched_state_is_the_loading_snapshot_s(storage_factory: Any,
                                                      storage_and_db: Any,
                                                      polled: Any) -> None:
    """Another process commits between the load that prefetched a state and its use:
    the loading connection keeps its snapshot's revision, a newer one gets the new."""
    storage, db = storage_and_db
    other_db = ZODB.DB(storage_factory.open(storage_factory.path))   # another process
    fill(db, START)                  # as many children as a first load brings along
    container = container_oid(db)
    storage.shared.cache.clear()
    old = polled(storage)
    children = children_of(old, container)                # the children prefetched at 0
    change_all(other_db, 1)
    before = storage.statement_count()
    assert {value_of(old, oid) for oid in children} == {0}
    assert storage.statement_count() - before == 0        # as prefetched, from the cache
    new = polled(storage)                                 # learns of the commit
    assert {value_of(new, oid) for oid in children} == {1}
    assert {value_of(old, oid) for oid in children} == {0}  # now from the database
    # The other way round: a newer snapshot prefetches, an older one loads after it.
    change_all(other_db, 2)
    newest = polled(storage)
    children_of(newest, container)                        # prefetches the revisions at 2
    assert {value_of(new, oid) for oid in children} == {1}
    assert {value_of(newest, oid) for oid in children} == {2}
    for instance in (old, new, newest):
        instance.release()
    other_db.close()


def test_what_a_load_brought_is_not_served_after_the_snapshot_moves(
        storage_factory: Any, storage_and_db: Any, polled: Any) -> None:
    """The instance holds what a batch brought for its loads (``Brought``), for the
    snapshot it was read at: once the same instance polls past a commit that changed
    them, its loads give the new states, not the ones it held."""
    storage, db = storage_and_db
    other_db = ZODB.DB(storage_factory.open(storage_factory.path))   # another process
    fill(db, START)
    container = container_oid(db)
    storage.shared.cache.clear()
    instance = polled(storage)
    children = children_of(instance, container)           # brought at 0, none asked for
    assert set(instance._brought.states) == {u64(oid) for oid in children}
    change_all(other_db, 1)
    instance.poll_invalidations()                         # the same instance moves on
    assert {value_of(instance, oid) for oid in children} == {1}
    other_db.close()


def brought_children(storage: Any, db: Any, polled: Any) -> tuple[Any, list[bytes]]:
    """A new instance that loaded a container of ``START`` children, cold: they came
    along (held by the instance, and in the shared cache); the instance, and their oids."""
    fill(db, START)
    container = container_oid(db)
    storage.shared.cache.clear()
    instance = polled(storage)
    return instance, children_of(instance, container)


def test_what_a_load_brought_serves_its_loads_and_counts_as_cache_hits(
        storage_and_db: Any, polled: Any) -> None:
    """Held by the instance, the batch serves its loads without a statement even where
    the shared cache no longer has it; the hits are counted there all the same, before
    the next miss or when the instance is released, and what the cache lost enters it
    again, as a load's state would."""
    storage, db = storage_and_db
    instance, children = brought_children(storage, db, polled)
    cache = storage.shared.cache
    hits = cache.hits
    with cache._lock:
        cache._drop_current()            # as if the shared cache had evicted them all
    before = storage.statement_count()
    assert {value_of(instance, oid) for oid in children} == {0}
    assert storage.statement_count() == before
    assert instance._brought.states == {}
    assert not any(cache.has(u64(oid), instance._snapshot) for oid in children)
    instance.release()
    assert cache.hits - hits == len(children)
    assert all(cache.has(u64(oid), instance._snapshot) for oid in children)


def test_a_released_instance_holds_nothing(storage_and_db: Any, polled: Any) -> None:
    """A ZODB connection back in its DB's pool releases its instance: what that held
    goes (it was never asked for), its hits counted."""
    storage, db = storage_and_db
    instance, children = brought_children(storage, db, polled)
    assert len(instance._brought.states) == len(children)
    value_of(instance, children[0])
    hits = storage.shared.cache.hits
    instance.release()
    assert instance._brought.states == {}
    assert storage.shared.cache.hits == hits + 1


def test_nothing_held_is_served_after_the_shared_cache_is_cleared(
        storage_and_db: Any, polled: Any) -> None:
    """A clear (a reset: the database went back in time) ends what an instance held:
    its loads read the database again."""
    storage, db = storage_and_db
    instance, children = brought_children(storage, db, polled)
    storage.shared.cache.clear()
    before = storage.statement_count()
    assert {value_of(instance, oid) for oid in children} == {0}
    assert storage.statement_count() > before


def test_a_sparse_walk_lowers_the_bound_and_a_full_walk_raises_it(storage_and_db: Any) -> None:
    storage, db = storage_and_db
    fill(db, 3000)
    prefetcher = storage.shared.prefetcher
    start = prefetcher.bound
    storage.shared.cache.clear()
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    conn.cacheMinimize()
    tm.begin()
    items = conn.root()["items"]
    before = storage.statement_count()
    sparse = [items[i]["v"] for i in range(0, 3000, 100)]  # one child in a hundred
    sparse_statements = storage.statement_count() - before
    assert sparse == [0] * 30
    assert prefetcher.bound < start // 4
    # Most of what is prefetched is never read: far fewer states than a full batch
    # per child, and one statement per child read, as without prefetch.
    assert prefetcher.prefetched < 2 * start + 30 * prefetcher.bound + 100
    # (SQLite: a miss while the bound is above 0 asks for the container's references
    # first, and the first load is the row with its references, then the others; the
    # container, 3,000 children, is over a 16th of the prefetch's bytes, so a pick by oid
    # leaves it out and it is read alone: ``LARGEST_SHARE``.)
    looks_ahead = always_picks(storage)
    assert sparse_statements <= (33 if looks_ahead else 31)
    before, statements = prefetcher.bound, storage.statement_count()
    assert [items[i]["v"] for i in range(3000)] == [0] * 3000   # now every child
    assert prefetcher.bound > before
    # The walk turned sequential at once (its misses are at consecutive oids), though
    # the loads at bound 0 queued no references: a few statements, not one per
    # PROBE_EVERY-th miss.
    assert storage.statement_count() - statements <= (21 if looks_ahead else 15)
    tm.abort()
    conn.close()


def test_a_cold_read_after_a_sparse_one_turns_sequential_though_nothing_was_queued(
        storage_and_db: Any) -> None:
    """A long-lived process read sparsely (the bound fell to 0), then reads another
    container whose states are not cached: loads at bound 0 queue no references, but
    its children's oids follow each other, so the second miss probes and the bound
    grows back (the bench's warm read after its sparse one: 33 statements before)."""
    storage, db = storage_and_db
    fill(db, 3000)
    with db.transaction() as conn:
        conn.root()["other"] = other = PersistentMapping()
        for i in range(1000):
            other[i] = PersistentMapping(v=0)
    prefetcher = storage.shared.prefetcher
    storage.shared.cache.clear()
    db.cacheMinimize()
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    tm.begin()
    items = conn.root()["items"]
    assert [items[i]["v"] for i in range(0, 3000, 100)] == [0] * 30
    assert prefetcher.bound == 0
    tm.abort()
    conn.cacheMinimize()
    storage.shared.cache.clear()
    tm.begin()
    before = storage.statement_count()
    assert [child["v"] for child in conn.root()["other"].values()] == [0] * 1000
    # SQLite: two or three statements a miss (the cold walk above).
    assert storage.statement_count() - before <= (
        16 if always_picks(storage) else 15) + begins_reading(storage)
    tm.abort()
    conn.close()


def having_read_alone(storage: Any, db: Any, read: Callable[[Any], None]) -> tuple[Any, Any]:
    """A transaction manager and its connection that did ``read(root)`` with prefetch
    off (what it read is cached alone), then the bound back at its limit, as after a
    full walk."""
    prefetcher = storage.shared.prefetcher
    limit = prefetcher.limit
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    prefetcher.limit = 0
    tm.begin()
    read(conn.root())
    tm.abort()
    prefetcher.limit = prefetcher.bound = limit
    return tm, conn


def test_the_siblings_a_parents_miss_brought_do_not_slow_the_walk_below_it(
        storage_factory: Any, storage_and_db: Any) -> None:
    """A reader of one container among many (the bench's warm read, beside the other
    writers' containers): the miss of their changed parent brings the containers it
    refers to, of which the reader uses one; that one batch does not halve the bound,
    so the container's children still come in one batch."""
    storage, db = storage_and_db
    writer = ZODB.DB(storage_factory.open(storage_factory.path))   # another process
    siblings, children = 2 * WINDOW, 1000
    with writer.transaction() as conn:
        conn.root()["bench"] = bench = PersistentMapping()
        for key in range(siblings):
            bench[key] = container = PersistentMapping()
            for i in range(children if key == 0 else 2):
                container[i] = PersistentMapping(v=0)
    prefetcher = storage.shared.prefetcher
    limit = prefetcher.limit
    tm, conn = having_read_alone(storage, db, lambda root: root._p_activate())
    with writer.transaction() as other:
        other.root()["bench"]["new"] = PersistentMapping()
    tm.begin()
    bench = conn.root()["bench"]
    bench._p_activate()                          # the parent's miss: its containers come
    looks_ahead = always_picks(storage)
    if not looks_ahead:
        assert prefetcher.prefetched >= siblings
    before = storage.statement_count()
    assert [child["v"] for child in bench[0].values()] == [0] * children
    # A batch (PostgreSQL: its first part and the rest sent ahead); before, four on
    # PostgreSQL and three on MySQL.  SQLite, whose client picks each batch (the
    # parent's miss brings nothing, the first child's its siblings), as it was.
    assert storage.statement_count() - before <= (12 if looks_ahead else 2)
    assert prefetcher.bound == limit
    tm.abort()
    conn.close()
    writer.close()


def test_a_changed_containers_miss_brings_the_child_added_not_the_old_ones(
        storage_factory: Any, storage_and_db: Any) -> None:
    """A container this process held, to which another process added a child: its miss
    brings the new child, not the older children this process never read.  (In oid
    order within the prefetch's bytes, the oldest came, the new one did not, and with
    none of its batch used the prefetch stopped: the bench's warm read beside the
    other writers' containers, from its sixteenth repetition.)"""
    storage, db = storage_and_db
    writer = ZODB.DB(storage_factory.open(storage_factory.path))   # another process
    old = 40
    with writer.transaction() as conn:
        conn.root()["bench"] = bench = PersistentMapping()
        for key in range(old):      # 1.6 MB: more than a prefetch brings
            bench[key] = PersistentMapping(data=b"x" * 40_000)
    tm, conn = having_read_alone(storage, db, lambda root: root["bench"]._p_activate())
    with writer.transaction() as other:
        other.root()["bench"]["new"] = PersistentMapping(v=1)
    tm.begin()
    bench = conn.root()["bench"]
    before = storage.statement_count()
    bench._p_activate()                          # the changed mapping's miss
    assert bench["new"]["v"] == 1                # came with it
    assert storage.statement_count() - before == 2 + begins_reading(storage)
    instance = conn._storage
    assert [key for key in range(old) if storage.shared.cache.has(
        u64(bench[key]._p_oid), instance._snapshot)] == []
    tm.abort()
    conn.close()
    writer.close()


def test_a_changed_objects_miss_brings_the_queued_oids_after_it_too(
        storage_factory: Any, storage_and_db: Any) -> None:
    """The oids a walk queued after an object that changed while held (a bucket
    another process added to) come in the statement of the references it added, as
    they come with any miss: the walk goes on without a statement more."""
    storage, db = storage_and_db
    writer = ZODB.DB(storage_factory.open(storage_factory.path))   # another process
    with writer.transaction() as conn:
        conn.root()["items"] = items = PersistentMapping()
        for i in range(10):
            items[i] = PersistentMapping(v=0)
    tm, conn = having_read_alone(storage, db, lambda root: root["items"][0]._p_activate())
    with writer.transaction() as other:
        other.root()["items"][0]["new"] = PersistentMapping(v=1)
    tm.begin()
    items = conn.root()["items"]
    children = [u64(items[i]._p_oid) for i in range(10)]
    # As the items' load reports their references: a walk's queue.
    storage.shared.prefetcher.loaded(u64(items._p_oid), [],
                                     [(u64(items._p_oid), child) for child in children])
    before = storage.statement_count()
    assert items[0]["new"]["v"] == 1                 # the changed one, and what it added
    assert [items[i]["v"] for i in range(10)] == [0] * 10
    assert storage.statement_count() - before == 2 + begins_reading(storage)
    tm.abort()
    conn.close()
    writer.close()


def test_a_changed_objects_added_reference_held_already_is_not_loaded_again(
        storage_factory: Any, storage_and_db: Any) -> None:
    """An object another process changed to refer to one this process holds (a child
    moved from one container to another): its miss is one statement, the held
    reference does not come again."""
    storage, db = storage_and_db
    writer = ZODB.DB(storage_factory.open(storage_factory.path))   # another process
    with writer.transaction() as conn:
        conn.root()["a"] = PersistentMapping(x=PersistentMapping(v=1))
        conn.root()["b"] = PersistentMapping()

    def read(root: Any) -> None:
        root["a"]["x"]._p_activate()
        root["b"]._p_activate()
    tm, conn = having_read_alone(storage, db, read)
    with writer.transaction() as other:
        other.root()["b"]["x"] = other.root()["a"]["x"]
    tm.begin()
    b = conn.root()["b"]
    before = storage.statement_count()
    b._p_activate()                              # changed: it refers to x now
    assert storage.statement_count() - before == 1 + begins_reading(storage)
    assert b["x"]["v"] == 1
    assert storage.statement_count() - before == 1 + begins_reading(storage)
    tm.abort()
    conn.close()
    writer.close()


def test_what_a_changed_object_added_comes_within_the_prefetch_bytes(
        storage_factory: Any, storage_and_db: Any) -> None:
    """The references a changed object added come within ``prefetch-bytes`` (past the
    first BYTES_STEP of them, no statement more once the bytes are reached), as any
    prefetch's."""
    storage, db = storage_and_db
    writer = ZODB.DB(storage_factory.open(storage_factory.path))   # another process
    with writer.transaction() as conn:
        conn.root()["items"] = PersistentMapping()
    tm, conn = having_read_alone(storage, db, lambda root: root["items"]._p_activate())
    added = BYTES_STEP + 44
    size = 2 * storage.shared.prefetcher.max_bytes // BYTES_STEP   # the first step: 2x
    with writer.transaction() as other:
        for i in range(added):
            other.root()["items"][i] = PersistentMapping(data=b"x" * size)
    tm.begin()
    items = conn.root()["items"]
    items._p_activate()                          # the changed mapping's miss
    snapshot = conn._storage._snapshot
    cached = [i for i in range(added)
              if storage.shared.cache.has(u64(items[i]._p_oid), snapshot)]
    assert cached == list(range(BYTES_STEP))
    tm.abort()
    conn.close()
    writer.close()

def test_what_a_changed_object_added_comes_within_the_prefetch_count(
        storage_factory: Any) -> None:
    """At most ``prefetch-count`` of the references a changed object added come."""
    storage = storage_factory.open(prefetch_count=5)
    db = ZODB.DB(storage)
    writer = ZODB.DB(storage_factory.open(storage_factory.path))   # another process
    try:
        with writer.transaction() as conn:
            conn.root()["items"] = PersistentMapping()
        tm, conn = having_read_alone(storage, db, lambda root: root["items"]._p_activate())
        with writer.transaction() as other:
            for i in range(20):
                other.root()["items"][i] = PersistentMapping(v=i)
        tm.begin()
        items = conn.root()["items"]
        items._p_activate()                      # the changed mapping's miss
        snapshot = conn._storage._snapshot
        assert [i for i in range(20) if storage.shared.cache.has(
            u64(items[i]._p_oid), snapshot)] == list(range(5))
        tm.abort()
        conn.close()
    finally:
        writer.close()
        db.close()

def test_a_changed_objects_miss_takes_it_off_the_queue(storage_factory: Any) -> None:
    """A changed object that a walk had queued leaves the queue at its miss, as any
    loaded oid does: the next miss before it brings the queued oids after it, not a
    place taken by one already loaded."""
    storage = storage_factory.open(prefetch_count=2)
    db = ZODB.DB(storage)
    writer = ZODB.DB(storage_factory.open(storage_factory.path))   # another process
    try:
        with writer.transaction() as conn:
            conn.root()["x"] = PersistentMapping(v=0)
            conn.root()["items"] = PersistentMapping({i: PersistentMapping(v=i)
                                                      for i in range(5)})
        with writer.transaction() as other:
            items = other.root()["items"]
            parent, x = u64(items._p_oid), u64(other.root()["x"]._p_oid)
            first, *after = [u64(items[i]._p_oid) for i in range(5)]
        tm, conn = having_read_alone(storage, db, lambda root: root["x"]._p_activate())
        with writer.transaction() as other:
            other.root()["x"]["y"] = PersistentMapping(v=1)
        tm.begin()
        storage.shared.prefetcher.loaded(parent, [], [
            (parent, oid) for oid in (first, x, *after)])
        assert conn.root()["x"]["y"]["v"] == 1       # x's miss, and what it added
        instance = conn._storage
        # x's miss brought y and the first queued after it; the next miss brings two.
        instance.load(p64(first))
        assert [storage.shared.cache.has(oid, instance._snapshot) for oid in after] == [
            True, True, True, False]
        tm.abort()
        conn.close()
    finally:
        writer.close()
        db.close()


def test_a_changed_objects_read_conflict_brings_nothing_it_added(
        storage_factory: Any, storage_and_db: Any, polled: Any) -> None:
    """History-free, an object changed again after the snapshot (its read transaction
    ended, the next one sees the newer row) is a read conflict, and what the newer row
    refers to is not loaded.  History-preserving, the snapshot's revision comes, and
    the reference it added with it."""
    storage, db = storage_and_db
    writer = ZODB.DB(storage_factory.open(storage_factory.path))   # another process
    with writer.transaction() as conn:
        conn.root()["x"] = PersistentMapping(v=0)
    with writer.transaction() as conn:
        oid = conn.root()["x"]._p_oid
    instance = polled(storage)
    prefetcher = storage.shared.prefetcher
    limit, prefetcher.limit = prefetcher.limit, 0
    instance.load(oid)                           # held alone
    prefetcher.limit = prefetcher.bound = limit
    with writer.transaction() as conn:
        conn.root()["x"]["y"] = PersistentMapping(v=1)
    with writer.transaction() as conn:
        y = u64(conn.root()["x"]["y"]._p_oid)
    instance.poll_invalidations()                # x's state then is kept
    snapshot = instance._snapshot
    with writer.transaction() as conn:
        conn.root()["x"]["z"] = PersistentMapping(v=2)
    instance._end_read_txn()
    if storage_factory.param.keep_history:
        state, tid = instance.load(oid)
        assert u64(tid) <= snapshot and b"z" not in state
        assert storage.shared.cache.has(y, snapshot)
    else:
        with pytest.raises(POSException.ReadConflictError):
            instance.load(oid)
        assert not storage.shared.cache.has(y, snapshot)
    writer.close()

def test_a_changed_objects_corrupt_state_brings_nothing_it_names(
        storage_factory: Any, storage_and_db: Any) -> None:
    """A changed object whose new state does not match its checksum is reported, and
    the references read from those bytes are not followed."""
    storage, db = storage_and_db
    writer = ZODB.DB(storage_factory.open(storage_factory.path))   # another process
    with writer.transaction() as conn:
        conn.root()["x"] = PersistentMapping(v=0)
        conn.root()["z"] = PersistentMapping(w=PersistentMapping(v=9))
    tm, conn = having_read_alone(storage, db, lambda root: root["x"]._p_activate())
    with writer.transaction() as other:
        other.root()["x"]["y"] = PersistentMapping(v=1)
    with writer.transaction() as other:
        x, z = other.root()["x"]._p_oid, other.root()["z"]._p_oid
        w = u64(other.root()["z"]["w"]._p_oid)
        referring_to_w = other._storage.load(z)[0]
    run_sql(storage, CORRUPT, (referring_to_w, u64(x)))     # x's bytes now name w
    tm.begin()
    with pytest.raises(CorruptRecordError):
        conn.root()["x"]._p_activate()
    assert not storage.shared.cache.has(w, conn._storage._snapshot)
    tm.abort()
    conn.close()
    writer.close()

def test_a_bound_of_one_still_brings_a_reference(storage_factory: Any, polled: Any) -> None:
    """The bound is how many states come along: at 1 (``prefetch-count 1``, or the
    last step before the prefetch stops), one comes."""
    storage = storage_factory.open(prefetch_count=1)
    db = ZODB.DB(storage)
    try:
        oids = fill(db, 3)
        storage.shared.cache.clear()
        instance = polled(storage)
        assert storage.shared.prefetcher.bound == 1
        instance.load(container_oid(db))
        assert [storage.shared.cache.has(u64(oid), instance._snapshot)
                for oid in oids] == [True, False, False]
    finally:
        db.close()


def test_a_miss_brings_the_queued_oids_the_cache_does_not_hold_only(
        storage_and_db: Any, polled: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Of the oids a walk queued, a miss brings those the cache does not hold (some
    came since they were queued)."""
    storage, db = storage_and_db
    oids = [u64(oid) for oid in fill(db, 10)]
    storage.shared.cache.clear()
    instance = polled(storage)
    container = u64(container_oid(db))
    storage.shared.prefetcher.loaded(container, [], [(container, oid) for oid in oids])
    instance.prefetch([p64(oid) for oid in oids[::2]])      # cached after they queued
    mover = storage.shared.backend.mover
    asked: list[int] = []
    load_many_at, load_with_references = mover.load_many_at, mover.load_with_references

    def many(conn: Any, wanted: Any, *args: Any, **kw: Any) -> Any:
        asked.extend(wanted)
        return load_many_at(conn, wanted, *args, **kw)

    def with_references(conn: Any, oid: int, snapshot: int, also: Any, *args: Any) -> Any:
        asked.extend(also)
        return load_with_references(conn, oid, snapshot, also, *args)
    monkeypatch.setattr(mover, "load_many_at", many)
    monkeypatch.setattr(mover, "load_with_references", with_references)
    instance.load(p64(oids[1]))
    assert set(oids[3::2]) <= set(asked)
    assert not set(oids[::2]) & set(asked)

def test_a_load_queues_the_references_of_what_came_with_it(storage_and_db: Any,
                                                             polled: Any) -> None:
    """Where the statement picks what comes (PostgreSQL past a container's children,
    MySQL always), the references of the states that came are queued too (up to
    ``REFERENCES_PER_STATE`` each a batch): the grandchildren of a container loaded
    cold come in one batch at the first one's miss, not a statement each."""
    storage, db = storage_and_db
    if always_picks(storage):
        pytest.skip("SQLite's client picks what comes at each miss: no statement queues")
    with db.transaction() as conn:
        conn.root()["items"] = PersistentMapping({
            i: PersistentMapping(child=PersistentMapping(v=i)) for i in range(20)})
    with db.transaction() as conn:
        items = conn.root()["items"].values()
        children = [(item._p_oid, item["child"]._p_oid) for item in items]
    storage.shared.cache.clear()
    prefetcher = storage.shared.prefetcher
    prefetcher.bound = prefetcher.limit                 # a warm process's bound
    instance = polled(storage)
    instance.load(container_oid(db))                    # the children come along
    before = storage.statement_count()
    for child, grandchild in children:                  # as a walk reads them
        instance.load(child)
        instance.load(grandchild)
    assert storage.statement_count() - before == 1

def test_a_cold_walk_of_objects_with_a_sub_object_each_is_a_few_statements(
        storage_factory: Any, storage_and_db: Any) -> None:
    """A container whose children each hold a sub-object of their own (a content item
    and its annotations), walked cold into both: the sub-objects come in batches.  (On
    SQLite, whose client picks at each miss, the miss of a child's only sub-object
    brought nothing else: a statement a sub-object, 1,005 for 1,000 children.)"""
    storage, db = storage_and_db
    with db.transaction() as conn:
        conn.root()["items"] = PersistentMapping({
            i: PersistentMapping(child=PersistentMapping(v=i)) for i in range(1000)})
    prefetcher = storage.shared.prefetcher
    prefetcher.bound = prefetcher.limit                 # a warm process's bound
    storage.shared.cache.clear()
    db.cacheMinimize()
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    before = storage.statement_count()
    tm.begin()
    assert [item["child"]["v"] for item in conn.root()["items"].values()] == list(
        range(1000))
    statements = storage.statement_count() - before
    tm.abort()
    conn.close()
    # SQLite: up to CLIMB_LOOKED_INTO sub-objects a miss, in two or three statements
    # (19 in all; with 64 a miss, 59).
    assert statements <= (30 if always_picks(storage) else 10), statements


def test_prefetch_of_more_oids_than_one_statement_lists_serves_them_all(
        storage_and_db: Any, polled: Any) -> None:
    """Past MAX_LISTED_OIDS the oids go in further statements; every state of every
    statement is cached, none is asked for again."""
    storage, db = storage_and_db
    count = storage.shared.backend.mover.MAX_LISTED_OIDS + 200
    if count > 5000:
        count = 1200            # PostgreSQL lists any number in one array
    oids = fill(db, count)
    storage.shared.cache.clear()
    instance = polled(storage)
    instance.prefetch(oids)
    before = storage.statement_count()
    assert [value_of(instance, oid) for oid in oids] == [0] * count
    assert storage.statement_count() - before == 0
    instance.release()


def test_a_corrupt_state_is_not_prefetched(storage_and_db: Any, polled: Any) -> None:
    """A state whose bytes do not match its stored checksum stays out of the cache:
    its load reads it again and reports it."""
    storage, db = storage_and_db
    oids = fill(db, 3)
    run_sql(storage, CORRUPT, (b"not what was stored", u64(oids[1])))
    storage.shared.cache.clear()
    instance = polled(storage)
    instance.prefetch(oids)
    before = storage.statement_count()
    assert (value_of(instance, oids[0]), value_of(instance, oids[2])) == (0, 0)
    assert storage.statement_count() == before      # the states around it came
    with pytest.raises(CorruptRecordError,
                       match=f"oid 0x{u64(oids[1]):016x} .*: the state does not match"):
        instance.load(oids[1])
    instance.release()


def test_a_corrupt_state_missed_beside_its_cached_parent_is_reported(
        storage_and_db: Any, polled: Any) -> None:
    """A miss whose parent is cached comes with its siblings (on SQLite, the client's
    batch by oid): its own state is checked against its checksum as a lone load's is."""
    storage, db = storage_and_db
    oids = fill(db, 20)
    run_sql(storage, CORRUPT, (b"not what was stored", u64(oids[10])))
    storage.shared.cache.clear()
    instance = polled(storage)
    instance.load(container_oid(db))          # the parent, cached
    assert value_of(instance, oids[9]) == 0
    with pytest.raises(CorruptRecordError):
        instance.load(oids[10])
    instance.release()


def test_an_instance_that_never_polled_prefetches_nothing(storage_and_db: Any) -> None:
    """Without a snapshot there is nothing to read states as of: its loads go to the
    database without the cache."""
    storage, db = storage_and_db
    oids = fill(db, 3)
    instance = storage.new_instance()
    try:
        before = storage.statement_count()
        instance.prefetch(oids)
        assert storage.statement_count() == before
        assert value_of(instance, oids[0]) == 0
    finally:
        instance.release()


class TestAStateNewerThanTheSnapshot:
    history_modes = (False,)
    history_modes_reason = ("a history-preserving prefetch reads the revisions its"
                            " snapshot sees, never a newer one")

    def test_is_left_out_and_the_others_cached(self, storage_factory: Any,
                                               storage_and_db: Any, polled: Any) -> None:
        storage, db = storage_and_db
        oids = fill(db, 3)
        assert oids[0] == min(oids)          # the first row the prefetch reads
        storage.shared.cache.clear()
        instance = polled(storage)
        snapshot = instance.lastTransaction()
        instance.afterCompletion()           # the next read begins a new read transaction
        other = ZODB.DB(storage_factory.open(storage_factory.path))   # another process
        with other.transaction() as conn:
            conn.root()["items"][0]["v"] = 1
        newer = other.storage.lastTransaction()
        other.close()
        instance.prefetch(oids)
        before = storage.statement_count()
        assert [value_of(instance, oid) for oid in oids[1:]] == [0, 0]
        assert storage.statement_count() == before
        with pytest.raises(POSException.ReadConflictError) as raised:
            instance.load(oids[0])
        assert (raised.value.oid, raised.value.serials) == (oids[0], (newer, snapshot))


def test_oid_lists_up_to_512_use_ten_statement_texts(storage_factory: Any) -> None:
    """The oids of a prefetch are padded (repeating the last) to a power of two, so
    that a few statement texts serve every length and stay in the driver's cache;
    longer lists (rarer, and padding would double them) go unpadded."""
    mover = storage_factory.open().shared.backend.mover
    texts = set()
    for count in range(1, 513):
        oids = list(range(1000, 1000 + count))
        text, params = mover.listed(oids)
        texts.add(text)
        if text.startswith("IN"):
            assert params[:count] == oids and set(params[count:]) <= {oids[-1]}
            assert len(params) & (len(params) - 1) == 0 and len(params) < 2 * count
        else:                   # PostgreSQL: one array parameter, one text
            assert params == [oids]
    assert len(texts) <= 10
    for count in (513, 700, 1000):      # above 512 the list goes as it is
        oids = list(range(1000, 1000 + count))
        text, params = mover.listed(oids)
        assert params == (oids if text.startswith("IN") else [oids])


def two_revisions(storage_factory: Any, storage_and_db: Any, polled: Any
                  ) -> tuple[int, int, list[tuple[Any, int]]]:
    """A container of 300 children, then a revision without children 0 and 10 (written
    with another mapping that refers to children 7 and 8), then an unrelated commit:
    child 0's oid, the container's, and (instance, children) of the instances that read
    each revision (history-free, an instance reads the newest revisions: only the new
    one).  The container's revision is never the snapshot's own tid, nor the only state
    its commit wrote, and the revisions differ after the 6th child too."""
    storage, db = storage_and_db
    removed = u64(fill(db, 300)[0])
    container = u64(container_oid(db))
    old = polled(storage)
    with db.transaction() as conn:
        items = conn.root()["items"]
        conn.root()["other"] = PersistentMapping(a=items[7], b=items[8])
        del items[0], items[10]
    with db.transaction() as conn:
        conn.root()["unrelated"] = 1
    new = polled(storage)
    keep_history = storage_factory.param.keep_history
    return removed, container, ([(old, 300)] if keep_history else []) + [(new, 298)]


def sized_children(db: Any) -> tuple[int, int, int]:
    """A mapping of three children of about 100, 2,000 and 8,000 bytes: their oids
    (and, beside it under the root, a mapping of 8,000 bytes too)."""
    with db.transaction() as conn:
        conn.root()["large"] = PersistentMapping(data=b"x" * 8000)
        conn.root()["sized"] = sized = PersistentMapping()
        for name, size in (("small", 100), ("middle", 2000), ("large", 8000)):
            sized[name] = PersistentMapping(data=b"x" * size)
    with db.transaction() as conn:
        sized = conn.root()["sized"]
        return u64(sized["small"]._p_oid), u64(sized["middle"]._p_oid), u64(
            sized["large"]._p_oid)


def test_a_pick_by_oid_leaves_out_the_states_over_a_size(
        storage_factory: Any, storage_and_db: Any, polled: Any) -> None:
    """``load_many_at``'s ``largest``, on every backend: a state stored larger is left
    out, one of exactly that size comes; history-preserving, the size is that of the
    revision the snapshot sees."""
    storage, db = storage_and_db
    small, middle, large = sized_children(db)
    instance = polled(storage)
    mover = storage.shared.backend.mover
    conn, snapshot = instance._snapshot_conn(), instance._snapshot
    sizes = state_sizes(conn, [small, middle, large])
    assert sizes[small] < sizes[middle] < sizes[large]

    def came(oids: list[int], largest: int | None) -> list[int]:
        return sorted(each.oid for each in mover.load_many_at(conn, oids, snapshot,
                                                              largest=largest))
    everything = sorted([small, middle, large])
    assert came([large, small, middle], None) == everything
    assert came([large, small, middle], sizes[large]) == everything
    assert came([large, small, middle], sizes[middle]) == sorted([small, middle])
    assert came([small, large, middle], sizes[middle] - 1) == [small]
    assert came([small, large, middle], sizes[small] - 1) == []
    # With a bound on bytes as well, over more than one statement.
    many = [small, *range(10 ** 12, 10 ** 12 + BYTES_STEP), large, middle]
    found = mover.load_many_at(conn, many, snapshot, 1 << 20, largest=sizes[middle])
    assert sorted(each.oid for each in found) == sorted([small, middle])
    if storage_factory.param.keep_history:
        with db.transaction() as writer:
            writer.root()["sized"]["small"]["data"] = b"x" * 9000
        later = polled(storage)
        assert [each.oid for each in mover.load_many_at(
            later._snapshot_conn(), [large, small], later._snapshot,
            largest=sizes[small])] == []
        # The instance before the change still reads the small revision: it comes.
        assert came([large, small], sizes[small]) == [small]


def test_a_pick_by_oid_takes_as_many_as_the_bytes_left_hold(
        storage_and_db: Any, polled: Any) -> None:
    """``load_many_at`` with ``max_bytes``, on every backend: BYTES_STEP oids first, then
    as many as the bytes left hold at the sizes seen, in order, each oid once, until the
    bytes are reached (the states here are all of one size)."""
    storage, db = storage_and_db
    with db.transaction() as conn:
        conn.root()["even"] = even = PersistentMapping()
        for i in range(1300):
            even[i] = PersistentMapping(v=b"x" * 150)
    with db.transaction() as conn:
        oids = [u64(child._p_oid) for child in conn.root()["even"].values()]
    instance = polled(storage)
    mover = storage.shared.backend.mover
    conn, snapshot = instance._snapshot_conn(), instance._snapshot
    size = len(instance.load(p64(oids[0]))[0])
    listed = mover.MAX_LISTED_OIDS

    def pick(max_bytes: int, wanted: list[int] = oids) -> tuple[list[int], int]:
        before = storage.statement_count()
        came = [each.oid for each in mover.load_many_at(conn, wanted, snapshot, max_bytes)]
        assert len(came) == len(set(came))
        return sorted(came), storage.statement_count() - before
    assert pick(BYTES_STEP * size) == (sorted(oids[:BYTES_STEP]), 1)
    assert pick((BYTES_STEP + 100) * size) == (sorted(oids[:BYTES_STEP + 100]), 2)
    assert pick(BYTES_STEP * size + size // 2) == (sorted(oids[:BYTES_STEP + 1]), 2)
    assert pick(BYTES_STEP * size + 3 * size // 2) == (sorted(oids[:BYTES_STEP + 2]), 3)
    # The size seen is that of the states that came: one of the first BYTES_STEP (the
    # others do not exist), so the next statement lists as many as 10 of it hold.
    missing = list(range(10 ** 12, 10 ** 12 + BYTES_STEP - 1))
    assert pick(11 * size, [oids[0], *missing, *oids[1:]]) == (sorted(oids[:11]), 2)
    # Room for all: the rest in statements of MAX_LISTED_OIDS.
    rest = len(oids) - BYTES_STEP
    assert pick(10 * len(oids) * size) == (sorted(oids), 1 + -(-rest // listed))


def test_a_miss_brings_no_sibling_over_a_share_of_the_prefetch_bytes(
        storage_and_db: Any, polled: Any) -> None:
    """Where the client picks (SQLite), a miss on a child brings its siblings but not
    one larger than a 16th of prefetch-bytes (``LARGEST_SHARE``: the bench's root names
    every container written before, 270 KB each, and a cold read paid ~3 ms for them);
    that one is read at its own load, right.  On every backend each child reads right."""
    storage, db = storage_and_db
    small, middle, large = sized_children(db)
    storage.shared.cache.clear()
    instance = polled(storage)
    with db.transaction() as conn:
        sized = conn.root()["sized"]._p_oid
        beside = u64(conn.root()["large"]._p_oid)
    middle_size = state_sizes(instance._snapshot_conn(), [middle])[middle]
    instance.shared.prefetcher.max_bytes = 16 * middle_size   # the middle one at its 16th
    instance.load(p64(0))                      # no cached parent: its references come
    cache, snapshot = storage.shared.cache, instance._snapshot
    if always_picks(storage):
        assert cache.has(u64(sized), snapshot) and not cache.has(beside, snapshot)
    instance.load(sized)
    instance.load(p64(small))                  # its parent cached: its siblings come
    if always_picks(storage):
        assert cache.has(middle, snapshot) and not cache.has(large, snapshot)
    for oid, size in ((small, 100), (middle, 2000), (large, 8000)):
        assert mapping_data(instance.load(p64(oid))[0])["data"] == b"x" * size


def test_a_parents_references_after_a_child_and_a_load_with_its_first(
        storage_factory: Any, storage_and_db: Any, polled: Any) -> None:
    """What a client that looks ahead asks the database (``references_after``,
    ``load_and_references``) is answered from the revision its snapshot sees, on every
    backend: the portable versions read ``object_ref``, SQLite cuts the revision's text."""
    removed, container, cells = two_revisions(storage_factory, storage_and_db, polled)
    mover = storage_and_db[0].shared.backend.mover
    for instance, children in cells:
        conn, snapshot = instance._snapshot_conn(), instance._snapshot
        held = sorted(u64(oid) for oid in children_of(instance, p64(container)))
        assert len(held) == children and (removed in held) == (children == 300)
        row, first = mover.load_and_references(conn, container, snapshot, 5)
        assert row is not None and row.tid == u64(instance.load(p64(container))[1])
        assert first == held[:5]
        for at in (0, 1, 150, children - 2, children - 1):
            assert mover.references_after(conn, container, held[at], snapshot,
                                          8) == held[at + 1:at + 9], at
        assert mover.references_after(conn, container, container, snapshot, 8) is None
        assert mover.references_after(conn, 10 ** 12, held[0], snapshot, 8) is None
        assert mover.load_and_references(conn, held[3], snapshot, 5)[1] == []
        assert mover.load_and_references(conn, 10 ** 12, snapshot, 5) == (None, [])
    conn, snapshot = instance._snapshot_conn(), instance._snapshot     # the new one
    assert mover.references_after(conn, container, removed, snapshot, 8) is None


def test_a_batch_with_the_first_references_of_each_of_its_states(
        storage_factory: Any, storage_and_db: Any, polled: Any) -> None:
    """``load_many_with_references`` (what PostgreSQL's client asks when it picks a
    container's children) answers as ``load_many_at`` and with the first references of
    each revision the snapshot sees, on every backend: the portable version reads
    ``object_ref``, PostgreSQL cuts each row's ``refs``."""
    removed, container, cells = two_revisions(storage_factory, storage_and_db, polled)
    mover = storage_and_db[0].shared.backend.mover
    for instance, children in cells:
        conn, snapshot = instance._snapshot_conn(), instance._snapshot
        held = sorted(u64(oid) for oid in children_of(instance, p64(container)))
        wanted = [container, *held[:40], 10 ** 12]        # the last one does not exist
        states, references = mover.load_many_with_references(conn, wanted, snapshot,
                                                             None, 7)
        assert sorted(states) == sorted(mover.load_many_at(conn, wanted, snapshot))
        assert sorted(each.oid for each in states) == sorted(wanted[:-1])
        by_oid = {each.oid: each for each in states}
        assert by_oid[container].tid == u64(instance.load(p64(container))[1])
        # The container's first 7 (its children hold no persistent references).
        assert sorted(references) == [(container, each) for each in held[:7]]
        assert (container, removed) in references or children == 298
        states, references = mover.load_many_with_references(conn, wanted, snapshot,
                                                             None, 0)
        assert len(states) == 41 and references == []
        assert mover.load_many_with_references(conn, [], snapshot, None, 7) == ([], [])
        # With a bound on bytes, those that came before it was reached: PostgreSQL
        # counts them in its statement, in the order asked; the others a statement of
        # 256 at a time.
        small = mover.load_many_with_references(conn, held[:40], snapshot, 1, 7)[0]
        if storage_factory.param.backend == "postgresql":
            assert [each.oid for each in small] == held[:1]
        else:
            assert {each.oid for each in small} == set(held[:40])


def test_a_load_with_references_brings_a_childs_siblings_from_its_snapshots_parent(
        storage_factory: Any, storage_and_db: Any, polled: Any) -> None:
    """A miss of a child, its parent among the candidates given, brings the parent's
    references after it, read from the parent's revision its snapshot sees, and names
    them (with PostgreSQL's also the parent's first ones before it, at most
    ``FIRST_OF_PARENT``); with no candidate referring to it, nothing comes.  A load of
    the container names its own first references from its revision at the snapshot."""
    removed, container, cells = two_revisions(storage_factory, storage_and_db, polled)
    mover = storage_and_db[0].shared.backend.mover
    server = storage_factory.param.backend == "postgresql"
    limit, root = 8, 0                   # the root refers to the container alone
    for instance, children in cells:
        conn, snapshot = instance._snapshot_conn(), instance._snapshot
        held = sorted(u64(oid) for oid in children_of(instance, p64(container)))
        assert (removed in held) == (children == 300)
        for at in (5, 20):
            after = held[at + 1:at + 1 + limit]
            before = held[:min(at, FIRST_OF_PARENT)] if server else []
            _, states, references = mover.load_with_references(
                conn, held[at], snapshot, [], limit, 10 ** 8, 10 ** 6, [root, container])
            assert sorted(s.oid for s in states) == after, (children, at)
            assert sorted(references) == sorted((container, each)
                                                for each in after + before), (children, at)
            assert mover.load_with_references(conn, held[at], snapshot, [], limit,
                                              10 ** 8, 10 ** 6, [root])[1:] == ([], [])
        # History-preserving, a candidate is tested by its current revision, which no
        # longer refers to the removed child, even from the old snapshot (testing every
        # revision would read a parent's whole history at each miss).
        assert mover.load_with_references(conn, removed, snapshot, [], limit, 10 ** 8,
                                          10 ** 6, [root, container])[1:] == ([], [])
        _, states, references = mover.load_with_references(conn, container, snapshot, [],
                                                           limit, 10 ** 8, 10 ** 6)
        assert sorted(s.oid for s in states) == held[:limit]
        assert sorted(references) == [(container, each) for each in held[:REFERENCES_EACH]]


def test_a_load_with_references_walks_on_from_what_it_did_not_refer_to(
        storage_factory: Any, storage_and_db: Any) -> None:
    """PostgreSQL's statement walks on from the listed states, never from the loaded
    state's own references (a listed oid among them is one of them), through each
    walked object's current references, and never brings the loaded state along; the
    others bring the references and the listed states only.  Within a bound of bytes
    the states come in the order they were found."""
    storage, db = storage_and_db
    with db.transaction() as conn:
        root = conn.root()
        root["o"] = loaded = PersistentMapping(x=PersistentMapping(g=PersistentMapping()))
        root["y"] = listed = PersistentMapping(back=loaded, old=PersistentMapping())
    with db.transaction() as conn:
        listed = conn.root()["y"]
        del listed["old"]                        # history-preserving: an old reference
        listed["z"] = PersistentMapping()
    with db.transaction() as conn:
        loaded, listed = conn.root()["o"], conn.root()["y"]
        o, x, g = (u64(each._p_oid) for each in (loaded, loaded["x"], loaded["x"]["g"]))
        y, z = u64(listed._p_oid), u64(listed["z"]._p_oid)
    mover = storage.shared.backend.mover
    walks = storage_factory.param.backend == "postgresql"
    conn = storage.shared.backend.connect()
    try:
        snapshot = u64(db.storage.lastTransaction())

        def brought(also: list[int], max_bytes: int = 10 ** 8) -> list[int]:
            states = mover.load_with_references(conn, o, snapshot, also, 1000, max_bytes,
                                                10 ** 6)[1]
            return sorted(each.oid for each in states)
        assert brought([x]) == [x]               # x is o's own: not walked from
        assert brought([y]) == sorted([x, y, z, g] if walks else [x, y])
        size_of = state_sizes(conn, [x, y])
        assert size_of[y] > size_of[x]
        assert brought([y], size_of[x]) == [x]   # found first, before y
    finally:
        conn.close()


def test_where_the_client_picks_a_batch(storage_factory: Any, storage_and_db: Any,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's client picks every batch; PostgreSQL's only a container's children not
    cached, at least ``LOOKAHEAD_AT_LEAST`` of them (one plain statement by oid instead
    of the prefetching one, which finds them and walks on); MySQL's none."""
    storage, db = storage_and_db
    fill(db, 1000)
    mover = storage.shared.backend.mover
    picked: list[int] = []
    load_many_with_references = mover.load_many_with_references

    send_load_many_with_references = mover.send_load_many_with_references

    def recorded(conn: Any, oids: Any, *args: Any) -> Any:
        picked.append(len(oids))
        return load_many_with_references(conn, oids, *args)

    def sent(conn: Any, oids: Any, *args: Any) -> Any:
        picked.append(len(oids))
        return send_load_many_with_references(conn, oids, *args)
    monkeypatch.setattr(mover, "load_many_with_references", recorded)
    monkeypatch.setattr(mover, "send_load_many_with_references", sent)
    storage.shared.prefetcher.bound = storage.shared.prefetcher.limit   # a warm process
    statements = cold_walk(storage, db)
    backend = storage_factory.param.backend
    if backend == "postgresql":
        assert mover.LOOKAHEAD_AT_LEAST is not None and mover.LOOKS_AHEAD
        # The root with the container and its first children, by the statement; the
        # other children in one pick, its first SEND_AHEAD_AFTER read at once and the
        # rest sent ahead.
        assert picked and min(picked) >= mover.LOOKAHEAD_AT_LEAST
        assert picked[0] == SEND_AHEAD_AFTER + 1, picked     # the miss and 128 more
        assert sum(picked) >= 900 and statements <= 5, (picked, statements)
    else:
        assert picked == []
        assert always_picks(storage) == (backend == "sqlite")


def picked(instance: Any, conn: Any, oid: int, snapshot: int, at_least: int) -> Any:
    """The row of ``oid`` as PostgreSQL's client pick loads it (``_load_at``'s steps),
    with a bound of 1,000; the pick must be taken."""
    siblings = instance._siblings_to_pick(oid, snapshot, 1000, at_least)
    assert siblings is not None
    return instance._load_batch(conn, oid, snapshot, siblings, True)


def test_a_pick_among_a_cached_containers_children(storage_and_db: Any, polled: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``_siblings_to_pick`` and ``_load_batch``, PostgreSQL's client pick: the miss's
    uncached siblings after it, at least as many as asked, come in one statement
    bounded in bytes, their first references queued; fewer, and the statement chooses;
    the miss's row is checked, and missing, as a lone load's.  (Nothing is sent ahead
    here: see the next test.)"""
    storage, db = storage_and_db
    if storage.shared.backend.mover.LOOKAHEAD_AT_LEAST is None:
        pytest.skip("only a mover with its prefetching statement picks among siblings")
    monkeypatch.setattr(storage_module, "SEND_AHEAD_AFTER", 10 ** 6)
    with db.transaction() as conn:
        conn.root()["items"] = items = PersistentMapping()
        for i in range(300):
            items[i] = PersistentMapping(v=0, sub=PersistentMapping())
    with db.transaction() as conn:
        subs = {u64(child["sub"]._p_oid) for child in conn.root()["items"].values()}
    container = u64(container_oid(db))
    instance = polled(storage)
    held = sorted(u64(oid) for oid in children_of(instance, p64(container)))
    run_sql(storage, CORRUPT, (b"not what was stored", held[5]))
    run_sql(storage, CORRUPT, (b"\x00\x5a" + b"not a sealed record", held[7]))
    prefetcher, cache = storage.shared.prefetcher, storage.shared.cache
    instance = polled(storage)
    conn, snapshot = instance._snapshot_conn(), instance._snapshot
    state, tid = instance.load(p64(container))

    def only_the_parent_cached() -> None:
        cache.clear()
        cache.after_poll(snapshot, snapshot, [])       # as a first poll there
        cache.put_loaded(container, u64(tid), state, snapshot)
        prefetcher.note_parent(container)

    only_the_parent_cached()
    prefetcher.loaded(held[0], [], [(held[0], held[1])])      # held[1] queued
    assert held[1] in prefetcher._position
    # 299 other children (after held[1], then before it), none cached: a pick needs
    # at least as many as asked for.
    before = storage.statement_count()
    assert instance._siblings_to_pick(held[1], snapshot, 1000, 300) is None
    assert storage.statement_count() == before
    row = picked(instance, conn, held[1], snapshot, 299)
    assert storage.statement_count() == before + 1             # one statement
    assert isinstance(row, StateRow) and row.checksum is not None
    assert subs <= set(prefetcher._position)                   # their references queued
    assert held[1] not in prefetcher._position                 # loaded: off the queue
    assert (row.tid, row.state) == (u64(instance.load(p64(held[1]))[1]),
                                    instance.load(p64(held[1]))[0])
    others = set(held) - {held[1]}
    assert {oid for oid in others if cache.has(oid, snapshot)} == (
        others - {held[5], held[7]})                           # those that check and open

    # A corrupt state comes with its stored checksum, which its load checks.
    row = picked(instance, conn, held[5], snapshot, 1)
    assert isinstance(row, StateRow) and row.state == b"not what was stored"
    with pytest.raises(CorruptRecordError):
        verified(held[5], row.tid, row.checksum, row.state)
    # One that does not open is not in the batch: its own load says why.
    with pytest.raises(CorruptRecordError):
        picked(instance, conn, held[7], snapshot, 1)
    # The batch stops at prefetch-bytes.
    only_the_parent_cached()
    prefetcher.max_bytes = 3 * len(instance.load(p64(held[20]))[0])
    only_the_parent_cached()
    picked(instance, conn, held[20], snapshot, 10)
    assert 0 < sum(cache.has(oid, snapshot) for oid in held[21:]) <= 3


def sent_ahead_setup(storage: Any, db: Any, polled: Any) -> tuple[Any, Any, int, list[int]]:
    """300 children; a polled instance whose cache holds only their container; a pick
    for the second child: the miss and SEND_AHEAD_AFTER more read, the rest sent."""
    with db.transaction() as conn:
        conn.root()["items"] = items = PersistentMapping()
        for i in range(300):
            items[i] = PersistentMapping(v=i)
    container = u64(container_oid(db))
    instance = polled(storage)
    held = sorted(u64(oid) for oid in children_of(instance, p64(container)))
    conn, snapshot = instance._snapshot_conn(), instance._snapshot
    state, tid = instance.load(p64(container))
    cache = storage.shared.cache
    cache.clear()
    cache.after_poll(snapshot, snapshot, [])           # as a first poll there
    cache.put_loaded(container, u64(tid), state, snapshot)
    storage.shared.prefetcher.note_parent(container)
    return instance, conn, snapshot, held


def expected_states(storage: Any, oids: list[int], snapshot: int) -> dict[int, bytes]:
    """The states of ``oids`` at ``snapshot`` read one by one on a session of their own."""
    conn = storage.shared.backend.connect()
    try:
        mover = storage.shared.backend.mover
        found = {oid: mover.load_at(conn, oid, snapshot) for oid in oids}
        return {oid: row.state for oid, row in found.items() if row is not None}
    finally:
        conn.close()


def test_a_large_pick_sends_the_rest_ahead(storage_and_db: Any, polled: Any) -> None:
    """Where the mover ``SENDS_AHEAD`` (PostgreSQL), a pick of more than
    SEND_AHEAD_AFTER children reads those at once and sends the rest in pipeline mode;
    the next miss takes its rows without a statement of its own, every one cached at
    the snapshot, and the states are what the database holds."""
    storage, db = storage_and_db
    if not storage.shared.backend.mover.SENDS_AHEAD:
        pytest.skip("only a mover that sends a pick ahead (PostgreSQL)")
    instance, conn, snapshot, held = sent_ahead_setup(storage, db, polled)
    cache = storage.shared.cache
    before = storage.statement_count()
    picked(instance, conn, held[1], snapshot, 1)
    assert storage.statement_count() == before + 2           # read, and sent ahead
    now = [oid for oid in held[2:] if cache.has(oid, snapshot)]
    assert now == held[2:2 + SEND_AHEAD_AFTER]
    assert instance._sent_ahead is not None
    # The next miss takes the rows sent ahead: no statement.
    state, tid = instance.load(p64(held[200]))
    assert storage.statement_count() == before + 2
    assert instance._sent_ahead is None
    # (The miss's own row is the load's to cache: ``_load_batch`` returns it.)
    assert all(cache.has(oid, snapshot) for oid in held[2:])
    expected = expected_states(storage, held, snapshot)
    assert state == expected[held[200]]
    assert all(instance.load(p64(oid))[0] == expected[oid] for oid in held[2:])
    assert storage.statement_count() == before + 2


def test_a_statement_after_a_pick_sent_ahead_reads_its_rows_first(
        storage_and_db: Any, polled: Any) -> None:
    """Any other statement of the session takes the rows sent ahead first (the session
    leaves pipeline mode), and a miss after it still finds them; a poll drops them."""
    storage, db = storage_and_db
    if not storage.shared.backend.mover.SENDS_AHEAD:
        pytest.skip("only a mover that sends a pick ahead (PostgreSQL)")
    instance, conn, snapshot, held = sent_ahead_setup(storage, db, polled)
    mover, cache = storage.shared.backend.mover, storage.shared.cache
    picked(instance, conn, held[1], snapshot, 1)
    assert conn.read_ahead is not None
    # Another statement of the session, before the rows were asked for.
    assert mover.load_at(conn, held[0], snapshot).state == instance.load(p64(held[0]))[0]
    assert conn.read_ahead is None
    before = storage.statement_count()
    expected = expected_states(storage, held, snapshot)
    assert instance.load(p64(held[299]))[0] == expected[held[299]]
    assert storage.statement_count() == before               # from the rows sent ahead
    assert all(cache.has(oid, snapshot) for oid in held[2:])
    # Sent again, then the snapshot moves: the rows are read and dropped.
    cache.clear()
    cache.after_poll(snapshot, snapshot, [])
    cache.put_loaded(u64(container_oid(db)), u64(instance.load(
        container_oid(db))[1]), instance.load(container_oid(db))[0], snapshot)
    picked(instance, conn, held[1], snapshot, 1)
    assert instance._sent_ahead is not None
    with db.transaction() as zconn:
        zconn.root()["items"][250]["v"] = -1
    instance.poll_invalidations()
    assert instance._sent_ahead is None and conn.read_ahead is None
    assert instance.load(p64(held[250]))[0] != expected[held[250]]   # the new state


def test_a_pick_sent_ahead_whose_session_is_lost(storage_and_db: Any, polled: Any,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """The session dies while a pick is sent ahead: the next miss loads on a new
    session, with the right state, and the error is not the reader's (a DEBUG line
    names the instance and the error)."""
    storage, db = storage_and_db
    if not storage.shared.backend.mover.SENDS_AHEAD:
        pytest.skip("only a mover that sends a pick ahead (PostgreSQL)")
    instance, conn, snapshot, held = sent_ahead_setup(storage, db, polled)
    expected = expected_states(storage, held, snapshot)
    picked(instance, conn, held[1], snapshot, 1)
    pid = conn.raw.info.backend_pid
    run_sql(storage, "SELECT pg_terminate_backend(%s, 5000)", (pid,))
    with caplog.at_level(logging.DEBUG, logger=storage_module.__name__):
        assert instance.load(p64(held[200]))[0] == expected[held[200]]
    [line] = [r.getMessage() for r in caplog.records if "sent ahead" in r.getMessage()]
    assert line.startswith(f"{instance.__name__}: a pick sent ahead failed (")
    assert line.endswith("); loading without it") and " was lost (" in line
    assert conn.broken and instance._load is not conn
    assert all(instance.load(p64(oid))[0] == expected[oid] for oid in held)


def test_a_pick_that_cannot_be_sent_ahead(storage_and_db: Any, polled: Any,
                                          monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """Sending the rest of a pick fails: the miss still has its row and the first 128,
    and the rest load at their misses."""
    storage, db = storage_and_db
    if not storage.shared.backend.mover.SENDS_AHEAD:
        pytest.skip("only a mover that sends a pick ahead (PostgreSQL)")
    instance, conn, snapshot, held = sent_ahead_setup(storage, db, polled)
    expected = expected_states(storage, held, snapshot)

    def refused(*args: Any) -> Any:
        raise DatabaseError("refused by the test", "SELECT")
    monkeypatch.setattr(conn, "send_fetchall", refused)
    with caplog.at_level(logging.DEBUG, logger=storage_module.__name__):
        row = picked(instance, conn, held[1], snapshot, 1)
    assert [r.getMessage() for r in caplog.records if "sent ahead" in r.getMessage()] == [
        f"{instance.__name__}: a pick could not be sent ahead (refused by the test)"]
    assert row.state == expected[held[1]] and instance._sent_ahead is None
    assert all(storage.shared.cache.has(oid, snapshot)
               for oid in held[2:2 + SEND_AHEAD_AFTER])
    assert all(instance.load(p64(oid))[0] == expected[oid] for oid in held)


def test_a_pick_sends_ahead_only_the_bytes_its_first_part_left(
        storage_and_db: Any, polled: Any) -> None:
    """What is sent ahead fits in the prefetch-bytes the part read at once left: a
    part that took them all sends nothing; one that left some, at most those."""
    storage, db = storage_and_db
    if not storage.shared.backend.mover.SENDS_AHEAD:
        pytest.skip("only a mover that sends a pick ahead (PostgreSQL)")
    instance, conn, snapshot, held = sent_ahead_setup(storage, db, polled)
    prefetcher, cache = storage.shared.prefetcher, storage.shared.cache
    size = len(instance.load(p64(held[0]))[0])        # every child's state: one size
    first_part = (SEND_AHEAD_AFTER + 1) * size
    prefetcher.max_bytes = first_part                 # the part read at once takes it all
    picked(instance, conn, held[1], snapshot, 1)
    assert instance._sent_ahead is None
    for room in (1, 10 * size):
        cache.clear()
        instance, conn, snapshot, held = sent_ahead_setup(storage, db, polled)
        prefetcher.max_bytes = first_part + room
        picked(instance, conn, held[1], snapshot, 1)
        assert instance._sent_ahead is not None
        instance.load(p64(held[299]))                 # the next miss takes them
        came = [oid for oid in held[2 + SEND_AHEAD_AFTER:] if cache.has(oid, snapshot)]
        assert 1 <= len(came) <= max(1, room // size) + 1, (room, len(came))


@pytest.mark.parametrize("pipelined", [True, False])
def test_a_pick_sent_ahead_brings_what_a_pick_read_at_once_brings(
        storage_and_db: Any, polled: Any, monkeypatch: pytest.MonkeyPatch,
        pipelined: bool) -> None:
    """``send_load_many_with_references`` (in pipeline mode, or read at once where
    libpq has none) brings what ``load_many_with_references`` brings: the states at the
    snapshot within the byte bound, and as many references of each as asked; for no
    oid, nothing, and no statement."""
    storage, db = storage_and_db
    mover = storage.shared.backend.mover
    if not mover.SENDS_AHEAD:
        pytest.skip("only a mover that sends a pick ahead (PostgreSQL)")
    if not pipelined:
        from zodbsql.backends.postgresql import connections
        monkeypatch.setattr(connections, "_pipelines_supported", lambda: False)
    with db.transaction() as zconn:
        zconn.root()["items"] = items = PersistentMapping()
        for i in range(40):
            items[i] = PersistentMapping(a=PersistentMapping(), b=PersistentMapping(),
                                         c=PersistentMapping())
    instance = polled(storage)
    oids = sorted(u64(oid) for oid in children_of(instance, container_oid(db)))
    conn, snapshot = instance._snapshot_conn(), instance._snapshot
    expected = expected_states(storage, oids, snapshot)

    def brought(sent: Any) -> tuple[dict[int, bytes], list[tuple[int, int]]]:
        states, references = sent.result()
        return {each.oid: each.state for each in states}, sorted(references)

    at_once = mover.load_many_with_references(conn, oids, snapshot, None, 2)
    states, references = brought(
        mover.send_load_many_with_references(conn, oids, snapshot, None, 2))
    assert states == expected
    assert references == sorted(at_once[1])
    assert sorted(parent for parent, _ in references) == sorted(oids * 2)  # 2 of 3 each
    sizes = [len(expected[oid]) for oid in oids[:10]]
    states, _ = brought(mover.send_load_many_with_references(
        conn, oids, snapshot, sum(sizes), 2))
    assert sorted(states) == oids[:10]
    before = storage.statement_count()
    assert brought(mover.send_load_many_with_references(conn, [], snapshot, None, 2)) == (
        {}, [])
    assert storage.statement_count() == before


def test_a_pick_takes_the_parents_own_references_only(storage_and_db: Any,
                                                      polled: Any) -> None:
    """PostgreSQL's client picks among the parent's own references: the uncached
    children of cached siblings (a BTree's next buckets' items) are the statement's to
    find, which walks on past them."""
    storage, db = storage_and_db
    if storage.shared.backend.mover.LOOKAHEAD_AT_LEAST is None:
        pytest.skip("only a mover with its prefetching statement picks among siblings")
    with db.transaction() as conn:
        conn.root()["items"] = items = PersistentMapping()
        items["miss"] = PersistentMapping(v=0)
        for name in ("a", "b"):
            items[name] = PersistentMapping({i: PersistentMapping(v=i) for i in range(100)})
    with db.transaction() as conn:
        items = conn.root()["items"]
        miss, siblings = u64(items["miss"]._p_oid), [items[n]._p_oid for n in "ab"]
    container = u64(container_oid(db))
    instance = polled(storage)
    storage.shared.cache.clear()
    instance = polled(storage)
    conn, snapshot = instance._snapshot_conn(), instance._snapshot
    prefetcher, cache = storage.shared.prefetcher, storage.shared.cache
    loaded = {u64(oid): instance.load(oid) for oid in (p64(container), *siblings)}
    cache.clear()
    cache.after_poll(snapshot, snapshot, [])           # as a first poll there
    for oid, (state, tid) in loaded.items():           # only these three cached
        cache.put_loaded(oid, u64(tid), state, snapshot)
    prefetcher.note_parent(container)
    assert instance._siblings_to_pick(miss, snapshot, 1000, 50) is None


def test_a_batch_stops_at_prefetch_bytes(storage_factory: Any) -> None:
    """However a backend picks a batch (SQLite's client, PostgreSQL's client or its
    statement, MySQL's statement), it stops once ``prefetch-bytes`` came: SQLite after
    the statement that reached it (256 oids), the servers within it."""
    storage = storage_factory.open(prefetch_bytes=2000)
    db = ZODB.DB(storage)
    try:
        fill(db, 1000)
        prefetcher = storage.shared.prefetcher
        prefetcher.bound = prefetcher.limit                 # a warm process's bound
        storage.shared.cache.clear()
        db.cacheMinimize()
        before = prefetcher.prefetched
        with db.transaction() as conn:
            items = conn.root()["items"]
            assert [items[i]["v"] for i in range(3)] == [0, 0, 0]
        assert 0 < prefetcher.prefetched - before <= 600
    finally:
        db.close()


def test_a_miss_brings_the_next_bucket_listed_before_its_items(storage_and_db: Any,
                                                               polled: Any) -> None:
    """PostgreSQL's statement: a bucket whose next bucket has a lower oid than its items
    (a tree made in one commit: its node's pickle names every bucket first) lists it
    first among its references.  A miss on an item takes the parent's first references
    too, after those after the item: the next bucket comes and the walk goes on into
    its items and the buckets after it.  (Before, the walk stalled into two statements a
    bucket.)  Those first references only fill the room the ones after leave."""
    storage, db = storage_and_db
    if storage.shared.backend.name != "postgresql":
        pytest.skip("only PostgreSQL's statement walks on from what it finds")
    with db.transaction() as conn:
        conn.root()["tree"] = tree = OOBTree()
        for i in range(600):
            tree[i] = PersistentMapping(v=0)
    chain = bucket_chain(db, "tree")
    index = next(i for i, (_, items) in enumerate(chain[:-2]) if chain[i + 1][0] < min(items))
    (bucket, items), (following, following_items) = chain[index], chain[index + 1]
    instance = polled(storage)
    conn, snapshot = instance._snapshot_conn(), instance._snapshot
    mover = storage.shared.backend.mover
    row, states, _ = mover.load_with_references(conn, items[1], snapshot, [], 1000, 10 ** 8,
                                                10 ** 6, [bucket])
    assert row is not None
    brought = {state.oid for state in states}
    assert set(items[2:]) <= brought                      # its siblings after it, first
    assert following in brought and set(following_items) <= brought
    assert chain[index + 2][0] in brought                 # and on
    # In a batch the siblings after fill, none before comes.
    row, states, _ = mover.load_with_references(conn, items[1], snapshot, [], 3, 10 ** 8,
                                                10 ** 6, [bucket])
    assert [state.oid for state in states] == items[2:5]


def test_a_second_walk_over_more_than_the_cache_holds(storage_factory: Any) -> None:
    """A BTree walked twice with a state cache that holds part of it: the second
    walk takes no more statements than the first.  (PostgreSQL's took 81 against 34:
    it missed each bucket whose items the cache had kept, and the statement, finding
    nothing after it in the previous bucket, brought the bucket's cached items and the
    next bucket, not walked on; ``FIRST_OF_PARENT``.)"""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        for start in range(0, 40_000, 4_000):
            with db.transaction() as conn:
                tree = conn.root().setdefault("tree", OOBTree())
                for i in range(start, start + 4_000):
                    tree[i] = PersistentMapping(v=0)
    finally:
        db.close()
    # 4.4 MB of room for states: 8 MB less what prefetch and compression take beside it.
    # (With 2 MB of room the second walk took more statements than the first, before
    # they were counted too: 86 against 71.)
    storage = storage_factory.open(storage_factory.path, cache_size_mb=8)
    db = ZODB.DB(storage, cache_size=400)
    try:
        conn = db.open()
        walks = []
        for _ in range(2):
            before = storage.statement_count()
            for count, child in enumerate(conn.root()["tree"].values()):
                assert child["v"] == 0
                if count % 1000 == 0:
                    conn.cacheGC()
            walks.append(storage.statement_count() - before)
            conn.cacheMinimize()
        assert len(storage.shared.cache) < 40_000            # it did not all fit
        assert walks[1] <= walks[0], walks
    finally:
        db.close()


# -- the mover's statements themselves: which revisions, which states, within which bytes ----
def three_revisions(db: Any) -> tuple[list[bytes], int, int]:
    """Children at ``v`` 0, then 1 (at ``changed``), an unrelated commit (at
    ``unrelated``), then ``v`` 2: the children's oids, ``changed`` and ``unrelated``."""
    children = fill(db, 3)
    change_all(db, 1)
    changed = u64(db.storage.lastTransaction())
    with db.transaction() as conn:
        conn.root()["unrelated"] = 1
    unrelated = u64(db.storage.lastTransaction())
    change_all(db, 2)
    return children, changed, unrelated


def as_read(states: list[Any]) -> list[tuple[int, int, int]]:
    """Loaded states as ``(oid, tid, v)``, by oid."""
    return sorted((s.oid, s.tid, value_in(s.state)) for s in states)


class TestAnOldSnapshotsRevisions:
    """History-preserving, a prefetch at a snapshot older than the current revisions
    reads each object's revision as of that snapshot: when the snapshot is that
    revision's own tid, and when a later commit (of another object) is; and its loads
    then need no statement."""

    history_modes = (True,)
    history_modes_reason = "history-free, an older snapshot's revision is not kept"

    def test_the_movers_statements_read_the_revision_the_snapshot_sees(
            self, storage_and_db: Any) -> None:
        storage, db = storage_and_db
        children, changed, unrelated = three_revisions(db)
        container = u64(container_oid(db))
        oids = sorted(u64(oid) for oid in children)
        mover = storage.shared.backend.mover
        conn = storage.shared.backend.connect()
        try:
            for snapshot in (changed, unrelated):
                states = mover.load_many_at(conn, oids, snapshot)
                assert as_read(states) == [(oid, changed, 1) for oid in oids]
                row, states, _ = mover.load_with_references(
                    conn, container, snapshot, [], 1000, 10 ** 8, 10 ** 6)
                assert row is not None
                assert as_read(states) == [(oid, changed, 1) for oid in oids]
        finally:
            conn.close()

    def test_a_prefetch_serves_an_old_snapshots_loads(
            self, storage_and_db: Any, polled: Any) -> None:
        storage, db = storage_and_db
        children = fill(db, 3)
        change_all(db, 1)
        at_the_change = polled(storage)
        with db.transaction() as conn:
            conn.root()["unrelated"] = 1
        after_another_commit = polled(storage)
        change_all(db, 2)
        storage.shared.cache.clear()
        for instance in (at_the_change, after_another_commit):
            instance.prefetch(children)
            before = storage.statement_count()
            assert [value_of(instance, oid) for oid in children] == [1, 1, 1]
            assert storage.statement_count() == before


def test_a_load_with_references_brings_one_revision_of_each_object(
        storage_and_db: Any) -> None:
    """Each object that comes along comes once, as of the snapshot, however many
    revisions it has."""
    storage, db = storage_and_db
    children, _, _ = three_revisions(db)
    newest = u64(db.storage.lastTransaction())
    conn = storage.shared.backend.connect()
    try:
        _, states, _ = storage.shared.backend.mover.load_with_references(
            conn, u64(container_oid(db)), newest, [], 1000, 10 ** 8, 10 ** 6)
    finally:
        conn.close()
    assert as_read(states) == sorted((u64(oid), newest, 2) for oid in children)


def test_a_load_with_references_takes_the_first_states_that_fit_the_bytes(
        storage_and_db: Any) -> None:
    """The states that come along are counted in the order they are wanted (the
    object's references, ascending, then the listed oids) and taken while their
    running size is within ``max_bytes``: a bound of exactly two states' sizes brings
    the first two references, not the listed state."""
    storage, db = storage_and_db
    children = sorted(u64(oid) for oid in fill(db, 4))
    with db.transaction() as conn:
        conn.root()["listed"] = listed = PersistentMapping(v=0)
    listed_oid = u64(listed._p_oid)
    conn = storage.shared.backend.connect()
    try:
        sizes = state_sizes(conn, children[:2])
        mover = storage.shared.backend.mover
        container = u64(container_oid(db))
        snapshot = u64(db.storage.lastTransaction())
        two = sizes[children[0]] + sizes[children[1]]
        for bound, brought in ((two, children[:2]), (two - 1, children[:1])):
            _, states, _ = mover.load_with_references(conn, container, snapshot,
                                                      [listed_oid], 1000, bound, 10 ** 6)
            assert [s.oid for s in states] == brought
        _, states, _ = mover.load_with_references(conn, container, snapshot, [listed_oid],
                                                  1000, 10 ** 8, 10 ** 6)
        assert [s.oid for s in states] == [*children, listed_oid]
    finally:
        conn.close()
