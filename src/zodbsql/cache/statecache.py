"""A state cache that never shows a connection a revision outside its snapshot.

**What is current.**  A state is known by ``(oid, tid)``; such a revision never changes,
so it can be shared by every instance.  What an instance must know is *which* tid is
current for an oid at its snapshot tid ``X``.  The cache keeps the oids changed in
``(base, polled]`` (``polled`` is the newest tid any instance has polled) with their
newest tid, and beside them the states it knows to be current as of ``polled``:

* if a poll recorded ``changed[oid] = t`` and ``t <= X``, then ``t`` is current at ``X``
  too, because nothing changed the object between ``t`` and ``polled >= X``;
* if ``t > X``, the cache can't tell which older revision ``X`` sees: ask the database;
* if the cache holds no current state for ``oid``, what the database returns is kept
  as the oid's current state only when it was read at ``X == polled`` (it is current
  there).  A load at an older ``X`` is not: a pack may have deleted a newer revision
  before any poll reported it, so "not in ``changed``" does not prove "unchanged since
  X".

Polls feed ``changed`` (every instance polls from a tid ``<= polled``, so each poll covers
the index's gap) and retire the current states of the oids they name; when ``changed``
grows past its bound it is emptied and ``base`` moves up (the current states stay: the
poll retired every one that changed).  A poll that leaves a gap empties both.  Exact
revisions that are not (yet) known current, a commit's own states and states a poll
retired (conflict resolution asks for the revision a transaction read), are kept by
``(oid, tid)`` in a small first-in first-out store beside them, for ``get_revision``
and for a later ``get`` once a poll names them.

**The bound is the bound.**  ``bytes_used`` is what the cache takes in memory: the
states of probation and protected as their segments' logs count them (``ArenaSegment``:
each state's ``tid + state`` and a 12-byte header side by side in chunks, its
``LLBTree`` index entry counted at 48 bytes, the holes and chunk objects, and a reserve
of about a chunk and a half per segment), and the Python objects of the window and the
exact revisions as CPython allocates them: each ``bytes`` object (header included,
rounded up to pymalloc's 16-byte blocks), each key's ``int``, the hash tables of the
dicts (``sys.getsizeof``, read after every insertion, the only thing that resizes a
table, or after a commit's batch of them, so a table that doubles is seen before the
bound is next fitted), and the frequency sketch.  A current state costs its pickle and
68 bytes in a log (``ENTRY_BYTES`` and its tid), ~140 in the window's dict (a slot of
its table, one int, one bytes header).  Measured with ``scripts/cache_memory.py``
(200,000 objects of 128 bytes in an OOBTree): see the README's memory table.  Before
issue 24 an OrderedDict of ``(oid, tid)`` tuples, counted as ``len(state) + 64``, took
~310 bytes besides the pickle; then an OrderedDict by oid ~180, then plain dicts ~140
(32 MB kept 96,916 of those states; in logs, 123,173).

**Eviction: W-TinyLFU.**  Current states live in three first-in first-out segments:
the window is a ``Segment`` (a plain dict, which the collector never walks, that
hands out its oldest keys in batches: small, and its hits and insertions are the
cheapest, where a cold read's prefetched states wait for their loads), probation and
protected are ``ArenaSegment`` logs (most of the states).  A new state enters the
*window* (1% of the cache but at least 512 KB or a 16th, in caches of 4 MB and more),
first in, first out, with no admission (``_touch``); what leaves the window moves to
*probation* if it wins admission (below) or the cache has room, and goes otherwise; a
state asked for there moves to *protected* (80% of the bytes), whose oldest fall back
to probation unless asked for since they came in; probation's oldest state not asked
for is the eviction victim.  A hit moves nothing but marks the state (a byte per sketch
counter): a marked state of probation goes to protected when it
comes up for eviction, one of protected gets a second chance when it comes up for
demotion (CLOCK).  An LRU's moves at every hit kept resizing the segments' tables.
Before a newcomer from the window may push the victim out, a count-min sketch of recent accesses (2 rows
of 4-bit counters, halved every 10 x its width accesses, so it forgets; widened as the
states come, ``SKETCH_START``) compares them:
the newcomer enters only if it was asked for at least two more times than the victim
(with no margin, a loop's second pass pushes out, one by one, the states it is about
to ask for).

Compared on the same script (second pass over twice the cache, 32 MB): plain LRU (the
old policy) and segmented LRU alone both serve ~0% of a second pass, since in a loop
larger than the cache every state is evicted before it is asked again and never
reaches protected; with admission the states that filled the cache first stay, and the
second pass is served in proportion to what fits.  A hot working set survives a scan
for the same reason (a scanned state, asked once, does not out-count a hot one).  The
window is what makes admission and prefetch work together: without it a full cache
turned away what a prefetch had just brought (asked for zero times), the next load
missed it, and the prefetch bound fell to 0 (measured: one statement per object once
the cache was full); in the window a prefetched state waits for its load.
"""
from __future__ import annotations

import math
import sys
import threading
from typing import Iterable, Sequence

from .arena import CHUNK_OBJECT_BYTES, ENTRY_BYTES, LARGEST_OID, ArenaSegment, entry_cost
from .compression import LIBRARY_BYTES, StateCompressor
from .segment import BATCH, Segment

# Roughly what one entry of ``changed`` costs, to bound its length by the cache's bytes.
INDEX_ENTRY_BYTES = 100
# The share of the current states' bytes that the protected segment may hold.
PROTECTED_SHARE = 0.8
# Exact revisions (first in, first out) may hold this share of the cache.
REVISIONS_SHARE = 0.5
# New current states wait in a window of this share of the cache before admission,
WINDOW_SHARE = 0.01
# ... in a cache of at least this size.  In a smaller one the sketch is too small to
# tell a hot state from a scan's once its hits in the window have not marked it (a
# 256 KB cache with a window kept none of 20 hot states through a scan, all without).
WINDOW_FROM = 1 << 20
# ... and at least this many bytes (up to a 16th of the cache): a prefetch batch of 1,000
# small states takes ~250 KB, and what a batch brings must wait in the window until the
# loads reach it.  At 1% a 10 MB cache's window held 100 KB: most of each batch was
# turned away before its load, and the first pass over 200,000 objects ran at 7,700
# objects/s (PostgreSQL) instead of 27,500.  A cache under 4 MB had no window at all
# once: everything a prefetch brought into a full cache lost admission before its load,
# and at 1 MB a walk of 200,000 objects ran at 1,300 objects/s, a statement an object
# (5,700 with the cache off); its batches are now sized to the window (``prefetch_batch``),
# and it has one from 1 MB (WINDOW_FROM).
WINDOW_FLOOR = 512 << 10
#: What is counted for memory outside the cache (``reserve``) at most, as a share of
#: the bound: at 1 MB the prefetch's and the compressor's (1.5 MB) would leave nothing.
RESERVE_SHARE = 0.5
#: The states a batch brings at least, however small the window, or without one (a
#: cache of a few KB, as the model test's, still prefetches).
SMALLEST_BATCH = 8
#: What one more current state may add at most besides its pickle, counted high as in
#: the window (its tid, the bytes header and block rounding, its oid's int, a share of a
#: table slot); in probation's or protected's log it takes less (``ENTRY_BYTES``).
ROOM_PER_STATE = 8 + 33 + 16 + 32 + 100
#: A segment's log is written in chunks of this share of the cache, within the bounds
#: below: a chunk is given back whole, and each segment may hold two it does not fill.
CHUNK_SHARE = 1 / 512
CHUNK_BYTES = (256, 64 << 10)
# A newcomer must have been asked for more than this many times above the victim.
ADMISSION_MARGIN = 1
#: The states of probation promoted in one step at most: a run is held outside both
#: segments while it moves (all of a 32 MB cache's took 32 MB more of peak RSS).
PROMOTION_RUN = 256
#: Raw states compressed at most to make room for one newcomer (``_squeeze``): a few
#: microseconds each, so a load never pays for a whole cache's.
SQUEEZE_RUN = 8
#: The last states a poll retired, kept for ``take_retired`` (their references): a
#: changed container's next miss brings the references its new revision added, not
#: all of them (a mapping of 34 containers of 17 KB, two of them new, brought
#: the 26 oldest within the bytes, none of which its reader read).
RETIRED_KEPT = 32
#: A retired state larger than this is not kept for its references, and those kept
#: take at most RETIRED_SHARE of the cache's bound (2 MB of the default 64 MB).
RETIRED_LARGEST = 256 << 10
RETIRED_SHARE = 1 / 32


