"""Commit watches: may a transaction start keep its snapshot instead of polling?

Every ZODB transaction start polls (``poller.py``) unless the backend's watch proves
that nothing committed since the poll that gave the instance its snapshot.  The base
watch proves nothing, so every start polls (MySQL: no check is cheaper than the poll's
one round trip).  SQLite's asks ``PRAGMA data_version`` (``sqlite/wakeup.py``), and
PostgreSQL's listens for the notification each commit sends (``postgresql/listener.py``).

The storage keeps, per instance, the ``token`` a check returned before its last poll
and hands it back at the next check; a watch that needs none returns None.
"""
from __future__ import annotations

from typing import Callable

from zodbsql.backends.base.contract import ConnectionRole


class CommitWatch:
    """A watch that never lets a poll be skipped (a ``CommitWatchRole``)."""

    #: How the watch tells, for ``zodbsql doctor`` and log lines.
    method = "none (every transaction start polls)"
    #: Does the check read the load connection?  Then, history-free, the storage runs
    #: it inside the read transaction that is the snapshot, so a skipped poll still
    #: leaves the snapshot fixed at the transaction start.  A watch that reads nothing
    #: lets a history-free start skip only while the read transaction of the last poll
    #: is still open (otherwise the first load would begin one, at a later snapshot).
    reads_connection = False

    def start(self) -> None:
        """Begin watching (at storage open)."""

    def quiet(self, conn: Callable[[], ConnectionRole], snapshot: int,
              token: object) -> tuple[bool, object]:
        """``(skip, token)``: skip is True only if provably nothing committed after
        ``snapshot``, the tid the instance's last poll returned, when that poll was made
        after the check that returned ``token`` (-1: the instance never polled, so
        skip is False, but the token goes with its first poll).  ``conn`` gives the instance's load
        connection, for a watch that asks it.  The token returned is to be handed back
        at the next check if a poll follows this one."""
        return False, None

    def quiet_after_own_commit(self, conn: Callable[[], ConnectionRole], tid: int,
                               token: object) -> tuple[bool, object]:
        """``quiet`` for ``tid``, the instance's own commit, which followed its snapshot
        with nothing between them: skip only if nothing committed after ``tid`` either.
        A watch whose token changes with the instance's own commits (SQLite's) checks
        another way."""
        return self.quiet(conn, tid, token)

    def committed(self, tid: int) -> None:
        """This process committed ``tid`` (called once the commit is durable)."""

    def reset(self) -> None:
        """The database was emptied and made again (``zap_all``): forget what was seen."""

    def close(self) -> None:
        """Stop watching; later checks never skip."""
