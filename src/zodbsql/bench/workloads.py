"""The tests: what one worker does in one test, between the barrier and its finish.

Each worker ("unit") has its own ZODB connection and transaction manager; writers own a
container of objects (``PersistentMapping`` or, with ``--btrees``, ``OOBTree``), and the
reader with the same number reads that container.  ``prepare`` runs before the barrier
(not timed), ``run`` after it (timed) and returns what it did.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import transaction
from BTrees.Length import Length
from BTrees.OOBTree import OOBTree
from persistent import Persistent
from persistent.mapping import PersistentMapping
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import ConflictError

from zodbsql.bench import hotspot, soak
from zodbsql.bench.memory import memory

ROOT_KEY = "zodbsql-bench"


class Item(Persistent):
    """One benchmark object: ``data`` of --object-size bytes and a counter."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.count = 0


class Counter(Persistent):
    """A counter without conflict resolution: concurrent increments conflict."""

    value = 0


@dataclass
class Params:
    objects: int = 1000
    concurrency: int = 1
    object_size: int = 128
    btrees: bool = False
    large_objects: int = 10_000
    pack_objects: int = 100_000
    commits: int = 20          # transactions per worker in empty/conflicts/hotspot
    hotspot_keys: int = hotspot.KEYS_PER_TRANSACTION
    duration: float = 60.0         # seconds of the soak test
    soak_documents: int = 0        # documents in the soak's catalog before it runs
    sparse_objects: int = 10_000   # children of the sparse test's mapping
    walk_objects: int = 100_000    # items of the btree-walk test's OOBTree


@dataclass
class Outcome:
    """What one unit did in one test."""

    objects: int = 0           # objects written/read/checked (transactions for empty)
    transactions: int = 0
    loads: int | None = None   # storage load calls (read tests)
    extra: dict[str, float] = field(default_factory=dict)
    series: dict[str, Any] | None = None   # per time slot (soak)


class Unit:
    """One worker: a connection of the host's database, and what it wrote."""

    def __init__(self, role: str, index: int, params: Params) -> None:
        self.role, self.index, self.params = role, index, params
        self.tm = transaction.TransactionManager(explicit=False)
        self.conn: Any = None
        self.db: Any = None
        self.key = ""
        self.loads = 0
        self._own_load: Any = None

    # -- connections ------------------------------------------------------------------
    def connect(self, db: Any) -> None:
        if self.conn is not None and self.db is db:
            return
        self.close()
        self.db = db
        self.conn = db.open(transaction_manager=self.tm)
        storage = self.conn._storage
        original = storage.load
        # Some storages (RelStorage) keep ``load`` as an instance attribute: put it back.
        self._own_load = storage.__dict__.get("load")

        def counting_load(*args: Any, **kw: Any) -> Any:
            self.loads += 1
            return original(*args, **kw)
        storage.load = counting_load   # an instance attribute: this connection only

    def catch_up(self) -> None:
        """Begin and end a transaction: the connection polls for what others
        committed, so the next test does not pay for an earlier test's writes."""
        if self.conn is not None:
            self.tm.begin()      # the connection's newTransaction: the poll
            self.tm.abort()

    def close(self) -> None:
        if self.conn is not None:
            self.tm.abort()
            storage = self.conn._storage
            if self._own_load is not None:
                storage.load = self._own_load
            else:
                storage.__dict__.pop("load", None)
            self.conn.close()
            self.conn = None

    def root(self) -> Any:
        return self.conn.root()[ROOT_KEY]

    def container(self) -> Any:
        return self.root()[self.key]

    def new_container(self) -> Any:
        return OOBTree() if self.params.btrees else PersistentMapping()

    def make_container(self, key: str) -> None:
        """Create this writer's (empty) container; retried when writers collide on root."""
        self.key = key
        for _ in range(50):
            try:
                self.tm.begin()
                self.root()[key] = self.new_container()
                self.tm.commit()
                return
            except ConflictError:
                self.tm.abort()
                time.sleep(0.01 * (self.index + 1))
        raise RuntimeError("could not create the container: too many conflicts")

    def fill(self, container: Any, count: int, start: int = 0) -> None:
        data = b"x" * self.params.object_size
        for i in range(start, start + count):
            container[i] = Item(data)

    def read_all(self) -> int:
        count = 0
        for item in self.container().values():
            item.count
            count += 1
        return count


