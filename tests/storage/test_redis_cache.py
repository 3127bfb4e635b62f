"""The second-level state cache in Redis (cache-redis-url).

Against the Redis server on 127.0.0.1:6379 (with CI=true, a run where it is down
fails), each test under a key prefix of its own whose keys it deletes afterwards; the
outage test starts a private server and kills it.
"""
from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import Any, Iterator

import pytest
import redis
import ZODB
from ZODB.utils import u64

from tests.fault.servers import PrivateRedis, start_private
from tests.storage.test_persistent_cache import COUNT, fill, read_all

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def redis_options() -> Iterator[dict[str, Any]]:
    """Settings naming the shared Redis with a prefix unique to the test."""
    prefix = f"zodbsql-test-{uuid.uuid4().hex}:"
    client = redis.Redis.from_url(REDIS_URL)
    client.ping()       # down: the test fails here (never skips)
    yield {"cache_redis_url": REDIS_URL, "cache_redis_prefix": prefix,
           "prefetch_count": 0}
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def counted_calls(client: Any, *names: str) -> Counter[str]:
    """Count the calls of the Redis client's methods ``names`` from now on (each still
    goes to Redis)."""
    calls: Counter[str] = Counter()
    for name in names:
        original = getattr(client, name)

        def counted(*args: Any, _name: str = name, _original: Any = original,
                    **kwargs: Any) -> Any:
            calls[_name] += 1
            return _original(*args, **kwargs)
        setattr(client, name, counted)
    return calls


def test_a_new_process_reads_from_redis_what_another_loaded(storage_factory,
                                                           redis_options):
    fill(storage_factory.open())
    first = storage_factory.open(**redis_options)
    values, used_cold = read_all(first)
    assert values == {i: i for i in range(COUNT)}
    assert used_cold >= COUNT
    second = storage_factory.open(**redis_options)
    level = second.shared.second_level
    values, used_warm = read_all(second)
    assert values == {i: i for i in range(COUNT)}
    assert used_warm <= 3                 # the polls
    assert level is not None and level.hits >= COUNT


def values_of(db: Any, count: int = COUNT) -> dict[int, Any]:
    conn = db.open()
    try:
        return {i: conn.root()[i]["value"] for i in range(count)}
    finally:
        conn.close()


def test_a_state_is_only_served_to_a_snapshot_that_sees_it(storage_factory,
                                                          redis_options):
    fill(storage_factory.open())
    first = ZODB.DB(storage_factory.open(**redis_options))
    values_of(first)
    writer = ZODB.DB(storage_factory.open(**redis_options))
    with writer.transaction() as conn:
        for i in range(0, COUNT, 3):
            conn.root()[i]["value"] = -i
    # One process that read the old states before, one that starts now: both see the
    # new ones (the late one from Redis: the writer stored them).
    expected = {i: (-i if i % 3 == 0 else i) for i in range(COUNT)}
    assert values_of(first) == expected
    late_storage = storage_factory.open(**redis_options)
    late = ZODB.DB(late_storage)
    assert values_of(late) == expected
    level = late_storage.shared.second_level
    assert level is not None and level.hits >= COUNT
    # A connection that began before a change keeps reading its snapshot.
    old_view = late.open()
    assert old_view.root()[1]["value"] == 1
    with writer.transaction() as conn:
        conn.root()[1]["value"] = "changed"
    old_view.cacheMinimize()
    assert old_view.root()[1]["value"] == 1
    old_view.close()
    assert values_of(late)[1] == "changed"
    assert values_of(first)[1] == "changed"
    for db in (first, writer, late):
        db.close()


def test_a_commit_leaves_its_states_in_redis_for_the_next_process(storage_factory,
                                                                redis_options):
    """What a commit wrote is in the Redis level when it ends: a process that starts
    next reads the changed objects from there, none from the database."""
    fill(storage_factory.open())
    writer = ZODB.DB(storage_factory.open(**redis_options))
    with writer.transaction() as conn:
        for i in range(0, COUNT, 3):
            conn.root()[i]["value"] = -i
    late_storage = storage_factory.open(**redis_options)
    late = ZODB.DB(late_storage)
    level = late_storage.shared.second_level
    assert level is not None
    conn = late.open()
    try:
        root = conn.root()
        misses = level.misses           # the root's, if any: only the writer read it
        assert {i: root[i]["value"] for i in range(0, COUNT, 3)} == {
            i: -i for i in range(0, COUNT, 3)}
        assert level.misses == misses and level.hits >= len(range(0, COUNT, 3))
    finally:
        conn.close()
        late.close()
        writer.close()


def test_a_redis_outage_loads_from_the_database_with_one_warning(storage_factory,
                                                                caplog):
    server = start_private(PrivateRedis)
    try:
        assert isinstance(server, PrivateRedis)
        options = {"cache_redis_url": server.url, "cache_redis_prefix": "t:",
                   "prefetch_count": 0}
        fill(storage_factory.open())
        filler = ZODB.DB(storage_factory.open(**options))
        values_of(filler)
        # Opened while Redis is up, its own cache empty: every load asks Redis first.
        reader = ZODB.DB(storage_factory.open(**options))
        server.stop_immediately()
        with caplog.at_level(logging.WARNING, logger="zodbsql"):
            for _ in range(3):
                assert values_of(reader) == {i: i for i in range(COUNT)}
                reader.cacheMinimize()
            late = ZODB.DB(storage_factory.open(**options))   # opened while it is down
            assert values_of(late) == {i: i for i in range(COUNT)}
        for db in (filler, reader, late):
            db.close()
        # One for each storage: the one open when Redis died, the one opened after.
        warnings = [r for r in caplog.records if "Redis" in r.getMessage()]
        assert len(warnings) == 2, [r.getMessage() for r in warnings]
        assert "unreachable" in warnings[0].getMessage()
    finally:
        server.cleanup()


