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

storage_backends = ("sqlite",)
storage_backends_reason = ("a restore is a copy of the file here; the servers' case is"
                           " a failover (tests/replica/test_failover.py)")


def copy_database(source: str, target: str) -> None:
    """SQLite's online backup: a consistent copy, also into a file that is open."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)


def test_a_restored_backup_empties_the_cache_once(storage_factory: Any, tmp_path: pathlib.Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    tm = transaction.TransactionManager()
    root = db.open(tm).root()
    first = storage.new_instance()
    second = storage.new_instance()
    try:
        root["x"] = PersistentMapping(v=1)
        tm.commit()
        oid, backed_up = root["x"]._p_oid, root["x"]._p_serial
        backup = str(tmp_path / "backup.sqlite")
        copy_database(storage_factory.path, backup)
        root["x"]["v"] = 2
        tm.commit()
        newer = root["x"]._p_serial
        for instance in (first, second):
            instance.poll_invalidations()
            assert instance.load(oid)[1] == newer        # the newer state, cached

        copy_database(backup, storage_factory.path)      # the restore
        with caplog.at_level(logging.WARNING, logger="zodbsql"):
            assert first.poll_invalidations() is None    # invalidate everything
        assert sum("went back in time" in r.getMessage() for r in caplog.records) == 1
        assert first.lastTransaction() == backed_up
        assert first.load(oid)[1] == backed_up           # not the state cached before
        assert first.poll_invalidations() == []          # once
        # Every instance hears it at its next poll; the cache is emptied once, and
        # what was read since is served from it.
        assert second.poll_invalidations() is None
        hits = storage.shared.cache.hits
        assert second.load(oid)[1] == backed_up
        assert storage.shared.cache.hits == hits + 1
        assert sum("went back in time" in r.getMessage() for r in caplog.records) == 1
        # ZODB's connection drops what it held.
        tm.begin()
        assert root["x"]["v"] == 1
        tm.abort()
    finally:
        for instance in (first, second):
            instance.release()
        db.close()
