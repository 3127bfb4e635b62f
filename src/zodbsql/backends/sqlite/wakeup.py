"""SQLite's commit watch: ``PRAGMA data_version`` on the instance's load connection.

The value changes when any other connection (another process, or this one's committing
connections) has committed since the connection's previous read, and never otherwise;
it is local to the connection.  Reading it costs one in-process statement and no disk
read: it starts a read transaction, which SQLite does for the poll too, but looks up
no table.  A check reads it first; if it is the value read before the instance's last
poll, on the same connection, nothing committed since that poll began, so its snapshot
is still the newest.  Otherwise the instance polls and keeps the value just read (read
before that poll, so a commit racing with the poll changes it again next time).

The instance's own commits change the value too (they come from its commit connection),
so after one the value can't tell whether another commit followed.  The commit row
can: the value is read first, then the last tid, and if that is the instance's own
commit nothing else was committed up to the second read, and a commit after it changes
the value kept.  The snapshot then moves to its own commit without a poll, whose rows
would have named the commit's own objects (1,000 rows after a commit of 1,000 objects,
0.8 ms).
"""
from __future__ import annotations

from typing import Callable

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.poller import LAST_TID
from zodbsql.backends.base.wakeup import CommitWatch

DATA_VERSION = "PRAGMA data_version"


class DataVersionWatch(CommitWatch):
    method = "PRAGMA data_version (one in-process statement, no disk read)"
    reads_connection = True

    def quiet(self, conn: Callable[[], ConnectionRole], snapshot: int,
              token: object) -> tuple[bool, object]:
        seen = self._read(conn)
        # The value is the connection's own: a token from another connection (the load
        # connection was replaced) proves nothing.
        if not isinstance(token, tuple):
            return False, seen
        return token[0] is seen[0] and token[1] == seen[1], seen

    def quiet_after_own_commit(self, conn: Callable[[], ConnectionRole], tid: int,
                               token: object) -> tuple[bool, object]:
        seen = self._read(conn)
        last = seen[0].fetchone(LAST_TID)
        return last is not None and int(last[0]) == tid, seen

    @staticmethod
    def _read(conn: Callable[[], ConnectionRole]) -> tuple[ConnectionRole, int]:
        """The load connection and its data_version now (the token a check keeps)."""
        load = conn()
        row = load.fetchone(DATA_VERSION)
        assert row is not None              # the pragma always answers one row
        return load, int(row[0])
