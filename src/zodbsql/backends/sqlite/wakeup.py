"""SQLite's commit watch: ``PRAGMA data_version`` on the instance's load connection.

The value changes when any other connection (another process, or this one's committing
connections) has committed since the connection's previous read, and never otherwise;
it is local to the connection.  Reading it costs one in-process statement and no disk
read: it starts a read transaction, which SQLite does for the poll too, but looks up
no table.  A check reads it first; if it is the value read before the instance's last
poll, on the same connection, nothing committed since that poll began, so its snapshot
is still the newest.  Otherwise the instance polls and keeps the value just read (read
before that poll, so a commit racing with the poll changes it again next time).
"""
from __future__ import annotations

from typing import Callable

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.wakeup import CommitWatch

DATA_VERSION = "PRAGMA data_version"


class DataVersionWatch(CommitWatch):
    method = "PRAGMA data_version (one in-process statement, no disk read)"
    reads_connection = True

    def quiet(self, conn: Callable[[], ConnectionRole], snapshot: int,
              token: object) -> tuple[bool, object]:
        load = conn()
        row = load.fetchone(DATA_VERSION)
        # The value is the connection's own: a token from another connection (the load
        # connection was replaced) proves nothing.
        seen = (load, int(row[0])) if row else None
        if seen is None or not isinstance(token, tuple):
            return False, seen
        return token[0] is seen[0] and token[1] == seen[1], seen
