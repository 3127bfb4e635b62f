"""Which server serves a snapshot, seen from what a storage reads.

The standby's replay is paused (``pg_wal_replay_pause``) so that it lags behind the
primary on purpose: a storage that reads from it sees the older state; its own commits
are never hidden from it (that snapshot comes from the primary); and once the lag
passes ``replica-max-lag`` the standby is skipped.
"""
from __future__ import annotations

import time
from typing import Any, Iterator

import pytest
import transaction
import ZODB

import zodbsql
from tests.databases import Param
from tests.replica.cluster import ReplicatedPostgreSQL
from tests.replica.factories import ReplicaFactory, read, write

pytestmark = pytest.mark.replica


@pytest.fixture(params=[True, False], ids=["hp", "hf"])
def factory(request: pytest.FixtureRequest,
            replicated: ReplicatedPostgreSQL) -> Iterator[ReplicaFactory]:
    made = ReplicaFactory(Param("postgresql", request.param), replicated)
    yield made
    assert replicated.standby is not None
    replicated.standby.pause_replay(False)
    made.cleanup()


def test_reads_come_from_the_standby(factory: ReplicaFactory) -> None:
    standby = factory.cluster.standby
    assert standby is not None
    write(factory.open(), 1)
    standby.wait_replayed()
    reader = ZODB.DB(factory.open(read_only=True))
    assert read(reader) == 1
    standby.pause_replay()
    write(factory.open(), 2)          # another process, as far as the reader knows
    assert read(reader) == 1          # what the standby has
    standby.pause_replay(False)
    standby.wait_replayed()
    assert read(reader) == 2
    reader.close()


def test_own_commits_are_never_hidden(factory: ReplicaFactory) -> None:
    standby = factory.cluster.standby
    assert standby is not None
    db = ZODB.DB(factory.open())
    with db.transaction() as conn:
        conn.root()["value"] = 1
    standby.wait_replayed()
    assert read(db) == 1
    standby.pause_replay()
    for value in (2, 3):
        with db.transaction() as conn:
            conn.root()["value"] = value
        assert read(db) == value      # the standby lags: this snapshot is the primary's
    db.close()


def test_an_own_commit_made_alone_is_read_from_the_primary(factory: ReplicaFactory) -> None:
    """A snapshot polled on the standby, then a commit of the same connection with
    nothing committed in between: the next start keeps the commit as its snapshot
    without a poll, and must read it from the primary (the standby lags)."""
    from persistent.mapping import PersistentMapping
    standby = factory.cluster.standby
    assert standby is not None
    db = ZODB.DB(factory.open(cache_size_mb=0))   # every load reaches a server
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    conn.root()["own"] = PersistentMapping(n=0)
    tm.commit()
    write(factory.open(), 1)        # another process: this connection's next start polls
    standby.wait_replayed()
    tm.begin()
    assert conn.root()["own"]["n"] == 0 and db.storage is not None
    tm.abort()
    standby.pause_replay()
    for n in (1, 2):
        tm.begin()
        conn.root()["own"]["n"] = n
        tm.commit()
        conn.cacheMinimize()        # the next read loads from the storage
        tm.begin()
        assert conn.root()["own"]["n"] == n
        tm.abort()
    conn.close()
    db.close()


def test_a_standby_past_the_lag_bound_is_skipped(factory: ReplicaFactory) -> None:
    standby = factory.cluster.standby
    assert standby is not None
    factory.replica["replica_max_lag"] = 0.5
    write(factory.open(), 1)
    standby.wait_replayed()
    standby.pause_replay()
    writer = zodbsql.open_storage(factory.backend_options(), keep_history=factory.param.keep_history)
    write(writer, 2)
    time.sleep(1.5)                   # the standby's last replayed commit is older now
    reader = ZODB.DB(factory.open(read_only=True))
    assert read(reader) == 2          # from the primary
    reader.close()


def _reader_on_the_standby(factory: ReplicaFactory, n: int) -> tuple[Any, bytes, Any, Any]:
    """A writer's DB with the root's "child" mapping committed and replayed on the
    standby, its oid, and a reader storage (no state cache: every load reaches a server)
    with an instance that has polled and loaded the root."""
    from persistent.mapping import PersistentMapping
    from ZODB.utils import z64
    standby = factory.cluster.standby
    assert standby is not None
    writer = ZODB.DB(factory.open())
    with writer.transaction() as conn:
        conn.root()["child"] = PersistentMapping(n=n)
    with writer.transaction() as conn:
        child = conn.root()["child"]._p_oid
    standby.wait_replayed()
    reader = factory.open(read_only=True, cache_size_mb=0)
    instance = reader.new_instance()
    instance.poll_invalidations()
    instance.load(z64)
    return writer, child, reader, instance

def _end_standby_session(factory: ReplicaFactory, instance: Any) -> int:
    """Terminate, on the standby, the session ``instance`` reads from; its pid."""
    standby = factory.cluster.standby
    replica = instance._replica
    assert standby is not None and replica is not None
    pid: int = replica.raw.info.backend_pid
    with standby.admin() as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return pid


