"""The writers of one SQLite file in this process that waited long, let in one at a
time, in arrival order.

SQLite's own wait for its write lock (the busy handler) sleeps and tries again, with
sleeps growing to 100 ms: a waiter can lose every try to threads that arrive later.
With dozens of threads committing to one file (ZODB's race tests run 64 on two CPUs) a
thread waited out a 30 s ``commit-lock-timeout`` so.  A writer that has waited
``connections.PATIENCE`` there takes a turn here instead, and while anyone has the turn
every new writer of the process queues too; each hands the turn straight to the next.
Only then: a queue for every commit cost a third of the commits of 8 threads (each
hand-over waits for the next thread to be scheduled), where the busy handler lets the
thread that holds the interpreter commit again at once.
"""
from __future__ import annotations

import collections
import os
import threading


class WriterQueue:
    """A lock with a timeout whose waiters get it in the order they asked."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        self._waiting: collections.deque[threading.Lock] = collections.deque()

    def crowded(self) -> bool:
        """Does a writer have the turn or wait for it?"""
        return self._held

    def acquire(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the turn; False if it did not come."""
        with self._mutex:
            if not self._held:
                self._held = True
                return True
            gate = threading.Lock()
            gate.acquire()
            self._waiting.append(gate)
        if gate.acquire(timeout=timeout):
            return True
        with self._mutex:
            if gate in self._waiting:
                self._waiting.remove(gate)
                return False
        return True     # handed over as the wait ran out: the turn is this thread's

    def release(self) -> None:
        """End the turn: hand it to the longest waiter, if any."""
        with self._mutex:
            if self._waiting:
                self._waiting.popleft().release()   # ``_held`` stays True: it is theirs
            else:
                self._held = False


_queues: dict[str, WriterQueue] = {}
_queues_lock = threading.Lock()


def queue_for(path: str) -> WriterQueue:
    """The queue of the file at ``path`` (the adapter's absolute path: it opens even
    ``:memory:`` as a file of that name, never as a URI)."""
    key = os.path.realpath(path)
    with _queues_lock:
        found = _queues.get(key)
        if found is None:
            found = _queues[key] = WriterQueue()
        return found
