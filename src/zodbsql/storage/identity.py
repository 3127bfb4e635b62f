"""Values recorded once in a database's meta table: its identity, its blob layout.

A database gets a random ``database_id`` the first time a storage that needs one opens
it (the persistent and Redis caches name their files and keys by it), so a cache
written for one database is never read for another, nor for the same name after
``zap_all`` recreated it.
"""
from __future__ import annotations

import uuid

from zodbsql.backends.base.contract import BackendContract, ConnectionRole

#: The meta entry holding the database's identity (32 hex digits).
DATABASE_ID = "database_id"
#: The meta entry holding the Redis level's checkpoint (cache/secondlevel.py), a tid.
CACHE_CHECKPOINT = "cache_checkpoint"


def recorded_once(backend: BackendContract, conn: ConnectionRole, name: str, value: str,
                  read_only: bool) -> str | None:
    """The meta value ``name``, recorded as ``value`` first when the database has none;
    None when it has none and the storage is read-only.  Processes opening a new
    database at once race to record it: the first to insert wins, and every one of them
    returns the winner's value (its insert waits for the other's and then adds nothing).
    """
    stored = backend.history.get_meta(conn, name)
    if stored is not None or read_only:
        return stored
    conn.begin_write()
    try:
        # No read before the insert: MySQL's snapshot would then predate the winner's.
        backend.history.add_meta(conn, name, value)
        stored = backend.history.get_meta(conn, name)
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    assert stored is not None   # inserted by this transaction or by the one it waited for
    return stored


def database_id(backend: BackendContract, conn: ConnectionRole, read_only: bool) -> str | None:
    return recorded_once(backend, conn, DATABASE_ID, uuid.uuid4().hex, read_only)


def cache_checkpoint(backend: BackendContract, conn: ConnectionRole, newest: int,
                     read_only: bool) -> int | None:
    """The Redis level's checkpoint, recorded as ``newest`` when the database has none
    (None: none, and the storage is read-only).  It is kept in the database, not in
    Redis: a database restored from a backup, or a copy of one that went its own way,
    then brings back a checkpoint of its own history, where one read from Redis could
    be a tid of commits the restore undid, whose states Redis still holds."""
    value = recorded_once(backend, conn, CACHE_CHECKPOINT, str(newest), read_only)
    return int(value) if value is not None else None


def advance_cache_checkpoint(backend: BackendContract, conn: ConnectionRole,
                             tid: int) -> None:
    """Record ``tid`` as the checkpoint, unless the one recorded is newer."""
    recorded = recorded_once(backend, conn, CACHE_CHECKPOINT, str(tid), False)
    if recorded is None or int(recorded) >= tid:
        return
    conn.begin_write()
    try:
        # Two processes at once may each write theirs: either is a tid of this
        # database's history, which is all a checkpoint must be.
        backend.history.update_meta(conn, CACHE_CHECKPOINT, str(tid))
        conn.commit()
    except BaseException:
        conn.rollback()
        raise