#: One child in SPARSE_STRIDE is read by the sparse test.
SPARSE_STRIDE = 100


def sparse_name(params: Params) -> str:
    return f"sparse-{params.sparse_objects}"


def walk_name(params: Params) -> str:
    return f"walk-{params.walk_objects}"


def _fill_in_batches(tm: Any, conn: Any, container: Any, count: int, batch: int) -> None:
    data = b"x" * 128
    for start in range(0, count, batch):
        tm.begin()
        for i in range(start, min(start + batch, count)):
            container[i] = Item(data)
        tm.commit()
        conn.cacheMinimize()


def _shared_structure(tm: Any, conn: Any, name: str, make: Callable[[], Any], count: int,
                      batch: int) -> None:
    """``root[ROOT_KEY][name]``: ``make()`` filled with ``count`` Items, built once."""
    bench = conn.root()[ROOT_KEY]
    if name in bench:
        return
    tm.begin()
    building = conn.root()[ROOT_KEY][f"{name}-building"] = make()
    tm.commit()
    _fill_in_batches(tm, conn, building, count, batch)
    tm.begin()
    bench = conn.root()[ROOT_KEY]
    bench[name] = bench.pop(f"{name}-building")   # complete, or not there at all
    tm.commit()


def setup_database(db: Any, prepopulate: int, batch: int = 10_000,
                   structures: tuple[str, ...] = (), params: Params | None = None) -> None:
    """The bench's root mapping and shared counters; --prepopulate objects; the shared
    structures the read tests walk (``structures``: test names, e.g. "sparse")."""
    tm = transaction.TransactionManager()
    conn = db.open(transaction_manager=tm)
    try:
        tm.begin()
        root = conn.root()
        if ROOT_KEY not in root:
            root[ROOT_KEY] = PersistentMapping()
            tm.commit()
            tm.begin()
        bench = conn.root()[ROOT_KEY]
        if "counters" not in bench:
            bench["counters"] = PersistentMapping(resolving=Length(), plain=Counter())
            tm.commit()
        if prepopulate:
            _shared_structure(tm, conn, "prepopulated", OOBTree, prepopulate, batch)
        params = params or Params()
        if "sparse" in structures:
            _shared_structure(tm, conn, sparse_name(params), PersistentMapping,
                              params.sparse_objects, batch)
        if "btree-walk" in structures:
            _shared_structure(tm, conn, walk_name(params), OOBTree, params.walk_objects,
                              batch)
    finally:
        tm.abort()
        conn.close()


# -- the tests: prepare(unit, state) before the barrier, run(unit, state) after -----------
def _read(unit: Unit) -> Outcome:
    # zodbsql with cache-redis-url: the states Redis served ("redis_hits").
    second = getattr(getattr(unit.db.storage, "shared", None), "second_level", None)
    hits = second.hits if second is not None else 0
    unit.tm.begin()
    before = unit.loads
    count = unit.read_all()
    unit.tm.abort()
    extra = {"redis_hits": float(second.hits - hits)} if second is not None else {}
    return Outcome(count, 1, unit.loads - before, extra=extra)


def sparse_run(unit: Unit, state: dict[str, Any]) -> Outcome:
    """Read one child in SPARSE_STRIDE of a large mapping (its state names them all)."""
    unit.tm.begin()
    before = unit.loads
    mapping = unit.root()[sparse_name(unit.params)]
    count = 0
    for key in range(0, unit.params.sparse_objects, SPARSE_STRIDE):
        mapping[key].count
        count += 1
    unit.tm.abort()
    return Outcome(count, 1, unit.loads - before)


def walk_run(unit: Unit, state: dict[str, Any]) -> Outcome:
    """Iterate every item of a large OOBTree."""
    unit.tm.begin()
    before = unit.loads
    count = 0
    for item in unit.root()[walk_name(unit.params)].values():
        item.count
        count += 1
    unit.tm.abort()
    return Outcome(count, 1, unit.loads - before)


