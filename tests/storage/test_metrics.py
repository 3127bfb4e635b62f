"""Metrics (``metrics``, ``metrics-port``): after a workload whose events are known, the
values read from prometheus_client's registry, and scraped over HTTP, are those events."""
from __future__ import annotations

import urllib.request
import uuid
from typing import Any

import pytest
import transaction
import ZODB
from BTrees.Length import Length
from persistent.mapping import PersistentMapping
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import ConflictError, ReadConflictError
from ZODB.tests.MinPO import MinPO
from ZODB.tests.StorageTestBase import zodb_pickle
from ZODB.utils import z64

from tests.fault.servers import free_port

from prometheus_client import REGISTRY

from zodbsql.errors import CommitLockTimeout


def value(name: str, storage: str, **labels: str) -> float:
    found = REGISTRY.get_sample_value(name, {"storage": storage, **labels})
    return found or 0.0


def workload(db: Any) -> dict[str, int]:
    """Commits, a raised and a resolved conflict, cache hits and database loads."""
    tm1, tm2 = transaction.TransactionManager(), transaction.TransactionManager()
    c1 = db.open(tm1)
    c1.root()["counter"] = Length()
    c1.root()["plain"] = PersistentMapping()
    c1.root()["items"] = PersistentMapping({i: PersistentMapping(n=i) for i in range(20)})
    tm1.commit()                                              # commit 1
    c2 = db.open(tm2)
    c2.root()["counter"].change(1)
    c2.root()["plain"]["a"] = 1
    c1.root()["counter"].change(1)
    c1.root()["plain"]["a"] = 2
    tm1.commit()                                              # commit 2
    c2.root()["counter"].change(1)                            # Length resolves ...
    del c2.root()["plain"]["a"]                               # ... a mapping does not
    with pytest.raises(ConflictError):
        tm2.commit()
    tm2.abort()
    c2.root()["counter"].change(5)
    tm2.commit()                                              # commit 3, resolved
    c1.close()
    c2.close()
    db.cacheMinimize()
    db.storage.shared.cache.clear()                           # as a new process would
    conn = db.open(tm1)
    items = conn.root()["items"]
    assert sum(items[i]["n"] for i in range(20)) == 190       # loads
    tm1.commit()
    conn.close()
    return {"commits": 3, "conflicts": 1, "resolved": 1}


def test_the_figures_are_what_happened(storage_factory: Any) -> None:
    name = f"metrics-{uuid.uuid4().hex[:8]}"
    storage = storage_factory.open(metrics=True, name=name)
    db = ZODB.DB(storage)
    try:
        before_commits = value("zodbsql_commits_total", name)
        happened = workload(db)
        # ZODB.DB's creation of the root is one commit too.
        assert value("zodbsql_commits_total", name) - before_commits == happened["commits"]
        assert value("zodbsql_conflicts_total", name, kind="conflict") == happened["conflicts"]
        assert value("zodbsql_conflicts_total", name, kind="resolved") == happened["resolved"]
        assert value("zodbsql_vote_seconds_count", name) >= happened["commits"] + 1
        assert value("zodbsql_finish_seconds_count", name) == value("zodbsql_commits_total", name)
        # Durations, not clock readings: a handful of small commits take well under 60 s.
        assert 0 < value("zodbsql_vote_seconds_sum", name) < 60
        assert 0 < value("zodbsql_finish_seconds_sum", name) < 60
        assert value("zodbsql_written_bytes_total", name) > 20 * 20
        from_db = value("zodbsql_loads_total", name, source="database")
        cached = (value("zodbsql_loads_total", name, source="cache")
                  + value("zodbsql_loads_total", name, source="prefetch"))
        assert from_db >= 1 and from_db + cached >= 21
        assert value("zodbsql_read_bytes_total", name) > 0
        assert value("zodbsql_polls_total", name) >= 4
        assert value("zodbsql_invalidations_total", name) >= 1
        cache = storage.shared.cache
        assert value("zodbsql_cache_hits", name) == cache.hits > 0
        assert value("zodbsql_cache_misses", name) == cache.misses
        assert value("zodbsql_cache_entries", name) == len(cache)
        assert value("zodbsql_cache_limit_bytes", name) == cache.limit
        assert value("zodbsql_pool_in_use", name) == 0
        db.pack()
        packed = [s for metric in REGISTRY.collect() if metric.name == "zodbsql_pack_done"
                  for s in metric.samples if s.labels["storage"] == name]
        assert packed, "a pack reports its phases"
    finally:
        db.close()
    assert REGISTRY.get_sample_value("zodbsql_cache_entries", {"storage": name}) is None


