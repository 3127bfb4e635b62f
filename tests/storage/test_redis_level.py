"""The Redis level on its own (``zodbsql.cache.secondlevel.RedisCache``): the keys other
processes must find, the shared checkpoint, what it counts, and an outage and the
recovery after it.

Against the Redis server on 127.0.0.1:6379 (with CI=true, a run where it is down
fails), under a key prefix of the test's own whose keys it deletes afterwards; an
outage is a client pointed at a port where nothing listens.  Each side's index of
changes is a real ``StateCache`` given the polls it would have made
(``tests/storage/test_redis_cache.py`` runs whole storages).
"""
from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import pytest
import redis

from zodbsql.cache import StateCache, secondlevel
from zodbsql.cache.secondlevel import EXPIRE, TIMEOUT, RedisCache

from tests.storage.test_redis_cache import REDIS_URL, redis_options  # noqa: F401 (fixture)

#: A port where nothing listens: connecting fails at once.
NOWHERE = "redis://127.0.0.1:1/0"


@pytest.fixture
def prefix(redis_options: dict[str, Any]) -> str:
    """The key prefix of the test's own (its keys deleted afterwards)."""
    return str(redis_options["cache_redis_prefix"])


def raw() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


def indexed(since: int, upto: int, changes: list[tuple[int, int]]) -> StateCache:
    """A state cache whose index covers ``(since, upto]`` with ``changes`` (oid, tid)."""
    cache = StateCache(1 << 20)
    assert cache.cover(since, upto, changes)
    assert (cache.base, cache.polled) == (since, upto)
    return cache


def test_keys_name_the_database_the_mode_the_oid_and_the_tid(prefix):
    """The key format every process of every version must agree on (README:
    ``<prefix><database id>:<mode>:<oid>:<tid>``, hexadecimal)."""
    cache = StateCache(1 << 20)
    hp = RedisCache(REDIS_URL, prefix, "d41d8cd9", True, cache)
    hf = RedisCache(REDIS_URL, prefix, "d41d8cd9", False, cache)
    assert hp.key(0x1F, 0x3E8) == f"{prefix}d41d8cd9:hp:1f:3e8".encode()
    assert hf.key(1, 2) == f"{prefix}d41d8cd9:hf:1:2".encode()
    # Every call has a short timeout, connecting included.
    kwargs = hp.client.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (TIMEOUT, TIMEOUT)
    # Where it is, as logs name it: without the password.
    secret = RedisCache("redis://:hunter2@127.0.0.1:6379/0", prefix, "d", True, cache)
    assert "hunter2" not in secret.where and "127.0.0.1:6379" in secret.where
    assert hp.where == REDIS_URL
    assert (hp.hits, hp.misses, hp.stored, hp.checkpoint) == (0, 0, 0, -1)


def test_a_checkpoint_is_the_process_own_and_recorded_by_a_thread(prefix):
    """A process takes the tid it publishes as its checkpoint at once and hands it to
    ``record`` (the database's record, storage/caches.py) in a thread of its own, so a
    poll never waits for it; without ``record`` (read-only) it is kept to itself.
    Nothing about the checkpoint is written to Redis (a restored database would read
    one of another history there: test_redis_restore.py)."""
    recorded: list[int] = []
    level = RedisCache(REDIS_URL, prefix, "d", True, StateCache(1 << 20), recorded.append)
    level.publish_checkpoint(150)
    assert level.checkpoint == 150
    level.wait_recorded()
    level.publish_checkpoint(120)
    level.close()                                   # waits for the last record
    assert recorded == [150, 120] and level.checkpoint == 120
    alone = RedisCache(REDIS_URL, prefix, "d", True, StateCache(1 << 20))
    alone.publish_checkpoint(300)
    alone.wait_recorded()
    assert alone.checkpoint == 300
    level.forget_checkpoint()
    assert level.checkpoint == -1
    assert list(raw().scan_iter(match=f"{prefix}*")) == []


def test_a_checkpoint_published_during_a_record_waits_for_nothing(prefix, caplog, monkeypatch):
    """While the thread records one checkpoint (the database's write lock may be held),
    publishing others returns at once; the thread then records the newest of them alone,
    and a record that raises neither stops it nor reaches the caller."""
    recorded: list[int] = []
    held = threading.Event()
    started = threading.Event()

    def record(tid: int) -> None:
        if tid == 1:
            started.set()
            assert held.wait(30)
            raise RuntimeError("lost the connection")
        recorded.append(tid)
    level = RedisCache(REDIS_URL, prefix, "d", True, StateCache(1 << 20), record)
    level.publish_checkpoint(1)
    assert started.wait(30)
    # A daemon thread, named: a process may exit while the database's lock holds it.
    recorder = level._recording
    assert recorder is not None and recorder.name == "zodbsql cache checkpoint"
    assert recorder.daemon and recorder.is_alive()
    begun = time.monotonic()
    level.publish_checkpoint(2)
    level.publish_checkpoint(3)
    assert time.monotonic() - begun < TIMEOUT / 2 and level.checkpoint == 3
    level.wait_recorded(0.2)                        # gives up after its timeout
    assert time.monotonic() - begun < 5 and recorder.is_alive()
    monkeypatch.setattr(secondlevel, "CLOSE_WAIT", 0.2)
    RedisCache.close(level)                         # gives up too (the client reopens)
    assert time.monotonic() - begun < 5
    with caplog.at_level(logging.ERROR, logger=secondlevel.__name__):
        held.set()
        level.wait_recorded()
    assert recorded == [3]
    assert [record.getMessage() for record in caplog.records] == [
        "zodbsql: recording the Redis cache's checkpoint failed"]
    assert "lost the connection" in caplog.text
    level.publish_checkpoint(4)                     # a new thread once that one ended
    level.close()
    assert recorded == [3, 4]