def restart_run(unit: Unit, state: dict[str, Any]) -> Outcome:
    """After a restart (the runner reopened the storage after ``hot_prepare`` read the
    objects): the first object (how long the first request takes), then, once a
    zodbsql persistent cache was read back, all of them; "db_loads" counts the state
    cache's misses (each a load statement), for zodbsql."""
    storage = unit.db.storage
    shared = getattr(storage, "shared", None)
    unit.tm.begin()
    before = unit.loads
    misses = shared.cache.misses if shared is not None else 0
    start = time.perf_counter()
    next(iter(unit.container().values())).count
    first = time.perf_counter() - start
    persistent = getattr(shared, "persistent", None)
    if persistent is not None:
        persistent.loaded.wait(300)
    waited = time.perf_counter() - start - first
    count = unit.read_all()
    unit.tm.abort()
    extra = {"first_ms": first * 1000, "warmup_wait_ms": waited * 1000}
    if shared is not None:
        extra["db_loads"] = shared.cache.misses - misses
        if persistent is not None:
            extra["adopted"] = persistent.adopted
    return Outcome(count, 1, unit.loads - before, extra=extra)


def add_prepare(unit: Unit, state: dict[str, Any]) -> None:
    unit.make_container(state["key"])
    unit.tm.begin()


def add_run(unit: Unit, state: dict[str, Any]) -> Outcome:
    unit.fill(unit.container(), unit.params.objects)
    unit.tm.commit()
    return Outcome(unit.params.objects, 1)


def update_prepare(unit: Unit, state: dict[str, Any]) -> None:
    unit.tm.begin()
    unit.read_all()    # the objects are in the pickle cache, as after add


def update_run(unit: Unit, state: dict[str, Any]) -> Outcome:
    count = 0
    for item in unit.container().values():
        item.count += 1
        count += 1
    unit.tm.commit()
    return Outcome(count, 1)


def reader_prepare(unit: Unit, state: dict[str, Any]) -> None:
    unit.key = state["key"]
    unit.conn.cacheMinimize()


def hot_prepare(unit: Unit, state: dict[str, Any]) -> None:
    unit.key = state["key"]
    _read(unit)                   # the storage caches hold the objects (as after cold)
    unit.conn.cacheMinimize()     # the pickle cache only; storage caches stay


def steamin_prepare(unit: Unit, state: dict[str, Any]) -> None:
    unit.key = state["key"]
    unit.tm.begin()               # everything is in the pickle cache from the hot read
    unit.read_all()
    unit.tm.abort()


def readcurrent_prepare(unit: Unit, state: dict[str, Any]) -> None:
    unit.tm.begin()


def readcurrent_run(unit: Unit, state: dict[str, Any]) -> Outcome:
    count = 0
    first = None
    for item in unit.container().values():
        item.count
        unit.conn.readCurrent(item)
        first = first if first is not None else item
        count += 1
    if first is not None:
        first.count += 1          # a commit that must check every object read
    unit.tm.commit()
    return Outcome(count, 1)


def empty_prepare(unit: Unit, state: dict[str, Any]) -> None:
    unit.tm.abort()


def empty_run(unit: Unit, state: dict[str, Any]) -> Outcome:
    """Transactions with nothing in them: a poll (new ZODB transaction) and 2PC."""
    commits = unit.params.commits
    for _ in range(commits):
        unit.tm.begin()
        unit.conn.root()                      # the connection has polled
        storage = unit.conn._storage
        meta = TransactionMetaData(description="zodbsql bench: empty")
        storage.tpc_begin(meta)
        storage.tpc_vote(meta)
        storage.tpc_finish(meta)
        unit.tm.abort()
    return Outcome(commits, commits)


