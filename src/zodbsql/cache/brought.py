"""The states a prefetch brought to one storage instance, held until its loads ask.

A batch of prefetched states enters the shared state cache, and each of them was then
loaded from there: the cache's lock, its lookups through the segments and a copy out of
its log, for a state the instance had in hand a moment before (a fifth of a cold load's
time in a profile on SQLite).  Held here, 1,000 cold loads took 7.7 to 8.3 ms instead
of 9.0 to 9.3.

So the instance also keeps the batch, by oid, for the snapshot it was read at, and a
load takes its state from here first.  What the cache would have counted for those hits
(the admission sketch's count, the marks of states in probation and protected, its hit
counter) it is told in bulk (``StateCache.note_hits``), before the instance's next miss
and whenever the snapshot moves; a state the cache no longer holds enters it then, as a
load's would.  A state held here is the one the snapshot sees, whatever the shared
cache kept or turned away since.

Bounded: what is held stays within the prefetch's bytes (``limit_bytes``, what one batch
may bring), counted as CPython holds it (``HELD_ENTRY_BYTES`` a state besides its
pickle); a batch that would pass it replaces what is left, which the shared cache
still serves.  Counting the pickles alone let it hold 2.2 times its bound: a 10 MB
cache's process held ~1.1 MB here where 512 KB was meant.  An instance released (its
ZODB connection closed) holds nothing.
"""
from __future__ import annotations

from typing import Protocol

#: Hits counted in the shared cache at once, at most.
NOTE_EVERY = 256
#: What a held state costs besides its pickle, as CPython 3.11 allocates it on 64 bits:
#: the ``(state, tid)`` tuple 56, the tid's int 48 and the oid's 32 (pymalloc's 16-byte
#: blocks), the ``bytes`` header 33 and its rounding, and its slot in the dict (37 to 53).
HELD_ENTRY_BYTES = 224


def held_cost(state: bytes) -> int:
    """What holding ``state`` costs."""
    return len(state) + HELD_ENTRY_BYTES


class CountsHits(Protocol):
    epoch: int

    def note_hits(self, rows: list[tuple[int, int, bytes]], snapshot: int,
                  epoch: int) -> None: ...


class Brought:
    """Prefetched states ``oid -> (state, tid)`` of one snapshot, until asked for."""

    __slots__ = ("states", "snapshot", "_epoch", "_bytes", "_limit_bytes", "_used", "_cache")

    def __init__(self, cache: CountsHits, limit_bytes: int) -> None:
        self.states: dict[int, tuple[bytes, int]] = {}
        self.snapshot = -1
        self._epoch = cache.epoch           # the shared cache's, when the batch came
        self._bytes = 0
        self._limit_bytes = max(0, limit_bytes)
        self._used: list[tuple[int, int, bytes]] = []
        self._cache = cache

    def take(self, oid: int, snapshot: int) -> tuple[bytes, int] | None:
        """``oid``'s state and tid as of ``snapshot``, if a batch of it brought them
        (they are given once: a load takes them, ZODB keeps the object).  Nothing
        after the shared cache was cleared (a reset: the database went back in time)."""
        if snapshot != self.snapshot or self._epoch != self._cache.epoch:
            self.drop()
            return None
        found = self.states.pop(oid, None)
        if found is not None:
            self._bytes -= held_cost(found[0])
            used = self._used
            used.append((oid, found[1], found[0]))
            if len(used) >= NOTE_EVERY:
                self.note()
        return found

    def add(self, rows: list[tuple[int, int, bytes]], snapshot: int) -> None:
        """Hold the states ``(oid, tid, state)`` a batch read as of ``snapshot``."""
        if not rows or self._limit_bytes == 0:
            return
        size = sum(held_cost(state) for _, _, state in rows)
        epoch = self._cache.epoch
        if (snapshot != self.snapshot or epoch != self._epoch
                or self._bytes + size > self._limit_bytes):
            self.drop()
            self.snapshot, self._epoch = snapshot, epoch
        if size > self._limit_bytes:
            return
        states = self.states
        for oid, tid, state in rows:
            held = states.get(oid)
            if held is not None:
                self._bytes -= held_cost(held[0])
            states[oid] = (state, tid)
        self._bytes += size

    def note(self) -> None:
        """Count the hits served from here in the shared cache."""
        if self._used:
            used, self._used = self._used, []
            self._cache.note_hits(used, self.snapshot, self._epoch)

    def drop(self) -> None:
        """Forget what is held (the snapshot moved, the instance is released), the
        hits it served counted first."""
        self.note()
        if self.states:
            self.states = {}
        self._bytes = 0
        self.snapshot = -1
