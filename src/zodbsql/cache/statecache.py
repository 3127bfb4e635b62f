"""A state cache that never shows a connection a revision outside its snapshot.

States are kept by ``(oid, tid)``; such an entry never changes, so it can be shared by
every instance.  What an instance must know is *which* tid is current for an oid at its
snapshot tid ``X``.  The cache keeps a shared index ``current[oid] = tid``, valid as of
``polled`` (the newest tid any instance has polled), and complete for every oid changed
in ``(base, polled]``:

* if ``current[oid] = t`` and ``t <= X``, then ``t`` is current at ``X`` too, because
  nothing changed the object between ``t`` and ``polled >= X``;
* if ``t > X``, the cache can't tell which older revision ``X`` sees: ask the database;
* if ``oid`` is not in the index and ``X >= base``, the cache can't answer; what the
  database returns is recorded as current only when ``X == polled`` (it is current
  there).  A load at an older ``X`` is not: a pack may have deleted a newer revision
  before any poll saw it, so "not in the index" does not prove "unchanged since X".

Polls feed the index (every instance polls from a tid ``<= polled``, so each poll covers
the index's gap); when it grows past its bound it is emptied and ``base`` moves up.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

# Roughly what one index entry costs in a dict of ints.
INDEX_ENTRY_BYTES = 100


class StateCache:
    def __init__(self, size_bytes: int) -> None:
        self.limit = size_bytes
        self._states: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._bytes = 0
        self._current: dict[int, int] = {}
        self._max_index = max(1000, size_bytes // (4 * INDEX_ENTRY_BYTES))
        self.base = -1          # no instance has polled yet
        self.polled = -1
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def after_poll(self, since: int, upto: int, changes: list[tuple[int, int]]) -> None:
        """Record a poll that saw ``changes`` (oid, tid) in ``(since, upto]``."""
        if not self.enabled:
            return
        with self._lock:
            if self.polled < 0 or since > self.polled:
                # First poll, or a gap this poll doesn't cover: start the index afresh.
                self._current.clear()
                self.base = self.polled = upto
                return
            if upto <= self.polled:
                return
            for oid, tid in changes:
                if tid > self.polled:
                    self._current[oid] = tid
            self.polled = upto
            if len(self._current) > self._max_index:
                self._current.clear()
                self.base = upto

    def get(self, oid: int, snapshot: int) -> tuple[bytes, int] | None:
        """The state current at ``snapshot`` and its tid, if the cache knows it."""
        if not self.enabled:
            return None
        with self._lock:
            tid = self._current.get(oid)
            if tid is not None and tid <= snapshot and snapshot >= self.base:
                state = self._states.get((oid, tid))
                if state is not None:
                    self._states.move_to_end((oid, tid))
                    self.hits += 1
                    return state, tid
            self.misses += 1
            return None

    def has(self, oid: int, snapshot: int) -> bool:
        """Would ``get`` answer?  (Without counting a hit or a miss.)"""
        if not self.enabled:
            return False
        with self._lock:
            tid = self._current.get(oid)
            return (tid is not None and tid <= snapshot and snapshot >= self.base
                    and (oid, tid) in self._states)

    def get_revision(self, oid: int, tid: int) -> bytes | None:
        """The state ``oid`` had at ``tid`` exactly, if cached (revisions never change)."""
        if not self.enabled:
            return None
        with self._lock:
            return self._states.get((oid, tid))

    def put_loaded(self, oid: int, tid: int, state: bytes, snapshot: int) -> None:
        """Remember a state the database returned as current at ``snapshot``."""
        if not self.enabled:
            return
        with self._lock:
            if oid not in self._current and self.base <= snapshot == self.polled:
                self._current[oid] = tid
            self._put(oid, tid, state)

    def put_revision(self, oid: int, tid: int, state: bytes) -> None:
        """Remember an exact revision (a commit's own states)."""
        if not self.enabled:
            return
        with self._lock:
            self._put(oid, tid, state)

    def _put(self, oid: int, tid: int, state: bytes) -> None:
        key = (oid, tid)
        if key in self._states or len(state) > self.limit // 4:
            return
        self._states[key] = state
        self._bytes += len(state) + 64
        while self._bytes > self.limit and self._states:
            _, old = self._states.popitem(last=False)
            self._bytes -= len(old) + 64

    def clear(self) -> None:
        with self._lock:
            self._states.clear()
            self._bytes = 0
            self._current.clear()
            self.base = self.polled = -1

    def __len__(self) -> int:
        return len(self._states)

    @property
    def bytes_used(self) -> int:
        """What the cache counts against its limit: the states, and 64 bytes each."""
        return self._bytes
