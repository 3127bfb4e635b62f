"""The write-ahead log's checkpoints in a thread of their own, off the commits.

SQLite copies the WAL back into the database file (a checkpoint) in the commit whose
pages take it past ``wal-autocheckpoint``, and that commit's COMMIT returns only after
the copy and the sync of the database file: a storage that commits 1,000 changed
objects of 1.5 KB at a time paid 27 to 42 ms for it at one commit in six or seven
(3 to 5 ms otherwise), 8.1 ms of ``COMMIT`` a commit on average.

So a storage that writes runs a thread that checkpoints by itself (PASSIVE: it waits
for no reader or writer, and none waits for it), each time about half the threshold's
pages were written, and the sync happens while the process goes on with its next
transaction (the same commits, ``scripts/commit_times.py``: ``COMMIT`` 4.2 ms on
average, never above 6.6; the whole commit's mean 30.5 to 37.1 ms against 34.9 to
37.3, its median unchanged).  A checkpoint that copied the
whole log lets the next commit start the log over, so the commits' own checkpoint,
still set at the threshold, is reached only when the thread falls behind (or ended on
an error): the log stays bounded either way.

Python's sqlite3 does not tell how many pages a commit wrote (SQLite's WAL hook is not
exposed).  The thread counts this process's commits and learns from each checkpoint's
answer (the log's frames, and those checkpointed) how many frames the commits since the
one before wrote, so how many commits to let pass before the next one
(``commits_between``).
"""
from __future__ import annotations

import logging
import sqlite3
import threading

from zodbsql.errors import described

log = logging.getLogger(__name__)

#: Seconds ``close`` waits for a checkpoint under way to end.
JOIN_SECONDS = 10.0


def frames_written(before: tuple[int, int], after: tuple[int, int]) -> int:
    """The frames written to the log between two checkpoints, from their answers
    ``(log frames, checkpointed frames)``: all of the log if it started over since (the
    one before copied it all, or it is shorter now), else what it grew by."""
    log_before, done_before = before
    log_after = after[0]
    if done_before >= log_before or log_after < log_before:
        return log_after
    return log_after - log_before


def commits_between(every: int, commits: int, frames: int, target: int) -> int:
    """How many commits to let pass before the next checkpoint: as many as write
    ``target`` frames at the rate the last ``commits`` wrote ``frames``; at most twice
    ``every`` (a small first commit, the schema's, must not space them out for good)
    and at least one."""
    if commits <= 0 or frames <= 0:
        return 1
    return max(1, min(2 * every, target * commits // frames))


class WalCheckpointer:
    """The checkpoints of one database file for one storage (all its connections)."""

    def __init__(self, path: str, threshold_pages: int, synchronous: str,
                 lock_timeout: float) -> None:
        self.path = path
        #: Frames a checkpoint should find written since the one before.
        self.target = max(1, threshold_pages // 2)
        self._synchronous = synchronous
        self._lock_timeout = lock_timeout
        self._every = 1            # commits to let pass before the next checkpoint
        self._commits = 0          # commits since the last one (a hint: unlocked)
        self._wake = threading.Event()
        self._started = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        #: Checkpoints the thread made, and the times it woke (tests, and what an
        #: operator may ask).
        self.checkpoints = 0
        self.rounds = 0

    def committed(self) -> None:
        """A commit of this storage ended: the thread checkpoints when enough did."""
        if self._closed:
            return
        if self._thread is None:
            self._start()
        self._commits += 1
        if self._commits >= self._every:
            self._wake.set()

    def close(self) -> None:
        """Stop the thread, after the checkpoint it may be making."""
        self._closed = True
        self._wake.set()
        with self._started:
            thread = self._thread
        if thread is not None:
            thread.join(JOIN_SECONDS)

    def _start(self) -> None:
        with self._started:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name=f"zodbsql checkpoints of {self.path}",
                    daemon=True)
                self._thread.start()

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None,
                                   check_same_thread=False, timeout=self._lock_timeout)
        except sqlite3.Error as exc:
            log.warning("SQLite database %s: no checkpoints off the commits, the commits"
                        " make them (%s)", self.path, described(exc))
            return
        try:
            conn.execute(f"PRAGMA synchronous = {self._synchronous.upper()}")
            last = (0, 0)
            while True:
                self._wake.wait()
                if self._closed:
                    return
                self._wake.clear()
                commits, self._commits = self._commits, 0
                last = self._checkpoint(conn, commits, last)
                self.rounds += 1
        except sqlite3.Error as exc:
            log.warning("SQLite database %s: checkpoints go back to the commits (%s)",
                        self.path, described(exc))
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection, commits: int,
                    last: tuple[int, int]) -> tuple[int, int]:
        """A checkpoint after ``commits`` commits, the interval to the next learnt from
        its answer ``(log frames, checkpointed)`` and ``last``, the one before's; the
        answer to remember."""
        # A read first, so that the connection sees the file as it is: a new database
        # is switched to WAL after its schema, maybe after the connection last looked.
        conn.execute("PRAGMA schema_version").fetchone()
        row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        frames, done = int(row[1]), int(row[2])
        if frames < 0:          # not in WAL mode (yet)
            self._every = 1
            return last
        self.checkpoints += 1
        self._every = commits_between(
            self._every, commits, frames_written(last, (frames, done)), self.target)
        return frames, done
