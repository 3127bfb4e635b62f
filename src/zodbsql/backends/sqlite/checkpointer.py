"""SQLite's WAL checkpoints, run by a thread of their own rather than by a commit.

In WAL mode a commit appends its pages to the WAL; a checkpoint copies them back into
the database file and syncs it.  By default the commit that takes the WAL past 1,000
pages runs the checkpoint before it returns, so one commit in a dozen pays for the
others' pages: after the bench's `large` (10,000 objects), the next 1,000-object commit
took 37 to 41 ms instead of 25 (a database of 1,000,000 objects, this machine), and in
`zodbsql bench --prepopulate 1000000` that commit was `add`, 0.62 of FileStorage.

Here a storage's committing connections checkpoint only past ``SAFETY_PAGES`` (a
thread that cannot keep up, or none: a process forked after its storage opened),
and after each commit the storage nudges its checkpointer, whose thread, a pause
later (commits that come meanwhile share the checkpoint and its sync), runs a PASSIVE
checkpoint on a connection of its own: it copies what no reader still needs, waits for
no one, and a commit goes on meanwhile (SQLite's checkpoint lock is not its write
lock).  Checkpoints keep nothing safe that the WAL did not already: a commit is
durable in the WAL (``synchronous``), and a checkpoint cut short by a crash is run
again from the WAL at the next open.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.errors import ZodbsqlError

log = logging.getLogger(__name__)

#: The WAL's pages (4 KB each) past which a committing connection checkpoints itself.
SAFETY_PAGES = 10_000
#: Seconds the thread waits after a nudge, for the commits that follow to share it.
PAUSE = 0.05
CHECKPOINT = "PRAGMA wal_checkpoint(PASSIVE)"


class Checkpointer:
    """Runs a storage's WAL checkpoints in a thread, started at the first nudge."""

    def __init__(self, connect: Callable[[], ConnectionRole], pause: float = PAUSE) -> None:
        self._connect = connect
        self._pause = pause
        self._due = threading.Event()
        self._closing = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0
        #: Checkpoints run so far (tests and ``zodbsql report`` read it).
        self.runs = 0

    def nudge(self) -> None:
        """A commit was made: checkpoint soon."""
        if self._closing:
            return
        if self._thread is None or self._pid != os.getpid():
            self._start()
        self._due.set()

    def _start(self) -> None:
        with self._lock:
            if self._closing or (self._thread is not None and self._pid == os.getpid()):
                return
            # (In a child process forked after the start the parent's thread is gone.)
            self._pid = os.getpid()
            self._due = threading.Event()
            self._thread = threading.Thread(target=self._run, name="zodbsql-checkpoint",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        conn: ConnectionRole | None = None
        due = self._due
        try:
            while True:
                due.wait()
                # Cleared before the pause: a commit in the pause, or ``close``, sets it
                # again (the commits of the pause share the checkpoint after it).
                due.clear()
                if self._closing:
                    return
                time.sleep(self._pause)
                if self._closing:
                    return     # (the last connection's close checkpoints anyway)
                try:
                    if conn is None:
                        conn = self._connect()
                    conn.fetchone(CHECKPOINT)
                    self.runs += 1
                except ZodbsqlError as exc:
                    # The commits' own checkpoint past SAFETY_PAGES stays; try again
                    # after the next commit, on a new connection.
                    log.debug("WAL checkpoint failed: %s", exc)
                    if conn is not None:
                        conn.close()
                    conn = None
        finally:
            if conn is not None:
                conn.close()

    def close(self) -> None:
        """Stop the thread (after the checkpoint it may be running)."""
        self._closing = True
        self._due.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and self._pid == os.getpid():
            thread.join(10.0)
