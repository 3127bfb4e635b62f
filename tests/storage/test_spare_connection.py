"""Load connections are handed on, not reopened: the root storage's, once it has checked
the schema, serves the DB's first instance, and a released instance's serves the next.
Each saved server session is a backend process the server need not start (PostgreSQL:
about 10 ms of its CPU); a process that opens a DB per job, like ZODB's race tests with
64 threads, opened three sessions per DB and now opens two."""
from __future__ import annotations

from typing import Any

import pytest
import ZODB
from ZODB.utils import z64


def _count_connects(storage: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The load connections the storage opens from now on."""
    opened: list[Any] = []
    shared = storage.shared
    connect = shared.connect

    def counted() -> Any:
        conn = connect()
        opened.append(conn)
        return conn

    monkeypatch.setattr(shared, "connect", counted)
    return opened


def _watch_close(conn: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Lists ``conn`` when it is closed."""
    closed: list[Any] = []
    close = conn.close

    def recorded_close() -> None:
        closed.append(conn)
        close()
    monkeypatch.setattr(conn, "close", recorded_close)
    return closed


def test_a_dbs_first_connection_reads_on_the_session_that_checked_the_schema(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = storage_factory.open()
    checked = storage._load
    opened = _count_connects(storage, monkeypatch)
    db = ZODB.DB(storage)                   # opens a ZODB connection to find the root
    try:
        with db.transaction() as conn:
            conn.root()["x"] = 1
            assert conn._storage._load is checked
        assert storage._load is None
        assert opened == []
        with db.transaction() as first, db.transaction() as second:
            assert first.root()["x"] == second.root()["x"] == 1
        assert len(opened) == 1             # the second ZODB connection's own
        assert storage.load(z64)[0]         # the root storage reads again on a new one
        assert len(opened) == 2
    finally:
        db.close()


def test_a_released_instance_hands_its_connection_to_the_next(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        first = storage.new_instance()
        first.poll_invalidations()
        assert first.load(z64)
        held = first._load
        opened = _count_connects(storage, monkeypatch)
        first.release()                     # mid-snapshot: rolled back, then kept
        assert not held.in_transaction
        second = storage.new_instance()
        second.poll_invalidations()
        assert second.load(z64)
        assert second._load is held
        assert opened == []
        third = storage.new_instance()      # the spare is taken: a new session
        third.poll_invalidations()
        assert len(opened) == 1
        for instance in (second, third):
            instance.release()
    finally:
        db.close()


def test_a_broken_connection_is_not_handed_on(storage_factory: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    storage = storage_factory.open()
    try:
        first = storage.new_instance()
        first.poll_invalidations()
        broken = first._load
        broken.broken = True
        closed = _watch_close(broken, monkeypatch)
        first.release()
        assert closed == [broken]
        second = storage.new_instance()
        second.poll_invalidations()
        assert second._load is not broken
        second.release()
    finally:
        storage.close()


def test_the_spare_is_closed_with_the_storage(storage_factory: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    storage = storage_factory.open()
    instance = storage.new_instance()
    instance.poll_invalidations()
    spare = instance._load
    instance.release()
    closed = _watch_close(spare, monkeypatch)
    storage.close()
    assert closed == [spare]
    other = storage_factory.open()
    try:
        # An instance released after its storage closed closes its connection.
        straggler = other.new_instance()
        straggler.poll_invalidations()
        conn = straggler._load
        shut = _watch_close(conn, monkeypatch)
        other.close()
        straggler.release()
        assert shut == [conn]
    finally:
        other.close()


def test_a_closed_instance_leaves_its_storage_open_and_forgets_its_snapshot(
        storage_factory: Any) -> None:
    """Closing (or releasing) an instance ends only that instance: the storage and its
    other instances go on loading, and the instance's snapshot no longer counts as one
    being read (a poll keeps exact revisions only for snapshots still read)."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        shared = storage.shared
        first, second = storage.new_instance(), storage.new_instance()
        first.poll_invalidations()
        assert shared.others_read_before(-1, 2 ** 63)
        first.release()
        assert not shared.others_read_before(-1, 2 ** 63)
        second.poll_invalidations()
        second.close()
        assert not shared.closed
        assert not shared.others_read_before(-1, 2 ** 63)
        third = storage.new_instance()
        third.poll_invalidations()
        assert third.load(z64)
        third.release()
    finally:
        db.close()