def test_a_read_current_conflict_at_vote_is_counted_under_its_kind(
        storage_factory: Any) -> None:
    """readCurrent of an object another connection changed since: the vote raises a
    read conflict, counted as such (not as a write conflict)."""
    name = f"metrics-{uuid.uuid4().hex[:8]}"
    db = ZODB.DB(storage_factory.open(metrics=True, name=name))
    try:
        with db.transaction() as conn:
            conn.root()["watched"] = PersistentMapping()
            conn.root()["other"] = PersistentMapping()
        tm1, tm2 = transaction.TransactionManager(), transaction.TransactionManager()
        reader, writer = db.open(tm1), db.open(tm2)
        reader.readCurrent(reader.root()["watched"])
        reader.root()["other"]["x"] = 1
        writer.root()["watched"]["changed"] = True
        tm2.commit()
        with pytest.raises(ReadConflictError):
            tm1.commit()
        tm1.abort()
        assert value("zodbsql_conflicts_total", name, kind="read_conflict") == 1
        assert value("zodbsql_conflicts_total", name, kind="conflict") == 0
        reader.close()
        writer.close()
    finally:
        db.close()


def test_a_commit_lock_timeout_at_finish_is_counted_under_its_kind(
        storage_factory: Any) -> None:
    """A finish that waits out commit-lock-timeout behind another session holding the
    commit lock raises CommitLockTimeout, counted as lock_timeout.  On the servers
    only: SQLite's vote takes the write lock that its finish's COMMIT releases, so
    nothing can take the lock in between."""
    name = f"metrics-{uuid.uuid4().hex[:8]}"
    storage = storage_factory.open(metrics=True, name=name, commit_lock_timeout=0.5)
    backend = storage.shared.backend
    if backend.features.writes_at_vote:
        pytest.skip("the vote holds the write lock until finish's COMMIT")
    instance = storage.new_instance()
    holder = backend.connect()
    txn = TransactionMetaData()
    try:
        instance.tpc_begin(txn)
        instance.store(instance.new_oid(), z64, zodb_pickle(MinPO(1)), "", txn)
        instance.tpc_vote(txn)
        backend.locker.begin_commit(holder, 5)
        backend.locker.lock_commit(holder, 5)
        with pytest.raises(CommitLockTimeout):
            instance.tpc_finish(txn)
        assert value("zodbsql_conflicts_total", name, kind="lock_timeout") == 1
        assert value("zodbsql_conflicts_total", name, kind="conflict") == 0
    finally:
        holder.rollback()
        holder.close()
        instance.tpc_abort(txn)
        instance.release()
        storage.close()


def test_off_by_default(storage_factory: Any) -> None:
    name = f"metrics-off-{uuid.uuid4().hex[:8]}"
    storage = storage_factory.open(name=name)
    db = ZODB.DB(storage)
    try:
        workload(db)
        assert storage.shared.metrics is None
        assert REGISTRY.get_sample_value("zodbsql_commits_total", {"storage": name}) is None
    finally:
        db.close()


