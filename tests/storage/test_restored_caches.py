"""A database restored from a backup (a copy of its file here) under caches that saw
commits the restored database does not have: the Redis level, whose keys name states by
the tid they were current at, and the state cache file, whose states are current as of
its tid.  After the restore and a commit, whose tid passes those, a poll from their tid
sees only the restored database's commits; neither may then serve a state of a commit
the restore undid.  (A copy of a database that went its own way while sharing the Redis
server is the same case.)
"""
from __future__ import annotations

from typing import Any

import ZODB
from persistent.mapping import PersistentMapping
from ZODB.utils import u64

from tests.storage.test_redis_cache import redis_options  # noqa: F401
from tests.storage.test_rewound import copy_database

storage_backends = ("sqlite",)
storage_backends_reason = "a restore is a copy of the file here"


def write(storage: Any, value: int) -> None:
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        if "x" in conn.root():
            conn.root()["x"]["v"] = value
        else:
            conn.root()["x"] = PersistentMapping(v=value)
    db.close()


def read(storage: Any) -> int:
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            return int(conn.root()["x"]["v"])
    finally:
        db.close()


def restore_and_commit(storage_factory: Any, backup: str) -> None:
    """The backup copied over the database, then a commit (its tid passes every one the
    backup lacks)."""
    copy_database(backup, str(storage_factory.path))
    db = ZODB.DB(storage_factory.open())
    with db.transaction() as conn:
        conn.root()["y"] = 1
    db.close()


def test_states_of_commits_a_restore_undid_are_not_served(storage_factory,
                                                          redis_options) -> None:
    path = storage_factory.path
    write(storage_factory.open(**redis_options), 0)    # records the database_id too
    backup = str(path) + ".backup"
    copy_database(str(path), backup)
    write(storage_factory.open(), 1)
    # A process whose index moved past the checkpoint publishes its newest tid as the
    # new one (as a long-running process does), and reads.
    reader = storage_factory.open(**redis_options)
    reader.shared.second_level.publish_checkpoint(u64(reader.lastTransaction()))
    assert read(reader) == 1
    restore_and_commit(storage_factory, backup)
    assert read(storage_factory.open(**redis_options)) == 0


def test_a_persistent_cache_file_written_before_a_restore_is_not_adopted(
        storage_factory, tmp_path) -> None:
    path = storage_factory.path
    cache = {"cache_persistent_dir": str(tmp_path / "pcache")}
    write(storage_factory.open(**cache), 0)    # records the database_id
    backup = str(path) + ".backup"
    copy_database(str(path), backup)
    write(storage_factory.open(), 1)
    reader = storage_factory.open(**cache)
    assert read(reader) == 1                   # closed: the file holds x as of that commit
    restore_and_commit(storage_factory, backup)
    last = storage_factory.open(**cache)
    assert last.shared.persistent.loaded.wait(30)
    assert last.shared.persistent.found >= 2        # x and the root, as of that commit
    assert read(last) == 0


def test_a_process_running_through_a_restore_drops_its_checkpoint(storage_factory,
                                                                   redis_options) -> None:
    """A process with the Redis level runs while the backup is restored: its poll hears
    that the database went back in time and empties its cache, checkpoint included, so
    after the next commit it does not name states by a tid the restore undid."""
    path = storage_factory.path
    write(storage_factory.open(**redis_options), 0)
    backup = str(path) + ".backup"
    copy_database(str(path), backup)
    running = storage_factory.open(**redis_options)
    db = ZODB.DB(running)
    write(storage_factory.open(), 1)
    with db.transaction() as conn:
        assert conn.root()["x"]["v"] == 1
    level = running.shared.second_level
    level.publish_checkpoint(u64(running.lastTransaction()))
    with db.transaction() as conn:
        conn.root()._p_jar.cacheMinimize()
        assert conn.root()["x"]["v"] == 1       # now in Redis under that checkpoint
    copy_database(backup, str(path))            # the restore
    with db.transaction():
        pass                                    # the poll that hears of it
    assert running.shared.cache.polled == u64(running.lastTransaction())
    db_after = ZODB.DB(storage_factory.open())
    with db_after.transaction() as conn:
        conn.root()["y"] = 1                    # a commit after the restore
    db_after.close()
    with db.transaction() as conn:
        conn.root()._p_jar.cacheMinimize()      # x comes from Redis or the database
        assert conn.root()["x"]["v"] == 0
    db.close()