def allocated(size: int) -> int:
    """What CPython's allocator hands out for an object of ``size`` bytes: pymalloc's
    16-byte blocks up to 512 bytes, the C allocator (16 bytes of header) above."""
    if size <= 512:
        return (size + 15) & ~15
    return (size + 16 + 15) & ~15


#: ``sys.getsizeof`` of a ``bytes`` of length n is n + this (its header and the NUL).
_BYTES_HEADER = sys.getsizeof(b"")


#: The segment that holds a current state (``StateCache._retire``).
_WINDOW, _PROBATION, _PROTECTED = 0, 1, 2

#: An excess no segment reaches: all of it goes.
ALL = 1 << 62


def state_cost(value: bytes) -> int:
    """``allocated(sys.getsizeof(value))``, the size taken from the length: every cache
    access counts a state or two, and ``sys.getsizeof`` tripled the cost.  (``allocated``
    written out: a batch of 1,000 entering counts each state twice.)"""
    size = len(value) + _BYTES_HEADER
    if size <= 512:
        return (size + 15) & ~15
    return (size + 31) & ~15


def state_costs(values: Iterable[bytes]) -> list[int]:
    """``state_cost`` of each of ``values``, in one comprehension (no call a state)."""
    return [(size + 15) & ~15 if size <= 512 else (size + 31) & ~15
            for size in [len(value) + _BYTES_HEADER for value in values]]


# What the int objects the cache holds take: an oid (below 2**60: 28 or 32 bytes, a
# 32-byte block), a tid and an ``oid << 64 | tid`` key (36 to 44 bytes, a 48-byte block).
_OID_BYTES = allocated(sys.getsizeof(1 << 59))
_TID_BYTES = allocated(sys.getsizeof(1 << 62))
_KEY_BYTES = allocated(sys.getsizeof(1 << 127))


def _revision_cost(value: bytes) -> int:
    """What an exact revision's entry costs: its state and its key."""
    return state_cost(value) + _KEY_BYTES


def _revision_costs(values: Iterable[bytes]) -> list[int]:
    """``_revision_cost`` of each of ``values``, in one comprehension."""
    return [cost + _KEY_BYTES for cost in state_costs(values)]


#: Counters a state cache's sketch starts with at most (two rows of 64 KB, a cache of
#: 8 MB's full width); a larger cache's grows to one per 128 bytes of its limit as its
#: states outnumber them.  Counts gathered in a narrower sketch are shared by more oids
#: (a 4,096-counter start let a prefetch into a full 4 MB cache win admission with the
#: counts of the hot states it had shared counters with): at this width a cache has as
#: many counters as states when it grows.
SKETCH_START = 65536