def test_a_cold_read_from_redis_brings_the_prefetch_plan_along(storage_factory,
                                                              redis_options):
    """With prefetch on, a miss asks Redis for the oid and the references queued after
    it in one MGET, as a database load brings them in one statement: a container's
    children take a few round trips, not one each."""
    options = {**redis_options, "prefetch_count": 1000}
    fill(storage_factory.open())
    read_all(storage_factory.open(**options))      # from the database, into Redis
    second = storage_factory.open(**options)
    level = second.shared.second_level
    assert level is not None
    calls = counted_calls(level.client, "get", "mget")
    values, used = read_all(second)
    assert values == {i: i for i in range(COUNT)}
    assert used <= 3                                # the polls: nothing loaded
    assert level.hits >= COUNT
    assert 0 < calls["get"] + calls["mget"] <= COUNT // 10


def committed_after(storage: Any) -> None:
    """One more commit (the root's), so that the newest tid, where the first process
    to open sets the shared checkpoint, is after the objects' states."""
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        conn.root()["later"] = 1
    db.close()


@pytest.mark.parametrize("prefetch", [0, 1000], ids=["load", "prefetched"])
def test_a_state_older_than_the_checkpoint_is_shared_under_it(storage_factory, redis_options,
                                                              prefetch):
    """A revision committed before the checkpoint is current at it: a process that loads
    one (by itself, or brought along by prefetch) writes it under the checkpoint, where a
    process that starts later asks for it."""
    fill(storage_factory.open())
    committed_after(storage_factory.open())
    first = storage_factory.open(**{**redis_options, "prefetch_count": prefetch})
    first_level = first.shared.second_level
    assert first_level is not None
    assert first_level.checkpoint == u64(first.lastTransaction())
    read_all(first)
    second = storage_factory.open(**redis_options)
    level = second.shared.second_level
    assert level is not None and level.checkpoint == first_level.checkpoint
    values, used = read_all(second)
    assert values == {i: i for i in range(COUNT)}
    assert used <= 3                                # the polls: nothing loaded
    assert level.hits >= COUNT and level.misses == 0


def test_a_checkpoint_the_index_moved_past_is_replaced(storage_factory, redis_options):
    """More changes than a process's index of changes holds (1,000 in a small cache)
    restart the index at the poll, which then no longer reaches the checkpoint: the
    process takes the poll's tid as its checkpoint and records it in the database, and
    what it loads from then on is shared under it with the processes that open later."""
    count = 1100
    fill(storage_factory.open(), count)
    reader_storage = storage_factory.open(**redis_options, cache_size_mb=0.25)
    level = reader_storage.shared.second_level
    assert level is not None
    opened_at = level.checkpoint
    reader = ZODB.DB(reader_storage)
    values_of(reader, count)
    writer = ZODB.DB(storage_factory.open())
    with writer.transaction() as conn:
        for i in range(count):
            conn.root()[i]["value"] = -i
    writer.close()
    committed_after(storage_factory.open())
    newest = u64(storage_factory.open().lastTransaction())
    assert newest > opened_at
    assert values_of(reader, count) == {i: -i for i in range(count)}
    assert level.checkpoint == newest
    level.wait_recorded()               # recorded in the database for later processes
    conn = reader_storage.backend.connect()
    try:
        assert reader_storage.backend.history.get_meta(conn, "cache_checkpoint") == str(newest)
    finally:
        conn.close()
    reader.close()
    late = storage_factory.open(**redis_options)
    late_level = late.shared.second_level
    assert late_level is not None
    values, used = read_all(late, count)
    assert values == {i: -i for i in range(count)}
    assert used <= 3
    assert late_level.hits >= count and late_level.misses == 0


def test_a_poll_that_keeps_the_checkpoint_asks_redis_nothing(storage_factory,
                                                             redis_options):
    """The checkpoint is published only when the index of changes moves past it, not at
    every poll: a transaction start that polls another process's commit and loads
    nothing costs no Redis round trip."""
    fill(storage_factory.open())
    storage = storage_factory.open(**redis_options)
    level = storage.shared.second_level
    assert level is not None
    db = ZODB.DB(storage)
    values_of(db, 10)
    asked = counted_calls(level.client, "get", "set", "mget", "pipeline")
    writer = ZODB.DB(storage_factory.open())
    for value in range(3):
        with writer.transaction() as conn:
            conn.root()[COUNT - 1]["value"] = value     # an object the reader never read
        conn = db.open()
        assert conn.root()[0]["value"] == 0
        conn.close()
        assert storage.shared.cache.polled == u64(writer.storage.lastTransaction())
    writer.close()
    assert asked == {}
    db.close()


def test_a_load_redis_served_is_counted_under_its_source(storage_factory, redis_options):
    """With metrics on, each state Redis served is one load of source "redis" (the
    root's later loads, at ZODB.DB's open and the connection's, hit the cache)."""
    from tests.storage.test_metrics import value
    fill(storage_factory.open())
    read_all(storage_factory.open(**redis_options))       # from the database, into Redis
    name = f"metrics-redis-{uuid.uuid4().hex[:8]}"
    second = storage_factory.open(**redis_options, metrics=True, name=name)
    values, _ = read_all(second)
    assert values == {i: i for i in range(COUNT)}
    assert {source: value("zodbsql_loads_total", name, source=source)
            for source in ("redis", "database", "cache", "prefetch")} == {
                "redis": COUNT + 1, "database": 0, "cache": 2, "prefetch": 0}