def test_a_real_endpoint_serves_them(storage_factory: Any) -> None:
    port = free_port()
    name = f"metrics-http-{uuid.uuid4().hex[:8]}"
    db = ZODB.DB(storage_factory.open(metrics=True, metrics_port=port, name=name))
    try:
        with db.transaction() as conn:
            conn.root()["x"] = 1
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    finally:
        db.close()
    assert f'zodbsql_commits_total{{storage="{name}"}} 2.0' in text  # root creation + ours
    assert f'zodbsql_cache_limit_bytes{{storage="{name}"}}' in text


def test_polls_count_what_others_changed_and_loads_say_where_they_came_from(
        storage_factory: Any) -> None:
    """Exact figures: a poll counts the objects another storage changed, not the
    instance's own commit; each load is counted once under its source, a prefetch
    adds the bytes it read and a load from the database those of its state and of
    what came with it; a read conflict is counted under its kind."""
    from ZODB.utils import z64

    from tests.storage.test_wakeup import commit_again, wait_until_heard
    name = f"metrics-polls-{uuid.uuid4().hex[:8]}"
    storage = storage_factory.open(metrics=True, name=name)
    writer = ZODB.DB(storage_factory.open())             # another process
    instance = storage.new_instance()
    try:
        with writer.transaction() as conn:
            for key in "xyz":
                conn.root()[key] = PersistentMapping(v=0)
        with writer.transaction() as conn:
            oids = [conn.root()[key]._p_oid for key in "xyz"]
        instance.poll_invalidations()
        polls, invalidations = (value("zodbsql_polls_total", name),
                                value("zodbsql_invalidations_total", name))
        with writer.transaction() as conn:
            conn.root()["x"]["v"] = conn.root()["y"]["v"] = 1
        wait_until_heard(storage, writer.storage.lastTransaction())
        assert len(instance.poll_invalidations()) == 2
        assert value("zodbsql_polls_total", name) == polls + 1
        assert value("zodbsql_invalidations_total", name) == invalidations + 2
        commit_again(instance, oids[2])                  # the instance's own commit
        assert instance.poll_invalidations() == []
        assert value("zodbsql_polls_total", name) == polls + 2
        assert value("zodbsql_invalidations_total", name) == invalidations + 2
        storage.shared.cache.clear()
        instance.poll_invalidations()
        read = value("zodbsql_read_bytes_total", name)
        instance.prefetch(oids[:2])
        prefetched = value("zodbsql_read_bytes_total", name) - read
        assert prefetched == sum(len(instance.load(oid)[0]) for oid in oids[:2])
        storage.shared.cache.clear()
        instance.poll_invalidations()
        loads = {source: value("zodbsql_loads_total", name, source=source)
                 for source in ("database", "cache", "prefetch")}
        read = value("zodbsql_read_bytes_total", name)
        instance.load(z64)              # the root, from the database: brings x, y, z
        # The bytes of the root's state and of the states that came with it.
        assert value("zodbsql_read_bytes_total", name) - read == sum(
            len(writer.storage.load(oid)[0]) for oid in [z64, *oids])
        instance.load(oids[0])          # brought by the root's load
        instance.load(oids[0])          # then simply cached
        assert {source: value("zodbsql_loads_total", name, source=source) - count
                for source, count in loads.items()} == {
                    "database": 1, "cache": 1, "prefetch": 1}
        if not storage_factory.param.keep_history:
            # A state changed after the snapshot, read once its read transaction
            # ended: a read conflict, counted under its kind.
            conflicts = value("zodbsql_conflicts_total", name, kind="read_conflict")
            storage.shared.cache.clear()
            instance.poll_invalidations()
            instance.afterCompletion()
            with writer.transaction() as conn:
                conn.root()["z"]["v"] = 2
            with pytest.raises(ReadConflictError):
                instance.load(oids[2])
            assert value("zodbsql_conflicts_total", name,
                         kind="read_conflict") == conflicts + 1
    finally:
        instance.release()
        writer.close()
        storage.close()
