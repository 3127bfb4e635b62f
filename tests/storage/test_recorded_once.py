"""Values recorded once in the meta table (storage/identity.py): processes that open a
new database at once race to record its blob layout, its identity and its keys' checks.
Each of them must end with the first one's value, and none may fail for the race."""
from __future__ import annotations

import pathlib
import threading
from typing import Any

from tests.together import call_at_once
from zodbsql.storage import identity

NAME = "test_recorded_once"


def test_a_racing_record_waits_and_takes_the_winners_value(storage_factory: Any) -> None:
    """While one transaction has inserted the value uncommitted, another process's
    record waits for it and returns it once it commits (it neither fails on the
    duplicate nor replaces it with its own)."""
    backend = storage_factory.open().backend        # the schema exists
    first, second = backend.connect(), backend.connect()
    try:
        first.begin_write()
        backend.history.set_meta(first, NAME, "first")
        returned: list[Any] = []

        def record() -> None:
            try:
                returned.append(identity.recorded_once(backend, second, NAME, "second",
                                                       False))
            except Exception as exc:    # reported by the assertion below
                returned.append(exc)
        racer = threading.Thread(target=record)
        racer.start()
        racer.join(0.5)
        assert racer.is_alive(), returned       # it waits for the first transaction
        first.commit()
        racer.join(30)
        assert returned == ["first"]
        assert backend.history.get_meta(first, NAME) == "first"
        # Recorded already: returned as it is, with nothing written.
        assert identity.recorded_once(backend, second, NAME, "third", False) == "first"
    finally:
        first.close()
        second.close()


def test_a_record_in_a_database_without_one_is_the_callers(storage_factory: Any) -> None:
    backend = storage_factory.open().backend
    conn = backend.connect()
    try:
        assert identity.recorded_once(backend, conn, NAME, "mine", True) is None
        assert backend.history.get_meta(conn, NAME) is None      # read-only: not written
        assert identity.recorded_once(backend, conn, NAME, "mine", False) == "mine"
        assert backend.history.get_meta(conn, NAME) == "mine"
        assert not conn.in_transaction

        def no_write() -> None:
            raise AssertionError("a write transaction")
        # Recorded: read without a write transaction (SQLite's would wait for the
        # write lock of a commit or a pack).
        conn.begin_write = no_write
        assert identity.recorded_once(backend, conn, NAME, "other", False) == "mine"
    finally:
        conn.close()


def test_storages_opening_a_new_database_at_once_all_open(
        storage_factory: Any, tmp_path: pathlib.Path) -> None:
    """Six storages with a blob directory open one new database at the same moment:
    every one opens (each records the blob layout unless another has)."""
    outcomes = call_at_once(
        6, lambda number: storage_factory.open(blob_dir=str(tmp_path / f"blobs{number}")))
    backend = outcomes[0].backend
    conn = backend.connect()
    try:
        assert backend.history.get_meta(conn, "blob_layout") == "database"
    finally:
        conn.close()


def test_the_cache_checkpoint_is_the_first_newest_and_moves_only_forward(
        storage_factory: Any) -> None:
    """The Redis level's checkpoint, kept in the database: none read-only (and nothing
    written), the first writable open's newest tid, then the same for every open; a
    newer one replaces it, an older one does not."""
    backend = storage_factory.open().backend
    conn = backend.connect()
    try:
        assert identity.cache_checkpoint(backend, conn, 100, True) is None
        assert backend.history.get_meta(conn, identity.CACHE_CHECKPOINT) is None
        assert identity.cache_checkpoint(backend, conn, 100, False) == 100
        assert identity.cache_checkpoint(backend, conn, 200, False) == 100
        assert identity.cache_checkpoint(backend, conn, 200, True) == 100
        assert identity.recorded_once(backend, conn, NAME, "beside", False) == "beside"
        others = dict(conn.fetchall("SELECT name, value FROM zodbsql_meta WHERE name <> %s",
                                    (identity.CACHE_CHECKPOINT,)))
        identity.advance_cache_checkpoint(backend, conn, 150)
        assert identity.cache_checkpoint(backend, conn, 300, False) == 150
        # Its row alone changed.
        assert dict(conn.fetchall("SELECT name, value FROM zodbsql_meta WHERE name <> %s",
                                  (identity.CACHE_CHECKPOINT,))) == others
        assert others[NAME] == "beside" and len(others) > 1
        identity.advance_cache_checkpoint(backend, conn, 120)
        identity.advance_cache_checkpoint(backend, conn, 150)
        assert backend.history.get_meta(conn, identity.CACHE_CHECKPOINT) == "150"
        assert not conn.in_transaction
    finally:
        conn.close()
    other = storage_factory.backend()
    conn = other.connect()
    try:
        # A database without one: the first advance records it.
        conn.begin_write()
        other.history.set_meta(conn, identity.CACHE_CHECKPOINT, "1")
        conn.execute("DELETE FROM zodbsql_meta WHERE name = %s", (identity.CACHE_CHECKPOINT,))
        conn.commit()
        identity.advance_cache_checkpoint(other, conn, 70)
        assert other.history.get_meta(conn, identity.CACHE_CHECKPOINT) == "70"
    finally:
        conn.close()