class FrequencySketch:
    """How often each oid was asked for recently: a count-min sketch of 4-bit counters
    (2 rows of bytes, conservative update), all halved every ``10 x width`` increments.

    Every cache access pays for ``add``, so it is written out for two rows: with four
    (and lists of slots) it took about half of a cache hit's time; two rows of a counter
    per entry each keep the false counts of a 4-bit sketch rare enough to rank a
    newcomer against a victim, which is all admission asks of it."""

    _FIRST = 0x9E3779B97F4A7C15
    _SECOND = 0xC2B2AE3D27D4EB4F
    _MASK = 0xFFFF_FFFF_FFFF_FFFF
    _HALF = bytes(i // 2 for i in range(256))

    def __init__(self, entries: int) -> None:
        self.bits = max(6, self._bits_for(entries))
        width = 1 << self.bits
        self._shift = 64 - self.bits
        self.rows = [bytearray(width), bytearray(width)]
        #: Hits on probation and protected: a byte per counter of the first row, set by
        #: a hit (``mark``), taken when the state comes up for eviction (probation: it is
        #: promoted) or demotion (protected: it is kept).
        self.marks = bytearray(width)
        self.samples = 0
        self.period = 10 * width

    @property
    def size_bytes(self) -> int:
        return sum(sys.getsizeof(row) for row in self.rows) + sys.getsizeof(self.marks)

    def mark(self, oid: int) -> None:
        self.marks[((oid * self._FIRST) & self._MASK) >> self._shift] = 1

    def take_mark(self, oid: int) -> bool:
        """Was ``oid`` (or an oid sharing its byte) marked since its mark was last taken?"""
        slot = ((oid * self._FIRST) & self._MASK) >> self._shift
        marked = self.marks[slot]
        self.marks[slot] = 0
        return bool(marked)

    def add(self, oid: int) -> None:
        self.add_many((oid,))

    def add_many(self, oids: Iterable[int]) -> None:
        """Count each of ``oids``, in their order (``add`` is this of one: 0.82 us a
        count, 0.79 when it was written out on its own; a batch of hits noted at once
        took a call a hit, a third of ``note_hits``).  Conservative update: only the
        smaller counter grows (both when equal), so an oid that shares a counter with a
        frequent one is not counted up with it."""
        first, second = self.rows
        one, two, mask, shift = self._FIRST, self._SECOND, self._MASK, self._shift
        added = 0
        for oid in oids:
            a = ((oid * one) & mask) >> shift
            b = ((oid * two) & mask) >> shift
            x = first[a]
            y = second[b]
            if x <= y:
                if x < 15:
                    first[a] = x + 1
                    if y == x:
                        second[b] = y + 1
            else:                   # y < x <= 15: never saturated here
                second[b] = y + 1
            added += 1
            if self.samples + added >= self.period:
                self.rows = [first.translate(self._HALF), second.translate(self._HALF)]
                first, second = self.rows
                self.samples = (self.samples + added) // 2
                added = 0
        self.samples += added

    def mark_many(self, oids: Iterable[int]) -> None:
        """``mark`` of each of ``oids``."""
        marks, one, mask, shift = self.marks, self._FIRST, self._MASK, self._shift
        for oid in oids:
            marks[((oid * one) & mask) >> shift] = 1

    @staticmethod
    def _bits_for(entries: int) -> int:
        """The bits of an index that gives each of ``entries`` a counter of its own."""
        return (max(entries, 1) - 1).bit_length()

    def growth_bytes(self, entries: int) -> int:
        """The bytes ``grow(entries)`` would add: its two rows and the marks widened."""
        bits = max(self.bits, self._bits_for(entries))
        return 3 * ((1 << bits) - (1 << self.bits))

    def grow(self, entries: int) -> None:
        """Widen the rows to a counter per entry for ``entries`` (never narrower), each
        counter's count going to the two that split it: an index is the top ``bits``
        of the hash, so one more bit sends old counter i to 2i and 2i + 1, and no
        count is lost or lowered."""
        bits = max(self.bits, self._bits_for(entries))
        while self.bits < bits:
            rows = []
            for row in (*self.rows, self.marks):
                wider = bytearray(2 * len(row))
                wider[0::2] = row
                wider[1::2] = row
                rows.append(wider)
            *self.rows, self.marks = rows
            self.bits += 1
        self._shift = 64 - self.bits
        self.period = 10 * (1 << self.bits)

    def count(self, oid: int) -> int:
        first, second = self.rows
        x = first[((oid * self._FIRST) & self._MASK) >> self._shift]
        y = second[((oid * self._SECOND) & self._MASK) >> self._shift]
        return x if x < y else y


class StateCache:
    def __init__(self, size_bytes: int, compress: str = "off") -> None:
        # (``compress`` defaults to off here, for the tests of the policy; the storage
        # passes its ``cache-compress``, auto by default.)
        self.limit = size_bytes
        #: Packs what enters probation (``compression.py``): from the start with
        #: ``zstd``, once the cache is full with ``auto``; None keeps states as they
        #: came, everywhere.
        self._packer = (StateCompressor(eager=compress == "zstd")
                        if compress != "off" and size_bytes > 0 else None)
        #: ``auto``: raw states are compressed to make room once the cache is full,
        #: until none is left at probation's old end (``_squeeze``).
        self._squeezing = self._packer is not None and compress == "auto"
        # Current states (as of ``polled``), oid -> tid (8 bytes, big-endian) + state.
        # A small cache reads fewer of its oldest keys at a time (see Segment).
        batch = max(8, min(BATCH, size_bytes // 8192))
        chunk = int(min(max(size_bytes * CHUNK_SHARE, CHUNK_BYTES[0]), CHUNK_BYTES[1]))
        self._window = Segment(batch)
        self._window_bytes = 0
        self._window_limit = (max(WINDOW_SHARE * size_bytes,
                                  min(WINDOW_FLOOR, size_bytes // 16))
                              if size_bytes >= WINDOW_FROM else 0)
        self._probation = ArenaSegment(chunk)
        self._protected = ArenaSegment(chunk)
        self._protected_bytes = 0
        # Exact revisions, (oid << 64 | tid) -> state, oldest first.
        self._revisions = Segment(batch)
        self._revision_bytes = 0
        self._current_bytes = 0          # the states in the window, probation and protected
        self._changed: dict[int, int] = {}
        # oid -> (its retired entry, packed or not), the newest last (``take_retired``).
        self._retired: dict[int, tuple[bytes, bool]] = {}
        self._retired_bytes = 0
        self._max_index = max(1000, size_bytes // (4 * INDEX_ENTRY_BYTES))
        # A counter per 128 bytes of limit, grown to it as the cache fills (``_shrink``):
        # a new sketch's pages cost the kernel a fault at their first write, and a full
        # one (1 MB at the default 64 MB) cost a fresh process ~5 ms of its first 1,000
        # loads (256 faults of ~20 us on this machine's VM), where 32 pages serve the
        # first 65,536 states.
        self._sketch_entries = size_bytes // 128
        self._sketch = FrequencySketch(min(self._sketch_entries, SKETCH_START))
        self._fixed_bytes = self._sketch.size_bytes + self._batches_bytes()
        #: Memory the process spends for this cache outside it (the compressor's
        #: library and contexts, and what ``reserve`` is told), in ``_fixed_bytes`` too.
        self._reserved = 0
        self._compressor_bytes = LIBRARY_BYTES if self._packer is not None else 0
        self._count_outside(0)
        self._protected_share = PROTECTED_SHARE
        self._admission = True
        self.base = -1          # no instance has polled yet
        self.polled = -1
        # The newest deletion record the polls brought (backends/base/poller.py): every object
        # deleted up to it that was kept here is gone from here too.
        self.gone_seen = -1
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        #: Moves at every ``clear``: what was read before it is not put back after.
        self.epoch = 0

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    @property
    def index_limit(self) -> int:
        """The changes the index names at most (:meth:`cover` takes no more)."""
        return self._max_index

    def prefetch_batch(self, count: int, size: int) -> tuple[int, int]:
        """The states (``count``) and bytes (``size``) one prefetch may bring, lowered
        to what waits in the window for its loads: a state that overflows the window of
        a full cache meets admission, which a state never asked for loses.  (A disabled
        cache leaves them: the Redis level may still take what a prefetch brings.)"""
        if not self.enabled:
            return count, size
        room = int(self._window_limit)
        fitting = max(room // ROOM_PER_STATE, SMALLEST_BATCH)
        return min(count, fitting), min(size, max(room, SMALLEST_BATCH * ROOM_PER_STATE))

    def reserve(self, nbytes: int) -> None:
        """Count ``nbytes`` against the bound: memory spent for this cache outside it
        (``prefetch.working_bytes``: a prefetch's batch on its way in, what an
        instance holds of it; then the prefetcher's queue as it grows), so that the
        process spends what ``cache-size-mb`` says.  Each call replaces the last; what
        it adds is made room for at once.  A disabled cache reserves nothing."""
        with self._lock:
            if self.enabled:
                self._count_outside(nbytes)
                self._shrink(None)

    def _count_outside(self, reserved: int) -> None:
        """``reserved`` and the compressor's memory, counted as fixed: at most half the
        bound (``RESERVE_SHARE``), and nothing in a cache under ``WINDOW_FROM``
        (1 MB), whose prefetch brings 8 states (its 20 KB and the compressor's would
        take more than a cache of a few KB, as the model test's)."""
        share = RESERVE_SHARE if self.limit >= WINDOW_FROM else 0
        nbytes = min(reserved + self._compressor_bytes, int(self.limit * share))
        self._fixed_bytes += nbytes - self._reserved
        self._reserved = nbytes

    def _policy_for_comparison(self, name: str) -> None:
        """For ``scripts/cache_memory.py`` only: ``off`` drops the admission filter
        (segmented LRU alone), ``lru`` also the protected segment (one plain LRU)."""
        self._admission = False
        self._window_limit = 0
        if name == "lru":
            self._protected_share = 0.0

    # -- polls ---------------------------------------------------------------------------------------
    def position(self) -> tuple[int | None, int | None]:
        """Where the polls have brought the cache: the newest tid polled and the newest
        deletion record (None, None before the first poll)."""
        with self._lock:
            if self.polled < 0:
                return None, None
            return self.polled, (self.gone_seen if self.gone_seen >= 0 else None)

    def after_poll(self, since: int, upto: int, changes: list[tuple[int, int]],
                   gone: Sequence[int] = (), gone_seq: int = -1, gone_floor: int = 0,
                   complete: bool = True, truncated: bool = False,
                   keep_revisions: bool = True) -> None:
        """Record a poll that saw ``changes`` (oid, tid) in ``(since, upto]``, and the
        objects ``gone`` (deleted, so no poll names them as changed) up to deletion record
        ``gone_seq``; the records up to ``gone_floor`` were pruned (``complete`` False: a
        poll without a record number found some it needed pruned).  ``truncated``: more
        changed than the poll could list (``changes`` empty).  ``keep_revisions``: the
        current states the poll retires stay as exact revisions; False when no snapshot
        before ``upto`` will read them (a reader alone in its process: 1,000 changed
        states it held took 4-5 ms of its next start to keep)."""
        if not self.enabled:
            return
        with self._lock:
            lost = self.gone_seen < gone_floor if self.gone_seen >= 0 else not complete
            # A truncated poll that ends where the index already reaches (an instance
            # that polls after another instance saw the same commits, and started
            # afresh) leaves the index as it is.
            lost = lost or (truncated and upto > self.polled)
            if self.polled < 0 or since > self.polled or lost:
                # First poll, a gap this poll doesn't cover, deletions it could not list
                # any more, or changes it did not list: start the index afresh.
                self._changed.clear()
                self._drop_current()
                self.base = self.polled = max(upto, self.polled)
                self.gone_seen = max(gone_seq, self.gone_seen)
                return
            if gone:
                self._forget_gone(gone, max(upto, self.polled), keep_revisions)
            self.gone_seen = max(gone_seq, self.gone_seen)
            if upto <= self.polled:
                return
            polled = self.polled
            # From this index's own poll on (as a rule) every change is newer than it.
            fresh = (dict(changes) if since == polled else
                     {oid: tid for oid, tid in changes if tid > polled})
            self._changed.update(fresh)
            self._retire_held(fresh, keep_revisions, remember=True)
            self.polled = upto
            if len(self._changed) > self._max_index:
                self._changed.clear()
                self.base = upto
            self._shrink(None)      # the index counts: a poll that grew it makes room

    def _forget_gone(self, oids: Sequence[int], polled: int,
                     keep_revisions: bool = True) -> None:
        """Deleted objects: their current states go (as exact revisions), and the index
        names them as changed at ``polled`` (no revision has that tid: whatever asks
        for them from there on goes to the database, the Redis level included)."""
        self._retire_held(dict.fromkeys(oids, polled), keep_revisions)
        changed = self._changed
        for oid in oids:
            if changed.get(oid, -1) < polled:
                changed[oid] = polled
        if len(changed) > self._max_index:
            changed.clear()
            self.base = polled

    def _retire_held(self, oids: dict[int, int], keep_revisions: bool = True,
                     remember: bool = False) -> None:
        """``_retire`` each of ``oids`` (in their order) that the cache holds as current.
        Most oids a poll names are not held here (another process's new objects, or
        states this one never read): the segments' indexes are asked first, a C call
        each, rather than ``_retire`` (a poll of 1,000 changes: 1.1 ms of ``_retire``
        calls that found nothing).  Oids above the largest in probation and protected
        are not asked of their indexes (a tree's lookup each): objects another process
        created after everything this one read, most of a large poll (12,000 changes:
        4.3 to 5.2 ms of lookups).  Each test is a ``filter``, its loop in C.
        ``remember``: the last ``RETIRED_KEPT`` are kept for ``take_retired``."""
        probation, protected = self._probation, self._protected
        window = self._window.entries
        below = max(probation.largest(), protected.largest()).__ge__
        maybe = list(filter(below, oids))
        in_window = set(filter(window.__contains__, oids))
        in_probation = set(filter(probation.holds, maybe))
        held = in_window | in_probation | set(filter(protected.holds, maybe))
        if held:
            order = [oid for oid in oids if oid in held]      # in the poll's order
            kept_from = len(order) - RETIRED_KEPT if remember else len(order)
            for number, oid in enumerate(order):
                # Where each is was found above: ``_retire`` asks no segment that
                # does not hold it (two tree lookups an oid: 1.5 ms of a poll of 1,000).
                self._retire(oid, keep_revisions, _WINDOW if oid in in_window
                             else _PROBATION if oid in in_probation else _PROTECTED,
                             remember=number >= kept_from)

    def _retire(self, oid: int, keep_revision: bool = True, where: int | None = None, *,
                remember: bool) -> None:
        """A poll saw ``oid`` change: its current state is now only an exact revision
        (or gone, without ``keep_revision``).  ``where``: the segment known to hold it;
        ``remember``: kept for ``take_retired`` too."""
        if where is None:
            where = (_PROBATION if self._probation.holds(oid) else
                     _PROTECTED if self._protected.holds(oid) else
                     _WINDOW if oid in self._window.entries else None)
        if where == _WINDOW:
            value = self._window.entries.pop(oid)
            cost = state_cost(value)
            self._window_bytes -= cost
            self._current_bytes -= cost
        elif where is not None:
            segment = self._probation if where == _PROBATION else self._protected
            value = segment.pop(oid)
            cost = entry_cost(value)
            if where == _PROTECTED:
                self._protected_bytes -= cost
            self._current_bytes -= cost
        else:
            return
        if remember and len(value) <= min(RETIRED_LARGEST, self.limit * RETIRED_SHARE):
            self._remember_retired(oid, value, where != _WINDOW and self._packer is not None)
        if not keep_revision:
            return
        packer = self._packer
        state = (packer.unpack(value[8:]) if where != _WINDOW and packer is not None
                 else value[8:])
        self._put_revision(oid, int.from_bytes(value[:8], "big"), state)

    def _remember_retired(self, oid: int, value: bytes, packed: bool) -> None:
        retired = self._retired
        earlier = retired.pop(oid, None)
        if earlier is not None:
            self._retired_bytes -= len(earlier[0])
        retired[oid] = (value, packed)
        self._retired_bytes += len(value)
        while (len(retired) > RETIRED_KEPT
               or self._retired_bytes > self.limit * RETIRED_SHARE):
            oldest = next(iter(retired))
            self._retired_bytes -= len(retired.pop(oldest)[0])

    def take_retired(self, oid: int) -> bytes | None:
        """The state of ``oid`` a recent poll retired (it changed while held here), once:
        None if none is kept.  What it referred to tells a miss of the new revision
        which references are new (``storage._load_changed``)."""
        with self._lock:
            found = self._retired.pop(oid, None)
            if found is None:
                return None
            value, packed = found
            self._retired_bytes -= len(value)
            if packed:
                assert self._packer is not None
                return self._packer.unpack(value[8:])
            return value[8:]

    def _drop_current(self) -> None:
        self._retired.clear()
        self._retired_bytes = 0
        self._window.clear()
        self._probation.clear()
        self._protected.clear()
        self._current_bytes = self._protected_bytes = self._window_bytes = 0

    # -- restoring (the persistent and shared caches) ------------------------------------------
    def cover(self, since: int, upto: int, changes: list[tuple[int, int]],
              gone: Sequence[int] = (), gone_seq: int = -1, complete: bool = True) -> bool:
        """Take a poll over ``(since, upto]`` that may reach back before ``base``: the
        index then covers ``(min(base, since), max(polled, upto)]``, so states known
        current at a tid from ``since`` on can be checked against it.  The objects
        ``gone`` (deleted since, up to record ``gone_seq``) count as changed at ``upto``.
        False (and nothing changed) when it can't: too many changes, deletions the poll
        could no longer list (``complete``), or a gap between the two ranges (``since``
        after ``polled``, or ``upto`` before ``base``: a poll that started before an
        instance's first one ended after it)."""
        if not self.enabled or not complete:
            return False
        with self._lock:
            if self.polled >= 0 and (since > self.polled or upto < self.base):
                return False
            if len(self._changed) + len(changes) + len(gone) > self._max_index:
                return False
            if self.polled < 0:
                self._changed.clear()
                self._drop_current()
                self.base = self.polled = since
            self._forget_gone(gone, upto)   # (within the bound: counted above)
            self.gone_seen = max(self.gone_seen, gone_seq)
            for oid, tid in changes:
                # A poll names each oid with its newest tid; the index keeps the newest.
                if tid > self._changed.get(oid, -1):
                    self._changed[oid] = tid
                if tid > self.polled:
                    self._retire(oid, remember=True)
            self.base = min(self.base, since)
            self.polled = max(self.polled, upto)
            self._shrink(None)      # retired states became revisions, which cost more
            return True

    def adopt(self, entries: list[tuple[int, int, bytes]], as_of: int) -> tuple[int, bool]:
        """Take states known current at ``as_of``, ``(oid, tid, tid + state)`` (the
        value as the cache keeps it), hottest first, as current ones where
        the index shows them unchanged since; they go to probation's old end, behind what
        this process loaded itself.  How many were taken, and False once no more can be:
        the index no longer reaches back to ``as_of``, or the cache is full."""
        if not self.enabled:
            return 0, False
        with self._lock:
            if not self.base <= as_of <= self.polled:
                return 0, False
            adopted: list[tuple[int, bytes]] = []
            full = False
            for oid, tid, value in entries:
                changed = self._changed.get(oid)
                if (tid > as_of or (changed is not None and changed != tid)
                        or oid > LARGEST_OID or self._holds(oid)):
                    continue
                if self._packer is not None:
                    value = self._packer.pack(value)
                cost = entry_cost(value)
                self._probation.push(oid, value)
                self._current_bytes += cost
                # Counted whole after each (a few lookups): the tables grow too, ~100
                # bytes a state, and counting them only at the end made the shrink
                # below give back half of what a small-state restore had taken.
                if self._bytes() > self.limit:
                    del self._probation[oid]
                    self._current_bytes -= cost
                    full = True
                    break
                adopted.append((oid, value))
            # Taken at the new end (so the tables counted above are the ones kept),
            # then moved behind what this process loaded itself.
            for oid, _ in adopted:
                del self._probation[oid]
            self._probation.push_behind(adopted)
            self._shrink(None)
            taken = len(adopted)
            return taken, not full

    def shared_key(self, oid: int, snapshot: int, checkpoint: int) -> int | None:
        """The tid ``at`` under which a shared cache keeps the state of ``oid`` current at
        ``snapshot`` (see ``secondlevel``): the oid's newest change when it is after
        ``checkpoint`` and not after ``snapshot``, else ``checkpoint`` when the index
        reaches back to it; None when the index can't tell."""
        if not self.enabled or checkpoint < 0:
            return None
        with self._lock:
            if not self.base <= checkpoint <= snapshot <= self.polled:
                return None
            changed = self._changed.get(oid)
            if changed is None or changed <= checkpoint:
                return checkpoint
            return changed if changed <= snapshot else None

    def current_states(self) -> tuple[int, list[tuple[int, bytes]]]:
        """``polled`` and the states current there, ``(oid, tid + state)``, hottest
        first (protected's newest to probation's oldest)."""
        with self._lock:
            if not self.enabled or self.polled < 0:
                return -1, []
            packer = self._packer
            if packer is None:
                return self.polled, [*reversed(self._protected.items()),
                                     *reversed(self._window.entries.items()),
                                     *reversed(self._probation.items())]
            unpack = packer.unpack_value
            return self.polled, [
                *((oid, unpack(value)) for oid, value in reversed(self._protected.items())),
                *reversed(self._window.entries.items()),
                *((oid, unpack(value)) for oid, value in reversed(self._probation.items()))]

    # -- reading -------------------------------------------------------------------------------------
    def get(self, oid: int, snapshot: int) -> tuple[bytes, int] | None:
        """The state current at ``snapshot`` and its tid, if the cache knows it."""
        if self.limit <= 0:
            return None
        with self._lock:
            self._sketch.add(oid)
            found = self._find_current(oid, snapshot)
            if found is None:
                self.misses += 1
            else:
                self.hits += 1
            return found

    def note_hits(self, rows: list[tuple[int, int, bytes]], snapshot: int,
                  epoch: int) -> None:
        """Count as ``get``'s hits the loads a storage instance served, at ``snapshot``,
        from a batch it held itself (``brought.Brought``), ``(oid, tid, state)`` each:
        the sketch counts them, and a state kept in probation or protected is marked
        (or, as one plain LRU, moved) as a hit there would be.  One the cache no longer
        holds (evicted or turned away since the batch came) enters as a load's state
        does (``put_loaded``): a hit here was a miss and a load before, and the next
        miss finds its parent among the cached states.  If the cache was cleared since
        the batch came (``epoch``, as it was then), the hits are counted and nothing
        else: a reset forgets what was read before it."""
        if self.limit <= 0 or not rows:
            return
        with self._lock:
            if epoch != self.epoch:
                self.hits += len(rows)
                return
            sketch = self._sketch
            add, mark = sketch.add, sketch.mark
            probation, protected, window = self._probation, self._protected, self._window
            lru = self._protected_share <= 0
            if not lru:
                # Most often every one is still held (the batch entered a moment ago):
                # counted and marked in bulk, as the loop below would.
                oids = [row[0] for row in rows]
                held = self._held_past_window(oids)
                if held.union(filter(window.entries.__contains__, oids)).issuperset(oids):
                    sketch.add_many(oids)
                    sketch.mark_many(held)
                    self.hits += len(rows)
                    return
            for oid, tid, state in rows:
                add(oid)
                if lru and probation.holds(oid):
                    probation.touch(oid)
                    self._shrink(None)
                elif not lru and (protected.holds(oid) or probation.holds(oid)):
                    mark(oid)
                elif oid not in window.entries:
                    self._put_loaded(oid, tid, state, snapshot)
            self.hits += len(rows)

    def _find_current(self, oid: int, snapshot: int) -> tuple[bytes, int] | None:
        if snapshot < self.base:
            return None
        changed = self._changed.get(oid)
        if changed is not None and changed > snapshot:
            return None
        found = self._touch(oid)
        if found is not None:
            if changed is None or found[1] == changed:
                return found
            return None
        if changed is None:
            return None
        state = self._revisions.entries.pop(oid << 64 | changed, None)
        if state is None:
            return None
        # Named by a poll: the revision is current now.
        self._revision_bytes -= _revision_cost(state)
        self._insert(oid, changed.to_bytes(8, "big") + state)
        return state, changed

    def _touch(self, oid: int) -> tuple[bytes, int] | None:
        """The current state of ``oid`` and its tid, moved up as the policy says (a hit).  A move
        takes a slot of the entry table it moves to, and a dict out of free slots
        resizes, maybe larger: then the bound is checked again.

        A hit on protected or probation moves nothing: it marks the state.  A marked
        state in protected gets a second chance (to protected's newest end) instead of
        demotion (CLOCK); one in probation moves to protected when it comes up for
        eviction (``_oldest_unmarked``), not at the hit.  Moving it on every hit, as an
        LRU does, filled the entry table with the slots hits left behind, and the dict
        resized to three slots per live entry: repeated hits on states that filled a
        64 MB cache took its tables from 10 to 20 MB, and 205,000 states down to
        166,000.  And a pass that hit every state of a cache with room moved each from
        probation's table to protected's, which grew by doubling while the other
        emptied: 12 MB of peak RSS for 213,000 states, for an order nothing needed.

        A hit in the window neither moves nor marks: the window is first in, first out.
        What leaves it meets admission by the sketch's count, which the hit raised, so
        its order decides nothing a hit should change; and the batch a prefetch brought
        waits there for its loads, which as an LRU moved each state it served behind
        those not served yet, so that these left first, and paid a pop and an insertion
        a hit (2.5 us against 1.4 for a hit in probation: a millisecond of a cold read
        of 1,000 objects)."""
        found = self._protected.get_stamped(oid)
        if found is None:
            value = self._window.entries.get(oid)
            if value is not None:
                return value[8:], int.from_bytes(value[:8], "big")
            if self._protected_share <= 0:
                # One plain LRU (``_policy_for_comparison("lru")``): the hit moves.
                if not self._probation.holds(oid):
                    return None
                self._probation.touch(oid)
                self._shrink(None)              # its old place may be a hole now
                return self._unpacked(self._probation.get_stamped(oid))
            found = self._probation.get_stamped(oid)
            if found is None:
                return None                         # a miss: nothing moved
        self._sketch.mark(oid)
        return self._unpacked(found)

    def _unpacked(self, found: tuple[bytes, int] | None) -> tuple[bytes, int] | None:
        """A main segment's ``get_stamped`` answer with its state as it came."""
        packer = self._packer
        if packer is None or found is None:
            return found
        return packer.unpack(found[0]), found[1]

    def _tables(self) -> int:
        return (self._protected.table_bytes + self._probation.table_bytes
                + self._window.table_bytes)

    def _oldest_unmarked(self, newcomer: int | None) -> int | None:
        """Probation's oldest state that was not asked for since it came in (or the
        newcomer, or None); the marked ones before it go to protected, their marks
        taken (lazy promotion), each run of them in one step (``_promote``).  Ends:
        each promotion takes a mark, and none is set until the caller is done."""
        probation = self._probation
        take_mark = self._sketch.take_mark
        while True:
            run: dict[int, bytes] = {}
            while len(run) < PROMOTION_RUN:
                oid = probation.oldest()
                if (oid is None or oid == newcomer or self._protected_share <= 0
                        or not take_mark(oid)):
                    break
                run[oid] = probation.pop_oldest()[1]
            if not run:
                return oid
            # Demotions may refill a probation the run emptied: look again.
            self._promote(run)

    def _promote(self, run: dict[int, bytes]) -> None:
        """States taken from probation's oldest end, asked for since they came in (oid
        -> value, oldest first): to protected, whose oldest fall back to probation
        beyond its share, unless asked for since (CLOCK).  A second pass that hit all
        of a full cache's probation promotes all of it at its first miss (123,000
        states at 32 MB); a run shares one pass of the demotions."""
        # Promotions may empty probation: its table, sized for all of its states, would
        # stay beside protected's growing one.
        self._probation.trim()
        protected = self._protected
        protected.push_many(run)
        self._protected_bytes += sum(map(entry_cost, run.values()))
        cap = self._protected_share * (self.limit - self._revision_bytes)
        take_mark = self._sketch.take_mark
        while self._protected_bytes > cap and len(protected) > 1:
            old, demoted = protected.pop_oldest()
            if old not in run and take_mark(old):
                # Asked for since it came in (or since its last second chance): kept.
                # Ends: each turn takes a mark, and none is set until the loop is over.
                protected.push(old, demoted)
                continue
            self._protected_bytes -= entry_cost(demoted)
            self._probation.push(old, demoted)

    def has(self, oid: int, snapshot: int) -> bool:
        """Would ``get`` answer?  (Without counting a hit or a miss, or moving the entry.)"""
        if not self.enabled:
            return False
        with self._lock:
            return snapshot >= self.base and self._visible(oid, snapshot) is not None

    def missing(self, oids: Iterable[int], snapshot: int) -> list[int]:
        """Those of ``oids`` that ``has`` would say no to, in their order, under one
        hold of the lock: the segments asked which they hold in C (``_held_of``), an
        oid they do not hold answered by the poll's index and the exact revisions.
        A load of a container another process changed asked ``has`` of each of its
        1,000 children, a hold of the lock and three segments each."""
        oids = list(oids)
        if not self.enabled or not oids:
            return oids
        with self._lock:
            if snapshot < self.base:
                return oids
            held = self._held_of(oids)
            revisions = self._revisions.entries
            changed_at = self._changed.get
            found: list[int] = []
            for oid in oids:
                if oid in held:
                    # Held as current: ``_visible`` is True or None (as in ``peek_many``).
                    if self._visible(oid, snapshot) is None:
                        found.append(oid)
                    continue
                # Not held as current: an exact revision the snapshot sees, or nothing.
                changed = changed_at(oid) if revisions else None
                if (changed is None or changed > snapshot
                        or (oid << 64 | changed) not in revisions):
                    found.append(oid)
            return found

    def peek_many(self, oids: Iterable[int], snapshot: int) -> list[bytes | None]:
        """The state ``get`` would answer for each of ``oids``, under one hold of the
        lock, without counting a hit or a miss, marking or moving an entry (a prefetch
        looking through cached states for what is not)."""
        if not self.enabled:
            return [None for _ in oids]
        with self._lock:
            if snapshot < self.base:
                return [None for _ in oids]
            found: list[bytes | None] = []
            oids = list(oids)
            # Most oids a prefetch looks through are not cached (a new container's
            # children): the segments are asked which they hold in C, where
            # ``_visible`` asked three a state in Python; one they do not hold is an
            # exact revision or nothing (1,000 children: 2.0 -> 0.3 ms).
            held = self._held_of(oids)
            revisions = self._revisions.entries
            changed_at = self._changed.get
            for oid in oids:
                if oid not in held:
                    changed = changed_at(oid) if revisions else None
                    found.append(revisions.get(oid << 64 | changed)
                                 if changed is not None and changed <= snapshot else None)
                    continue
                # Held as current: ``_visible`` is True (the snapshot sees it) or None
                # (a newer revision was polled); False is for states not held.
                found.append(self._stamped(oid)[0]  # type: ignore[index]
                             if self._visible(oid, snapshot) else None)
            return found

    def _visible(self, oid: int, snapshot: int) -> bool | None:
        """Does the cache hold a state of ``oid`` as of ``snapshot`` (at or after
        ``base``)?  True for a current state, False for an exact revision, None for
        neither.  Nothing is copied when the poll named nothing (``has`` asks it of
        every queued oid at a miss)."""
        changed = self._changed.get(oid)
        if changed is not None and changed > snapshot:
            return None
        if changed is None:
            return True if self._holds(oid) else None
        held = self._kept_tid(oid)
        if held is not None:
            return True if held == changed else None
        return False if (oid << 64 | changed) in self._revisions.entries else None

    def get_revision(self, oid: int, tid: int) -> bytes | None:
        """The state ``oid`` had at ``tid`` exactly, if cached (revisions never change)."""
        if not self.enabled:
            return None
        with self._lock:
            state = self._revisions.entries.get(oid << 64 | tid)
            if state is not None:
                return state
            held = self._stamped(oid)
            if held is not None and held[1] == tid:
                return held[0]
            return None

    # -- remembering ---------------------------------------------------------------------------------
    def put_loaded(self, oid: int, tid: int, state: bytes, snapshot: int) -> None:
        """Remember a state the database returned as current at ``snapshot``: as
        ``put_loaded_many`` does a row, without its batch's set-up (measuring the room
        a batch needs, its lists and dicts), which cost a load without prefetch 10 us
        of the 12 its state took to enter (5.5 without it)."""
        if not self.enabled:
            return
        with self._lock:
            self._put_loaded(oid, tid, state, snapshot)

    def _put_loaded(self, oid: int, tid: int, state: bytes, snapshot: int) -> None:
        if not self.base <= snapshot == self.polled:
            return                          # as ``put_loaded_many`` says
        changed = self._changed.get(oid)
        if changed is not None and changed != tid:
            return
        if len(state) > self.limit // 4 or self._holds(oid):
            return
        self._insert(oid, tid.to_bytes(8, "big") + state)

    def put_loaded_many(self, rows: Iterable[tuple[int, int, bytes]], snapshot: int) -> None:
        """Remember states ``(oid, tid, state)`` the database returned as current at
        ``snapshot`` (a prefetch's), under one hold of the lock, the bound fitted as
        the window overflows and once at the end."""
        if not self.enabled:
            return
        with self._lock:
            if not self.base <= snapshot == self.polled:
                # Current as of ``polled`` only if read there: at an older snapshot, a
                # newer revision a pack deleted before any poll saw it would be missed.
                return
            self._probation.trim()
            self._protected.trim()
            rows = list(rows)
            changed_at = self._changed.get
            largest = self.limit // 4
            entering: dict[int, bytes] = {}
            held = self._held_of([row[0] for row in rows])
            for oid, tid, state in rows:
                changed = changed_at(oid)
                if changed is not None and changed != tid:
                    continue            # an older revision, read by an older snapshot
                if (len(state) > largest or oid > LARGEST_OID or oid in entering
                        or oid in held):
                    continue
                entering[oid] = tid.to_bytes(8, "big") + state
            fits = self._fits_without_eviction(rows)
            if not fits and self._squeezing and entering:
                # Room made for the whole batch at once, so that it still enters in
                # one step: one newcomer at a time (``_enter_each``) took twice as long.
                self._squeeze(self._bytes() + self._room_for(rows) - self.limit,
                              4 * len(entering))
                fits = self._fits_without_eviction(rows)
            if fits:
                self._enter_all(entering)       # nothing is evicted on the way
            else:
                self._enter_each(entering.items())
            self._shrink(None)

    def _fits_without_eviction(self, rows: list[tuple[int, int, bytes]]) -> bool:
        """Would ``rows`` all fit, whatever the tables and the sketch grow to?  Then
        none of them meets admission or evicts anything (``_enter_each``): a filling cache
        spent half of each insertion measuring itself for a test that could not fail."""
        return self._bytes() + self._room_for(rows) <= self.limit

    def _room_for(self, rows: list[tuple[int, int, bytes]]) -> int:
        """The bytes ``rows`` could take at most (``_fits_without_eviction``).
        Counted high: each state with its tid and its entry (``ROOM_PER_STATE``); the
        window's table doubled; the chunks probation's log may open on the way, one
        for each chunk's worth written (what the window holds may move there too) and
        two more; what the sketch grows by when the states pass its width (to twice
        their number, rounded up to a power of two: past 65,536 states it quadruples,
        590 KB)."""
        if not rows:
            return 0
        count = len(rows)
        entries = len(self._probation) + len(self._protected) + len(self._window) + count
        written = sum(len(state) for _, _, state in rows) + count * ROOM_PER_STATE
        opened = (written + self._window_bytes) // self._probation.chunk_size + 2
        return (written + 2 * self._window.table_bytes + opened * CHUNK_OBJECT_BYTES
                + self._sketch.growth_bytes(self._sketch_wanted(entries)))

    def put_revision(self, oid: int, tid: int, state: bytes) -> None:
        """Remember an exact revision (a commit's own states)."""
        self.put_revisions(tid, [(oid, state)])

    def put_revisions(self, tid: int, states: Iterable[tuple[int, bytes | None]]) -> None:
        """Remember the states a commit wrote at ``tid`` (a deletion, None, is skipped),
        under one hold of the lock, fitting the bound once at the end."""
        if not self.enabled:
            return
        with self._lock:
            if tid > self.polled:
                self._put_new_revisions(tid, states)
                return
            for oid, state in states:
                if state is None:
                    continue
                if (self._changed.get(oid) == tid and not self._holds(oid)
                        and len(state) <= self.limit // 4):
                    self._insert(oid, tid.to_bytes(8, "big") + state)   # a poll named it
                else:
                    self._put_revision(oid, tid, state)
            self._shrink(None)

    def _put_new_revisions(self, tid: int, states: Iterable[tuple[int, bytes | None]]) -> None:
        """``put_revisions`` of a ``tid`` no poll has seen yet (the usual case: the
        commit just ended), its bookkeeping done once for the batch.

        No state is current at ``tid`` yet (a current state is one read or named at a
        tid up to ``polled``), so each goes to the exact revisions, counted as
        ``_put_revision`` counts it.  They are first in, first out within their share,
        so what stays is what the same states put one by one would leave: the newest
        that fit in the share, with the older revisions only if every one of the batch
        fits beside them.  Only those are inserted, in one ``Segment.push_many`` that
        measures the table once (inserting the whole batch first would grow the table
        for states evicted at once, and a dict keeps its table).
        """
        revisions = self._revisions
        held = revisions.entries
        largest = self.limit // 4
        # In comprehensions, not a step per state in Python: 1,000 states 0.63-1.07 ms
        # so, 0.52-0.58 now (tenth percentiles of 400 commits, docs/measurements.md).
        listed = [(oid << 64 | tid, state) for oid, state in states
                  if state is not None and len(state) <= largest]
        batch = dict(listed)
        if len(batch) < len(listed):        # an oid named twice keeps its first state
            batch = {}
            for key, state in listed:
                batch.setdefault(key, state)
        if not held.keys().isdisjoint(batch):
            batch = {key: state for key, state in batch.items() if key not in held}
        costs = _revision_costs(batch.values())
        share = REVISIONS_SHARE * self.limit
        first, kept = 0, sum(costs)
        if kept > share:            # only the newest that fit stay
            first, kept = len(costs), 0
            while first and kept + costs[first - 1] <= share:
                first -= 1
                kept += costs[first]
        if first:
            while revisions:            # an older one can't stay once a newer one went
                self._pop_revision()
        excess = math.ceil(self._revision_bytes + kept - share)
        if excess > 0 and revisions:
            self._revision_bytes -= revisions.pop_oldest_until(excess, _revision_cost)
        if kept:
            revisions.push_many(dict(list(batch.items())[first:]) if first else batch)
            self._revision_bytes += kept
        self._shrink(None)

    def _put_revision(self, oid: int, tid: int, state: bytes) -> None:
        """Keep an exact revision within the revisions' share; the caller fits the
        whole cache to its bound afterwards (``_shrink``)."""
        key = oid << 64 | tid
        if key in self._revisions or len(state) > self.limit // 4:
            return
        if self._kept_tid(oid) == tid:
            return                      # kept already, as the current state
        self._revisions.push(key, state)
        self._revision_bytes += _revision_cost(state)
        share = REVISIONS_SHARE * self.limit
        while self._revision_bytes > share and self._revisions:
            self._pop_revision()

    def _pop_revision(self) -> int:
        """Drop the oldest exact revision; the bytes that frees."""
        freed = _revision_cost(self._revisions.pop_oldest()[1])
        self._revision_bytes -= freed
        return freed

    def _stamped(self, oid: int) -> tuple[bytes, int] | None:
        """The state of ``oid`` and its tid if it is kept as current, wherever it is."""
        found = self._protected.get_stamped(oid)
        if found is None:
            value = self._window.entries.get(oid)
            if value is not None:
                return value[8:], int.from_bytes(value[:8], "big")
            found = self._probation.get_stamped(oid)
        return self._unpacked(found)

    def _kept_tid(self, oid: int) -> int | None:
        """The tid of the state of ``oid`` kept as current, if one is (its state not
        unpacked)."""
        found = self._protected.get_stamped(oid)
        if found is None:
            value = self._window.entries.get(oid)
            if value is not None:
                return int.from_bytes(value[:8], "big")
            found = self._probation.get_stamped(oid)
        return None if found is None else found[1]

    def holds(self, oid: int) -> bool:
        """Is a state of ``oid`` kept as current?  (Unlocked: an answer for a hint,
        such as whether a load of it will be a hit.)"""
        return self.enabled and self._holds(oid)

    def _held_of(self, oids: list[int]) -> set[int]:
        """Those of ``oids`` kept as current (``_holds`` of each), the segments asked in
        C: a batch's loop asked three of them a state in Python."""
        return self._held_past_window(oids) | set(
            filter(self._window.entries.__contains__, oids))

    def _held_past_window(self, oids: list[int]) -> set[int]:
        """Those of ``oids`` kept in probation or protected (``_held_of`` without the
        window): the states a hit marks."""
        return (set(filter(self._probation.holds, oids))
                | set(filter(self._protected.holds, oids)))

    def _holds(self, oid: int) -> bool:
        """Is a state of ``oid`` kept as current?"""
        return (self._protected.holds(oid) or oid in self._window.entries
                or self._probation.holds(oid))

    def _insert(self, oid: int, value: bytes) -> None:
        """A new current state enters the window (see ``_enter_each``), the bound fitted."""
        if oid > LARGEST_OID:
            return
        self._probation.trim()
        self._protected.trim()
        self._enter_each(((oid, value),))
        self._shrink(None)

    def _enter_each(self, entering: Iterable[tuple[int, bytes]]) -> None:
        """Each of ``entering`` (oid, tid + state; none cached) enters the window in
        turn; what the window no longer holds moves on to probation, where it must win
        admission once the cache is full (``_shrink`` with it as the newcomer).  A batch
        with room for all of it enters with ``_enter_all`` instead.  The caller fits the
        bound afterwards, after one state or after many.

        A newcomer that loses admission goes without entering probation: pushed in and
        popped again, each left a dead slot in probation's entry table, and the
        thousands a scan turns away made the table resize to three slots per live state
        and more (10 MB cache: 2.6 MB of table for 25,000 states), which evicted the
        states a second pass was about to ask for, without admission (it served 0% of
        them at 10 MB, 28% at 32 MB).  The count to beat (``_admission_bar``) is found
        once for a run of newcomers that lose, as a prefetch's batch into a full cache
        mostly does: a loser changes neither the victim nor its count."""
        window = self._window
        count = self._sketch.count
        packer = self._packer
        bar: int | None = None
        # What ``_bytes`` counts besides the states and the window's table and keys:
        # a newcomer passing through the window and turned away leaves it as it was
        # (nothing enters probation, nothing is evicted), so it is read again only
        # after an admission, a squeeze or a bar's choice (which may promote).  Read
        # a state at a time, it took a quarter of a full cache's batch.
        rest: int | None = None
        for oid, value in entering:
            cost = state_cost(value)
            window.push(oid, value)
            self._window_bytes += cost
            self._current_bytes += cost
            while self._window_bytes > self._window_limit and window:
                candidate, value = window.pop_oldest()
                cost = state_cost(value)
                self._window_bytes -= cost
                self._current_bytes -= cost
                # Admission is judged on the state as it came, so that one turned away
                # is never compressed for nothing.
                room = entry_cost(value) + (1 if packer is not None else 0)
                over = 0
                if self._admission:
                    moving = (self._current_bytes + window.table_bytes
                              + len(window) * _OID_BYTES)
                    if rest is None:
                        rest = self._bytes() - moving
                    over = moving + rest + room - self.limit
                if over > 0 and self._squeezing:
                    self._squeeze(over, SQUEEZE_RUN)
                    bar = rest = None           # the victim may have changed
                    over = self._bytes() + room - self.limit
                if over > 0:
                    if bar is None:
                        bar = self._admission_bar()
                        rest = None
                    if count(candidate) <= bar:
                        continue                # turned away
                if packer is not None:
                    value = packer.pack(value)
                self._current_bytes += entry_cost(value)
                self._probation.push(candidate, value)
                self._shrink(candidate)
                bar = rest = None

    def _squeeze(self, excess: int, most: int) -> None:
        """The cache is full: in ``auto``, compression starts, and raw states at
        probation's old end (``TAG_RAW``, kept before it started) are compressed and
        moved to its new end, until they saved ``excess`` bytes or ``most`` were
        compressed.  Each state is squeezed once at most: its tag says it was tried."""
        packer = self._packer
        assert packer is not None
        packer.start()
        probation = self._probation
        for _ in range(most):
            oid = self._oldest_unmarked(None)
            if oid is None:
                break
            kept = probation.get(oid)
            assert kept is not None
            squeezed = packer.squeeze(kept)
            if squeezed is None:
                # Compressed or tried: every raw state has come round once.  None is
                # made raw once compression has started, so squeezing is over (those
                # a promotion kept in protected stay raw), and a full cache's
                # newcomers no longer pay a look at probation's oldest for it.
                self._squeezing = False
                break
            del probation[oid]
            probation.push(oid, squeezed)
            saved = entry_cost(kept) - entry_cost(squeezed)
            self._current_bytes -= saved
            excess -= saved
            if excess <= 0:
                break

    def _enter_all(self, entering: dict[int, bytes]) -> None:
        """``_enter_each`` of ``entering`` (oid -> tid + state, none cached) in their
        order, for a caller that found room for all: the window ends with the newest
        that fit its share, and the rest goes to probation, the window's own states
        first, oldest first, as they would one by one; but each segment's table is
        written once (``Segment.push_many``), not twice a state: 1,000-state
        batches, 4.4 to 5.2 us a state before, 3.2 to 3.7 after (thread CPU)."""
        if not entering:
            return
        costs = state_costs(entering.values())
        limit = self._window_limit
        staying = staying_bytes = 0       # the newest of ``entering`` the window keeps
        for cost in reversed(costs):
            if staying_bytes + cost > limit:
                break
            staying += 1
            staying_bytes += cost
        window = self._window
        leaving: dict[int, bytes] = {}
        # Older than every one entering: all go once one entering does not stay.
        excess = (ALL if staying < len(costs)
                  else self._window_bytes + staying_bytes - limit)
        if window and excess > 0:
            # In one walk (a full window's 1,000 oldest one at a time: 1 us a state).
            leaving, freed = window.take_oldest_until(excess, state_cost)
            self._window_bytes -= freed
            self._current_bytes -= freed
        entries = list(entering.items())
        moving = len(entries) - staying
        leaving.update(entries[:moving])
        if leaving and self._packer is not None:
            leaving = self._packer.pack_many(leaving)
        if leaving:
            self._probation.push_many(leaving)
            # (``entry_cost`` of each, summed without a call a state)
            self._current_bytes += (sum(map(len, leaving.values()))
                                    + ENTRY_BYTES * len(leaving))
        if staying:
            window.push_many(dict(entries[moving:]))
            self._window_bytes += staying_bytes
            self._current_bytes += staying_bytes

    def _admission_bar(self) -> int:
        """The count a newcomer leaving the window for a full cache must pass: that of
        the state it would push out (``_victim``'s choice) and the margin
        (``_count_to_beat``); -1, which every count passes, when there is none."""
        victim = self._oldest_unmarked(None)
        if victim is None:
            victim = self._protected.oldest()
            if victim is None:
                return -1
        return self._count_to_beat(victim)

    def _sketch_wanted(self, entries: int) -> int:
        """The counters the sketch should widen to for ``entries`` states (twice as
        many, up to the cache's share), or 0 while it has one for each already."""
        width = 1 << self._sketch.bits
        if entries > width and width < self._sketch_entries:
            return min(2 * entries, self._sketch_entries)
        return 0

    def _shrink(self, newcomer: int | None) -> None:
        """Evict current states until the count fits (see :meth:`_victim`), exact
        revisions (kept within their share as they come) once none is left.  The count
        is taken again after each eviction: an eviction from a segment's head may also
        pass holes (given back) and a promotion on the way may move a state."""
        sketch = self._sketch
        wanted = self._sketch_wanted(
            len(self._probation) + len(self._protected) + len(self._window))
        if wanted:
            before = sketch.size_bytes
            sketch.grow(wanted)
            self._fixed_bytes += sketch.size_bytes - before
        while self._bytes() > self.limit:
            if not self._probation and not self._protected and not self._window:
                if not self._revisions:
                    return
                self._pop_revision()
                continue
            packer = self._packer
            if self._squeezing and packer is not None:
                packer.start()
            source, victim = self._victim(newcomer)
            value = source.pop(victim)
            if source is self._window:
                cost = state_cost(value)
                self._window_bytes -= cost
            else:
                cost = entry_cost(value)
                if source is self._protected:
                    self._protected_bytes -= cost
            self._current_bytes -= cost
            if victim == newcomer:
                newcomer = None

    def _victim(self, newcomer: int | None) -> tuple[ArenaSegment | Segment, int]:
        """Probation's oldest (protected's, when probation holds only the newcomer), or
        the newcomer itself unless it was asked for clearly more often than that one."""
        source: ArenaSegment | Segment = self._probation
        victim = self._oldest_unmarked(newcomer)
        if (victim is None or victim == newcomer) and self._protected:
            source = self._protected
            victim = source.oldest()
        if victim is None:              # the window alone is over the bound
            source = self._window
            victim = source.oldest()
        assert victim is not None        # the caller checked that a segment holds one
        if (self._admission and newcomer is not None and victim != newcomer
                and newcomer in self._probation
                and self._loses_admission(newcomer, victim)):
            return self._probation, newcomer
        return source, victim

    def _loses_admission(self, newcomer: int, victim: int) -> bool:
        """The admission test: was ``newcomer`` asked for no more than
        ``ADMISSION_MARGIN`` times above ``victim``, as the sketch counts?"""
        return self._sketch.count(newcomer) <= self._count_to_beat(victim)

    def _count_to_beat(self, victim: int) -> int:
        """The count a newcomer must pass to push ``victim`` out: the victim's as the
        sketch counts it, and ``ADMISSION_MARGIN``."""
        return self._sketch.count(victim) + ADMISSION_MARGIN

    def _bytes(self) -> int:
        # Run at every eviction step: the tables' sizes are read as kept by the segments
        # (``table_bytes``; their batches are constant, in ``_fixed_bytes``).
        probation, protected, window = self._probation, self._protected, self._window
        changed = self._changed
        return (self._current_bytes + self._revision_bytes + len(window) * _OID_BYTES
                + probation.table_bytes + protected.table_bytes + window.table_bytes
                + self._revisions.table_bytes
                + sys.getsizeof(changed) + len(changed) * (_OID_BYTES + _TID_BYTES)
                + self._retired_bytes + self._fixed_bytes)

    def _batches_bytes(self) -> int:
        """What the segments' batches of oldest keys count for (constant: a batch counts
        as full, see ``Segment.size_bytes``)."""
        segments = (self._probation, self._protected, self._window, self._revisions)
        return sum(segment.size_bytes - segment.table_bytes for segment in segments)

    def clear(self) -> None:
        with self._lock:
            self._drop_current()
            self._revisions.clear()
            self._revision_bytes = 0
            self._changed.clear()
            self.base = self.polled = -1
            self.epoch += 1

    def close(self) -> None:
        """Give the memory back: a closed storage may stay referenced (by a test
        framework, a DB kept for its name), and its cache must not stay allocated."""
        self.clear()
        with self._lock:
            self.limit = 0
            self._sketch = FrequencySketch(0)
            self._reserved = 0          # what is counted outside it goes with it
            self._fixed_bytes = self._sketch.size_bytes + self._batches_bytes()

    def __len__(self) -> int:
        return (len(self._probation) + len(self._protected) + len(self._window)
                + len(self._revisions))

    @property
    def bytes_used(self) -> int:
        """What the cache's objects take in memory, as counted against its limit."""
        with self._lock:
            return self._bytes() if self.enabled else 0
