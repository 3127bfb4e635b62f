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