def conflicts_run(unit: Unit, state: dict[str, Any]) -> Outcome:
    """Each round: increment a conflict-resolving counter, then one that can't resolve."""
    commits = unit.params.commits
    resolved = raised = 0
    for _ in range(commits):
        unit.tm.begin()
        counter = unit.root()["counters"]["resolving"]
        counter.change(1)
        try:
            unit.tm.commit()
            if counter._p_changed is None:   # ZODB ghostifies what the storage resolved
                resolved += 1
        except ConflictError:
            unit.tm.abort()
            raised += 1
        unit.tm.begin()
        unit.root()["counters"]["plain"].value += 1
        try:
            unit.tm.commit()
        except ConflictError:
            unit.tm.abort()
            raised += 1
    return Outcome(2 * commits, 2 * commits,
                   extra={"conflicts_raised": raised, "conflicts_resolved": resolved})


def _hotspot_name(state: dict[str, Any]) -> str:
    return f"hotspot-{state['tag']}"     # one shared tree per run


def hotspot_prepare(unit: Unit, state: dict[str, Any]) -> None:
    unit.key = _hotspot_name(state)
    hotspot.make_shared(unit.tm, unit.root, unit.key)


def hotspot_run(unit: Unit, state: dict[str, Any]) -> Outcome:
    """Every worker inserts keys into one shared OOBTree and bumps one shared Length,
    each transaction retried on TransientError until it commits."""
    commits = unit.params.commits
    retries = hotspot.run(unit.tm, unit.container, state["tag"], unit.index, commits,
                          unit.params.hotspot_keys)
    extra: dict[str, float] = {"retries": retries.total}
    extra.update((f"retried:{name}", n) for name, n in retries.by_error.items())
    return Outcome(commits, commits, extra=extra)


def hotspot_verify(unit: Unit, state: dict[str, Any]) -> list[str]:
    """After all workers finished: the Length and the tree hold exactly their keys."""
    unit.tm.begin()
    try:
        return hotspot.problems(unit.root()[_hotspot_name(state)], state["tag"],
                                unit.params.concurrency, unit.params.commits,
                                unit.params.hotspot_keys)
    finally:
        unit.tm.abort()


def _soak_name(state: dict[str, Any]) -> str:
    return f"soak-{state['tag']}"        # one catalog per run


def soak_prepare(unit: Unit, state: dict[str, Any]) -> None:
    unit.key = _soak_name(state)
    for attempt in range(50):            # workers creating it together: look again
        unit.tm.begin()
        try:
            if unit.key not in unit.root():
                unit.root()[unit.key] = soak.new_catalog()
            unit.tm.commit()
            break
        except ConflictError:
            unit.tm.abort()
            time.sleep(0.01 * (attempt + 1))
    else:
        raise RuntimeError("could not create the soak catalog: too many conflicts")
    if unit.index == 0 and unit.params.soak_documents:
        # The other workers wait at the barrier meanwhile: every run starts on it full.
        soak.fill(unit.tm, unit.container, unit.params.soak_documents)


def soak_run(unit: Unit, state: dict[str, Any]) -> Outcome:
    """Worker 0 loads documents, the others query, for --duration seconds."""
    duration = unit.params.duration
    loads = unit.index == 0
    work = soak.load if loads else soak.query
    series = work(unit.tm, unit.container, duration, unit.index,
                  lambda: memory(unit.db)["rss_mb"])
    done = sum(series.done)
    # The figure is the loader's commits/s; queries are counted in the series.
    return Outcome(done if loads else 0, done if loads else 0,
                   series={"role": "load" if loads else "query", "done": series.done,
                           "rss_mb": series.rss_mb, "slot_seconds": series.slot_seconds})


def soak_verify(unit: Unit, state: dict[str, Any]) -> list[str]:
    unit.tm.begin()
    try:
        return soak.problems(unit.root()[_soak_name(state)])
    finally:
        unit.tm.abort()


def large_prepare(unit: Unit, state: dict[str, Any]) -> None:
    unit.make_container(state["key"] + "-large")
    unit.tm.begin()


def large_run(unit: Unit, state: dict[str, Any]) -> Outcome:
    unit.fill(unit.container(), unit.params.large_objects)
    unit.tm.commit()
    unit.conn.cacheMinimize()
    return Outcome(unit.params.large_objects, 1)