def test_what_one_process_stores_another_finds_under_the_key_its_index_names(prefix):
    """States stored at a snapshot go under the checkpoint when they did not change
    after it (also when the snapshot is the checkpoint), else under their tid; a
    commit's own under its tid; before any checkpoint under their tid.  Another
    process, its index covering the same changes, finds each; states nobody stored
    are misses; oids its index can't name are not asked for.  Hits, misses and
    states stored are counted, and every key expires."""
    changes = [(5, 150), (9, 180)]
    writer = RedisCache(REDIS_URL, prefix, "d", True, indexed(100, 200, changes))
    writer.store([(4, 40, b"four")], 200)           # no checkpoint yet: under its tid
    assert raw().get(writer.key(4, 40)) == (40).to_bytes(8, "big") + b"four"
    writer.publish_checkpoint(100)
    writer.store([(7, 90, b"seven"), (5, 150, b"five")], 200)
    writer.store([(8, 60, b"eight"), (13, 100, b"")], 100)   # at the checkpoint itself
    writer.store([(9, 180, b"nine")], None)         # a commit's own
    writer.store([], 200)
    assert writer.stored == 6
    assert raw().get(writer.key(7, 100)) == (90).to_bytes(8, "big") + b"seven"
    assert raw().get(writer.key(5, 150)) == (150).to_bytes(8, "big") + b"five"
    assert raw().get(writer.key(8, 100)) is not None
    assert raw().get(writer.key(9, 180)) is not None
    assert 0 < raw().ttl(writer.key(7, 100)) <= EXPIRE

    reader = RedisCache(REDIS_URL, prefix, "d", True, indexed(100, 200, changes))
    reader.checkpoint = 100
    assert reader.load(7, 200) == (b"seven", 90)
    assert reader.load(5, 200) == (b"five", 150)
    assert reader.load(8, 200) == (b"eight", 60)
    assert reader.load(9, 200) == (b"nine", 180)
    assert reader.load(13, 200) == (b"", 100)       # a state of no bytes is a state
    assert (reader.hits, reader.misses) == (5, 0)
    assert reader.load(11, 200) is None             # nobody stored it
    assert reader.load(12, 200) is None
    assert (reader.hits, reader.misses) == (5, 2)
    assert reader.load(7, 250) is None              # past the index: not asked
    assert (reader.hits, reader.misses) == (5, 2)
    found = reader.load_many([7, 5, 8, 11, 12, 13, 9], 200)
    assert found == {7: (b"seven", 90), 5: (b"five", 150), 8: (b"eight", 60),
                     13: (b"", 100), 9: (b"nine", 180)}
    assert (reader.hits, reader.misses) == (10, 4)
    assert reader.load_many([7, 5], 250) == {}      # none it can name
    assert (reader.hits, reader.misses) == (10, 4)


def test_an_outage_is_warned_about_once_and_so_is_the_recovery(prefix, caplog, monkeypatch):
    """Redis unreachable: the call answers None, one warning names the server and the
    retry; for RETRY seconds nothing is asked of it (answered None at once); the first
    call that works after that says so once; a second outage warns again."""
    monkeypatch.setattr(secondlevel, "RETRY", 0.3)
    level = RedisCache(REDIS_URL, prefix, "d", True, indexed(100, 200, []))
    working = level.client
    level.client = redis.Redis.from_url(NOWHERE, socket_timeout=TIMEOUT,
                                        socket_connect_timeout=TIMEOUT)
    level.checkpoint = 100
    with caplog.at_level(logging.WARNING, logger="zodbsql"):
        assert level.load(7, 200) is None
        assert level.load_many([7, 8], 200) == {}
        level.store([(7, 90, b"seven")], 200)
    assert (level.stored, level.hits, level.misses) == (0, 0, 3)
    (down,) = caplog.records
    assert re.fullmatch(
        rf"zodbsql: the Redis cache at {re.escape(REDIS_URL)} is unreachable \(.+\);"
        r" loading from the database, trying again every 0 s", down.getMessage())
    assert "Connection refused" in down.getMessage()
    caplog.clear()
    level.client = working                          # back, but not asked yet
    with caplog.at_level(logging.WARNING, logger="zodbsql"):
        level.store([(7, 90, b"seven")], 200)
        assert level.stored == 0 and raw().get(level.key(7, 100)) is None
        time.sleep(0.35)
        level.store([(7, 90, b"seven")], 200)
        assert level.stored == 1
        assert level.load(7, 200) == (b"seven", 90)
    assert [r.getMessage() for r in caplog.records] == [
        f"zodbsql: the Redis cache at {REDIS_URL} is reachable again"]
    caplog.clear()
    level.client = redis.Redis.from_url(NOWHERE, socket_timeout=TIMEOUT,
                                        socket_connect_timeout=TIMEOUT)
    with caplog.at_level(logging.WARNING, logger="zodbsql"):
        assert level.load(7, 200) is None
    assert len(caplog.records) == 1 and "unreachable" in caplog.records[0].getMessage()
