"""A commit whose snapshot was taken before the server restarted or failed over is
refused at vote (``ServerChangedConflict``, a ConflictError), and its retry starts from
a fresh snapshot (storage.py ``_same_server``; commit.py ``vote``).  The backend's
``server_generation`` is raised by hand here, as its connect does when it finds the
server restarted (MySQL) or another primary (PostgreSQL)."""
from __future__ import annotations

from typing import Any

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.POSException import ConflictError
from ZODB.utils import z64

from tests.storage.test_gone import _commit
from zodbsql.errors import ServerChangedConflict


def _with_item(storage_factory: Any) -> tuple[Any, Any, Any]:
    """A database, a transaction manager and a connection; the root holds an item."""
    db = ZODB.DB(storage_factory.open())
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    conn.root()["item"] = PersistentMapping(value=1)
    tm.commit()
    return db, tm, conn


def test_a_commit_begun_before_a_server_change_is_refused(storage_factory: Any) -> None:
    db, tm, conn = _with_item(storage_factory)
    try:
        shared = db.storage.shared
        resets = shared.resets
        conn.root()["item"]["value"] = 2
        shared.backend.server_generation += 1       # what a connect after a restart does
        with pytest.raises(ServerChangedConflict) as raised:
            tm.commit()
        assert isinstance(raised.value, ConflictError)    # retried as a conflict is
        tm.abort()
        tm.begin()                                  # the retry: its poll resets the cache
        assert shared.resets == resets + 1 and shared.generation == shared.backend.server_generation
        assert conn.root()["item"]["value"] == 1
        conn.root()["item"]["value"] = 3
        tm.commit()
        tm.begin()
        assert conn.root()["item"]["value"] == 3
        tm.abort()
        conn.close()
    finally:
        db.close()


def test_a_start_after_a_server_change_polls_even_when_nothing_was_committed(
        storage_factory: Any) -> None:
    """A start the commit watch would let skip its poll (nothing committed since) polls
    after a server change: that poll is what empties the cache."""
    db, tm, conn = _with_item(storage_factory)
    try:
        tm.begin()
        conn.root()["item"]["value"]
        tm.abort()
        shared = db.storage.shared
        resets = shared.resets
        shared.backend.server_generation += 1
        tm.begin()
        assert shared.resets == resets + 1
        tm.abort()
        conn.close()
    finally:
        db.close()


def test_the_start_after_an_own_commit_polls_when_the_server_changed_since(
        storage_factory: Any) -> None:
    """An own commit made alone lets the next start take it for a poll's changes
    (``_moved_past_own_commit``), but not once the server changed after it: the start
    polls, that poll empties the cache, and it says everything may have changed."""
    storage = storage_factory.open()
    instance = storage.new_instance()
    try:
        _commit(instance, {z64: b"first"})
        _commit(instance, {z64: b"second"})    # alone: its poll came just before
        shared = storage.shared
        resets = shared.resets
        shared.backend.server_generation += 1       # after the commit, before the start
        assert instance.poll_invalidations() is None
        assert shared.resets == resets + 1 and shared.generation == shared.backend.server_generation
        assert instance.load(z64)[0] == b"second"
    finally:
        instance.release()