def pack_prepare(unit: Unit, state: dict[str, Any]) -> None:
    """Write --pack-objects objects, then drop them all: garbage for the pack."""
    unit.make_container(state["key"] + "-pack")
    unit.tm.begin()
    unit.root()[unit.key] = OOBTree()   # buckets: each batch writes what it adds
    unit.tm.commit()
    total, batch = unit.params.pack_objects, max(unit.params.objects, 1000)
    for start in range(0, total, batch):
        unit.tm.begin()
        unit.fill(unit.container(), min(batch, total - start), start)
        unit.tm.commit()
        unit.conn.cacheMinimize()
    unit.tm.begin()
    del unit.root()[unit.key]
    unit.tm.commit()
    time.sleep(0.01)


def pack_run(unit: Unit, state: dict[str, Any]) -> Outcome:
    unit.db.pack(time.time())
    return Outcome(unit.params.pack_objects, 0)


def nothing(unit: Unit, state: dict[str, Any]) -> None:
    return None


@dataclass(frozen=True)
class Test:
    name: str
    title: str
    role: str                 # writer | reader
    prepare: Callable[[Unit, dict[str, Any]], None]
    run: Callable[[Unit, dict[str, Any]], Outcome]
    unit: str = "objects/s"   # what the figure counts
    lower_is_better: bool = False
    reopen: bool = False      # a new DB/storage instance in the reader before it runs
    restart: bool = False     # ... after its prepare (what prepare read is "before")
    workers: str = "all"      # all | one
    # The server's deadlock counter is read around the test; the workers end their
    # sessions after it (a new DB), so PostgreSQL's figure is complete.
    counts_deadlocks: bool = False
    # Run by one worker after all finished: what is wrong with the data ([]: nothing).
    verify: Callable[[Unit, dict[str, Any]], list[str]] | None = None
    # Only when asked for by name (--tests), and once: not per repetition.
    on_request: bool = False


TESTS: dict[str, Test] = {t.name: t for t in [
    Test("add", "add objects", "writer", add_prepare, add_run),
    Test("update", "update objects", "writer", update_prepare, update_run),
    Test("warm", "read warm (other process)", "reader", reader_prepare,
         lambda u, s: _read(u)),
    Test("cold", "read cold (all caches cleared)", "reader", reader_prepare,
         lambda u, s: _read(u), reopen=True),
    Test("hot", "read hot (storage cache kept)", "reader", hot_prepare,
         lambda u, s: _read(u)),
    Test("restart", "read after a restart (what it read before)", "reader", hot_prepare,
         restart_run, restart=True, on_request=True),
    Test("steamin", "read steamin' (all cached)", "reader", steamin_prepare,
         lambda u, s: _read(u)),
    Test("sparse", "read sparse (1 child in 100, cold)", "reader", nothing, sparse_run,
         reopen=True),
    Test("btree-walk", "walk an OOBTree (cold)", "reader", nothing, walk_run, reopen=True),
    Test("readcurrent", "readCurrent + commit", "writer", readcurrent_prepare, readcurrent_run),
    Test("empty", "empty commit (poll + 2PC)", "writer", empty_prepare, empty_run,
         unit="transactions/s"),
    Test("conflicts", "conflicts: commits", "writer", empty_prepare, conflicts_run,
         unit="transactions/s"),
    Test("hotspot", "hotspot: commits", "writer", hotspot_prepare, hotspot_run,
         unit="transactions/s", counts_deadlocks=True, verify=hotspot_verify),
    Test("large", "large transaction", "writer", large_prepare, large_run),
    Test("soak", "soak: documents loaded while queried", "writer", soak_prepare, soak_run,
         unit="transactions/s", verify=soak_verify, on_request=True),
    Test("pack", "pack", "writer", pack_prepare, pack_run, unit="s per 100k objects",
         lower_is_better=True, workers="one"),
]}
#: Tests that need the objects written by ``add``.
NEEDS_OBJECTS = {"update", "warm", "cold", "hot", "restart", "steamin", "readcurrent"}
READS = {"warm", "cold", "hot", "restart", "steamin", "sparse", "btree-walk"}
#: Tests that read a shared structure setup_database builds once per database.
STRUCTURES = ("sparse", "btree-walk")
