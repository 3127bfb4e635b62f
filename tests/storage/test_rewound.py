"""A database that went back in time: a backup restored under running processes (a
failover to a standby that lacked the last commits is the same case on a server, run in
tests/replica/test_failover.py).  The next poll of every instance says "invalidate
everything" (None), the shared cache is emptied, and what is read afterwards is what the
database holds now, never a state cached before the restore."""
from __future__ import annotations

import logging
import pathlib
import sqlite3
from typing import Any

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.utils import u64, z64

storage_backends = ("sqlite",)
storage_backends_reason = ("a restore is a copy of the file here; the servers' case is"
                           " a failover (tests/replica/test_failover.py)")


def copy_database(source: str, target: str) -> None:
    """SQLite's online backup: a consistent copy, also into a file that is open."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)


def test_a_restored_backup_is_heard_by_every_instance_and_empties_the_cache_once(
        storage_factory: Any, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    tm = transaction.TransactionManager()
    root = db.open(tm).root()
    first, second, third = (storage.new_instance() for _ in range(3))
    try:
        root["x"] = PersistentMapping(v=1)
        tm.commit()
        oid, backed_up = root["x"]._p_oid, root["x"]._p_serial
        backup = str(tmp_path / "backup.sqlite")
        copy_database(storage_factory.path, backup)
        root["x"]["v"] = 2
        tm.commit()
        newer = root["x"]._p_serial
        for instance in (first, second, third):
            instance.poll_invalidations()
            assert instance.load(oid)[1] == newer        # the newer state, cached

        copy_database(backup, storage_factory.path)      # the restore
        with caplog.at_level(logging.WARNING, logger="zodbsql"):
            assert first.poll_invalidations() is None    # invalidate everything
        said = [r.getMessage() for r in caplog.records if "back in time" in r.getMessage()]
        assert said == [f"{storage.getName()}: the primary changed or went back in time"
                        f" (last tid 0x{u64(backed_up):016x}, seen 0x{u64(newer):016x}):"
                        " every cached state is dropped"]
        assert first.lastTransaction() == backed_up
        assert first.load(oid)[1] == backed_up           # not the state cached before
        # Another instance that finds the database behind too: the cache stays.
        assert third.poll_invalidations() is None
        hits = storage.shared.cache.hits
        assert third.load(oid)[1] == backed_up
        assert storage.shared.cache.hits == hits + 1
        # Once: the next poll names what was committed since, as any poll does.
        other = ZODB.DB(storage_factory.open())
        with other.transaction() as conn:
            conn.root()["y"] = PersistentMapping(v=0)
        with other.transaction() as conn:
            added, added_in = conn.root()["y"]._p_oid, conn.root()["y"]._p_serial
        other.close()
        assert sorted(first.poll_invalidations()) == sorted([z64, added])
        # Every instance hears it at its next poll, though that commit's tid is past
        # the one it last saw; the cache is emptied once, and what was read since is
        # served from it.
        assert u64(added_in) > u64(newer)
        assert second.poll_invalidations() is None
        hits = storage.shared.cache.hits
        assert second.load(oid)[1] == backed_up
        assert storage.shared.cache.hits == hits + 1
        assert sum("back in time" in r.getMessage() for r in caplog.records) == 1
        # ZODB's connection drops what it held; commits go on from the restored state.
        tm.begin()
        assert root["x"]["v"] == 1
        root["x"]["v"] = 3
        tm.commit()
        assert u64(root["x"]._p_serial) > u64(newer)
        # A second restore is heard as well (the resets are counted, not flagged).
        copy_database(backup, storage_factory.path)
        assert first.poll_invalidations() is None
        other = ZODB.DB(storage_factory.open())
        with other.transaction() as conn:
            conn.root()["z"] = PersistentMapping(v=0)
        other.close()
        assert second.poll_invalidations() is None
        assert sum("back in time" in r.getMessage() for r in caplog.records) == 2
    finally:
        for instance in (first, second, third):
            instance.release()
        db.close()