def test_a_standby_poll_names_what_changed(factory: ReplicaFactory) -> None:
    """Polled on the standby, a start reports exactly the objects another process
    changed, not "everything" (which would empty every ZODB connection's cache at each
    start), and its snapshot reads the new states."""
    standby = factory.cluster.standby
    assert standby is not None
    writer, child, reader, instance = _reader_on_the_standby(factory, 0)
    try:
        instance.load(child)
        for n in (1, 2):
            with writer.transaction() as conn:
                conn.root()["child"]["n"] = n
            standby.wait_replayed()
            assert instance.poll_invalidations() == [child]
            assert instance._on_replica                   # polled on the standby
            assert instance.load(child)[0] == writer.storage.load(child)[0]
    finally:
        instance.release()
        reader.close()
        writer.close()


def test_a_standby_lost_mid_snapshot_hands_over_to_the_primary(
        factory: ReplicaFactory) -> None:
    """The standby's session ends (terminated on the standby) after the poll: the load
    that meets the loss fails with a retryable error, and the snapshot's next load is
    served by the primary, which has every revision it sees (history-free: inside a
    read transaction begun there); the instance has left the standby."""
    from transaction.interfaces import TransientError
    writer, child, reader, instance = _reader_on_the_standby(factory, 1)
    try:
        assert instance._on_replica
        _end_standby_session(factory, instance)
        with pytest.raises(TransientError):
            instance.load(child)
        assert instance.load(child)[0] == writer.storage.load(child)[0]
        assert not instance._on_replica
        if not factory.param.keep_history:
            assert instance._load.in_transaction
    finally:
        instance.release()
        reader.close()
        writer.close()


def test_a_standby_session_is_kept_across_polls_and_one_that_fails_is_replaced(
        factory: ReplicaFactory, caplog: pytest.LogCaptureFixture) -> None:
    """Polls reuse the standby session they found in bounds.  One that ends: history-
    preserving (reads outside a transaction) the next poll itself fails on it, and the
    primary serves it (logged at INFO with the reason), and the poll after connects a
    new standby session; history-free, the end of the read transaction finds it gone
    first, and the poll connects a new session at once."""
    import logging
    writer, child, reader, instance = _reader_on_the_standby(factory, 0)
    prefix = "standby poll failed, reading from the primary: "
    try:
        replica = instance._replica
        instance.poll_invalidations()
        assert instance._replica is replica and instance._on_replica
        pid = _end_standby_session(factory, instance)
        standby = factory.cluster.standby
        assert standby is not None
        for n in (1, 2):
            with writer.transaction() as conn:
                conn.root()["child"]["n"] = n
            standby.wait_replayed()
            with caplog.at_level(logging.INFO, logger="zodbsql.storage.storage"):
                assert instance.poll_invalidations() == [child]
            assert instance.load(child)[0] == writer.storage.load(child)[0]
            failed = [r.getMessage() for r in caplog.records
                      if r.getMessage().startswith(prefix)]
            if factory.param.keep_history and n == 1:
                assert len(failed) == 1 and "standby" in failed[0][len(prefix):], failed
                assert "was lost" in failed[0], failed
                assert not instance._on_replica and instance._replica is None
                continue
            assert instance._on_replica
            again = instance._replica
            assert again is not None and again.raw.info.backend_pid != pid
            assert len(failed) == (1 if factory.param.keep_history else 0)
            break
    finally:
        instance.release()
        reader.close()
        writer.close()


def test_a_standby_that_falls_behind_its_bound_is_left_at_the_next_poll(
        factory: ReplicaFactory) -> None:
    """A standby in bounds when it was chosen, then past replica-max-lag (its replay
    paused while the primary commits): the next poll leaves it and reads the new
    states from the primary."""
    factory.replica["replica_max_lag"] = 0.5
    writer, child, reader, instance = _reader_on_the_standby(factory, 0)
    try:
        assert instance._on_replica
        standby = factory.cluster.standby
        assert standby is not None
        standby.pause_replay()
        with writer.transaction() as conn:
            conn.root()["child"]["n"] = 1
        time.sleep(1.5)
        assert instance.poll_invalidations() == [child]
        assert not instance._on_replica
        assert instance.load(child)[0] == writer.storage.load(child)[0]
    finally:
        instance.release()
        reader.close()
        writer.close()


def test_a_standby_poll_names_the_objects_a_pack_deleted(factory: ReplicaFactory) -> None:
    """An object another process dropped and then packed away: the reader's next poll,
    on the standby, names it (the pack's deletion records), so its cached state goes
    and a load says the object is gone instead of serving the state it held."""
    from ZODB.POSException import POSKeyError
    standby = factory.cluster.standby
    assert standby is not None
    writer, child, reader, instance = _reader_on_the_standby(factory, 0)
    try:
        instance.load(child)                           # held in the state cache
        with writer.transaction() as conn:
            del conn.root()["child"]
        time.sleep(0.01)
        writer.pack(time.time())
        standby.wait_replayed()
        assert child in instance.poll_invalidations()
        assert instance._on_replica
        with pytest.raises(POSKeyError):
            instance.load(child)
    finally:
        instance.release()
        reader.close()
        writer.close()
