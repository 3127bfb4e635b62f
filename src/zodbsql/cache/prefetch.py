"""Reference-driven prefetch: which states come along when a load misses the cache.

Every commit records the oids each new state refers to (``object_ref``).  A load that
must ask the database asks, in the same statement, for the states its object refers
to, and for the references of every state returned (oids only).  References not loaded
wait in a queue, in the order they were found: when a load misses one of them, the
oids queued after it come along too (the next children of the same container, the items
of the next buckets of a BTree).  Walking a container therefore costs a statement per
batch of children, not one per child.

A load returns a bounded number of each state's references, so a large container's later
children, or the items of a bucket that came without its references, are not queued.
For those a miss also asks for the references after it of its parent, the state that
refers to it, which the database finds among the ``RECENT`` states this process touched
last (``parents``): the bucket a walk just entered, or the container whose last
queued child (its tail) a load or hit just reached.  (The database keeps no index from a
reference back to its referrer to find it there: every commit paid an index entry per
reference for it, in random order.)

A batch holds at most ``bound`` states and ``max_bytes`` bytes.  ``bound`` adapts to
what the process does with them: every prefetched state is remembered until a load
finds it in the cache (used) or it drops out of the ``fresh`` record.  At each miss,
once ``WINDOW`` states (a whole batch, for a bound below that) were prefetched since
the last decision, the share used decides: under ``SHRINK_BELOW`` the bound halves once
those states came in two batches or more (a miss's own references, such as the
containers that come with the root, are read later or never while the walk below
reads the next batch: one such batch is not enough to judge by), and when none was
used it drops to 0 at once (a sparse walk: one child in a hundred); over
``GROW_ABOVE`` it grows fourfold, and sixteenfold when every one was used (a full
walk), up to ``limit`` (``prefetch-count``).  At 0 a load
brings nothing along, except that a miss tries ``PROBE`` states again when it follows
the previous miss closely (at most ``NEAR`` slots on in the queue, or ``NEAR`` oids on:
a walk that turned sequential, such as a process's next full read after a sparse one,
whose loads at 0 queued nothing; a container's children were mostly created together,
at consecutive oids) and at every ``PROBE_EVERY``-th miss.

One ``Prefetcher`` serves every instance of a storage in the process; what it decides
never affects which revision a load returns, only how many statements it takes (the
states are cached by the state cache's rules).
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Callable, Iterable

from zodbsql.backends.base.mover import NO_PARENT, PARENTS

#: The bound a process starts with: small, so that a sparse walk wastes little before
#: the bound falls to 0; it grows fourfold at each miss while prefetches are used.
START = 8
GROWTH = 4
#: The growth after a window every state of which was used: a full walk, such as a
#: process's next full read after a sparse one taught it 0, reaches the limit in two
#: decisions after its probe, not four (the bench's warm read after its sparse one: 11
#: statements on PostgreSQL where it takes 4 alone).
GROWTH_ALL_USED = 16
#: Prefetched states counted before the bound is reconsidered.
WINDOW = 16
SHRINK_BELOW = 0.25
GROW_ABOVE = 0.5
#: With the bound at 0: how often a miss still tries, and how many states.
PROBE_EVERY = 64
PROBE = 8
#: A miss this many queue slots (or oids) or fewer after the previous one is a
#: sequential walk's.
NEAR = 4
#: Queued references kept at most, in batches of the bound's limit (the oldest go
#: first): a walk reads a batch's references at its next few misses.  What it never
#: reads stays until then: a soak's querier (its bound at 0, reading the newest of
#: each bucket's documents) queued 2,300 a minute, and with a fixed 200,000 queued and
#: 65,536 tails its RSS grew 24 MB in an hour.  At 20 and 4 batches the bench's cold,
#: warm, sparse and btree-walk tests take the same statements as at those.
QUEUED_BATCHES = 20
#: Dead slots (oids loaded since they were queued) tolerated beyond the live ones.
DEAD_SLACK = 4096
#: Tails remembered at most, in batches of the bound's limit (the oldest go first).
TAIL_BATCHES = 4
#: What the queue and the tails cost, measured with ``tracemalloc``: a queued oid (its
#: slot, its ``int``, its position's dict entry and ``int``) 120 bytes; a dead slot its
#: pointer and the oid's ``int``; a tail (an ``OrderedDict`` entry, two ``int``) 125,
#: counted high.
QUEUED_ENTRY_BYTES = 120
DEAD_SLOT_BYTES = 40
TAIL_ENTRY_BYTES = 160
#: How much that cost moves before the state cache is told again (``report``).
REPORT_STEP = 64 << 10
#: States touched last, offered as the parent of a miss: as many as a load statement
#: tests.
RECENT = PARENTS
#: What a batch's state costs on its way into the state cache besides its pickle:
#: the driver's row and its ints, the tuples each step builds (the load's rows, the
#: rows for the cache), its checksum, a few references.  Measured with ``tracemalloc``
#: (``scripts/cache_memory.py``'s walk at 10 MB, 1,000 states of 175 bytes a batch):
#: 0.84 MB above the steady state at the median batch, 1.23 at the largest.
IN_FLIGHT_ENTRY_BYTES = 640
#: What the record of a prefetched state not used yet costs (``Prefetcher._fresh``, an
#: ``OrderedDict``: 121 bytes an oid measured with ``tracemalloc``), and how many
#: batches' states it remembers.
FRESH_ENTRY_BYTES = 128
FRESH_BATCHES = 4


def fresh_bound(count: int) -> int:
    """The prefetched states not used yet remembered at most, for batches of ``count``."""
    return FRESH_BATCHES * max(count, WINDOW)


def working_bytes(count: int, size: int) -> int:
    """The memory a prefetch takes besides the state cache, at most, for batches of
    ``count`` states and ``size`` bytes: one batch on its way in (its pickles twice:
    the rows and the cache's copy), what one storage instance holds of the last ones
    for its loads (``brought.Brought``, within ``size``) and the record of those not
    used yet.  The state cache counts it against its bound (``StateCache.reserve``):
    without it a 10 MB cache's process took 3 MB more with prefetch than without."""
    if count <= 0 or size <= 0:
        return 0
    return (count * IN_FLIGHT_ENTRY_BYTES + 3 * size
            + fresh_bound(count) * FRESH_ENTRY_BYTES)


class Prefetcher:
    """The queue of found references and the adaptive bound of one storage."""

    def __init__(self, limit: int, max_bytes: int,
                 held: Callable[[int], bool] = lambda oid: False,
                 report: Callable[[int], None] = lambda cost: None) -> None:
        self.limit = max(0, limit)
        self.max_queued = QUEUED_BATCHES * max(self.limit, WINDOW)
        self.max_tails = TAIL_BATCHES * max(self.limit, WINDOW)
        #: Told what the queue and the tails cost (``bookkeeping_bytes``) when it moved
        #: by ``REPORT_STEP`` since: the state cache counts it against its bound.
        self._report = report
        self._reported = 0
        #: Is a state of this oid in the state cache?  Its load will be a hit, so it
        #: is not queued: a walk that found it there passed it for good, and a
        #: reference found again (a parent's references after a miss, read anew at
        #: each) stayed queued for ever (a walk of 200,000 objects at a 1 MB cache:
        #: 93,000 of them, 30 MB of peak RSS).
        self._held = held
        self.max_bytes = max(0, max_bytes)
        self.bound = min(self.limit, START)
        self._queue: list[int] = []
        self._position: dict[int, int] = {}     # oid -> its index in _queue
        self._fresh: OrderedDict[int, bool] = OrderedDict()  # prefetched, not used yet
        self._window_prefetched = 0
        self._window_used = 0
        self._window_batches = 0
        self._misses = 0
        self._last_miss_slot: int | None = None  # the queue slot of the previous miss
        self._last_miss_oid: int | None = None   # the oid of the previous miss
        #: The last reference found of a state -> that state.
        self._tails: OrderedDict[int, int] = OrderedDict()
        #: The states loaded or found in the cache last, and the holders of the tails
        #: reached last (the newest at the end).
        self._recent: deque[int] = deque([NO_PARENT] * RECENT, maxlen=RECENT)
        #: The parent found last for a miss (``note_parent``).
        self._container = NO_PARENT
        self._lock = threading.Lock()
        #: Totals since the storage was opened.
        self.prefetched = 0
        self.used = 0

    @property
    def enabled(self) -> bool:
        return self.limit > 0 and self.max_bytes > 0

    def note_hit(self, oid: int) -> bool:
        """A load found ``oid`` in the cache: count it if it was prefetched, and say
        whether it was.  (Unlocked: a count lost to a race only nudges the bound.)"""
        self._touched(oid)
        if oid in self._position:
            # Queued, and found in the cache: no load will take it off the queue, and
            # a second pass over more than the cache holds (10 MB, 200,000 objects)
            # left 31,000 of them there, 3 MB of peak RSS.  Locked: ``_drop_loaded``
            # rebuilds the dict.
            with self._lock:
                self._position.pop(oid, None)
        if self._fresh.pop(oid, False):
            self._window_used += 1
            self.used += 1
            return True
        return False

    def parents(self) -> list[int]:
        """At a miss that goes to the database (after ``plan``): ``RECENT`` oids among
        which its parent may be (padded with ``NO_PARENT``), the likeliest last."""
        with self._lock:
            if self._container == NO_PARENT or self._recent[-1] == self._container:
                return list(self._recent)
            return [*list(self._recent)[1:], self._container]

    def note_parent(self, parent: int) -> None:
        """A miss's parent was found among the cached states: a container whose
        children a walk is reading, offered first at the next misses, whatever the
        number of children touched since (``RECENT``)."""
        self._container = parent

    def _touched(self, oid: int) -> None:
        """``oid`` was hit or missed: it, and the state whose tail it is, become the
        likeliest parents of the next miss."""
        self._recent.append(oid)
        if self._tails:
            parent = self._tails.pop(oid, None)
            if parent is not None:
                self._recent.append(parent)

    def plan(self, oid: int) -> tuple[int, list[int]]:
        """At a miss of ``oid``: how many states may come along, and the queued oids
        that follow ``oid`` (up to that many)."""
        with self._lock:
            self._touched(oid)
            self._misses += 1
            self._reconsider()
            bound = self.bound
            slot = self._position.get(oid)
            last, self._last_miss_slot = self._last_miss_slot, slot
            last_oid, self._last_miss_oid = self._last_miss_oid, oid
            if bound == 0:
                sequential = ((slot is not None and last is not None
                               and 0 < slot - last <= NEAR)
                              or (last_oid is not None and 0 < oid - last_oid <= NEAR))
                if sequential or self._misses % PROBE_EVERY == 0:
                    bound = PROBE
                else:
                    # Loaded alone, never reported to ``loaded``: its slot goes now, or
                    # the queue keeps every reference a walk at bound 0 reaches (up to
                    # its limit: ~37 MB of peak RSS over 200,000 objects at 200,000).
                    self._position.pop(oid, None)
                    return 0, []
            return bound, self._following(oid, bound)

    def loaded(self, oid: int, prefetched: list[int],
               references: Iterable[tuple[int, int]]) -> None:
        """Record a load of ``oid`` that cached the ``prefetched`` states and found the
        ``references`` ``(from, to)`` of the states it returned."""
        with self._lock:
            self._record(oid, prefetched, references)
            cost = self.bookkeeping_bytes()
            moved = abs(cost - self._reported) >= REPORT_STEP
            if moved:
                self._reported = cost
        if moved:          # outside the lock: the cache takes its own
            self._report(cost)

    def bookkeeping_bytes(self) -> int:
        """What the queue and the tails take now, counted as measured (a queued oid
        ``QUEUED_ENTRY_BYTES``, a dead slot ``DEAD_SLOT_BYTES``, a tail
        ``TAIL_ENTRY_BYTES``): at most ~3 MB at the default limit of 1,000."""
        live = len(self._position)
        return (live * QUEUED_ENTRY_BYTES + max(0, len(self._queue) - live) * DEAD_SLOT_BYTES
                + len(self._tails) * TAIL_ENTRY_BYTES)

    # -- inside the lock ------------------------------------------------------------------
    def _record(self, oid: int, prefetched: list[int],
                references: Iterable[tuple[int, int]]) -> None:
        fetched = {oid, *prefetched}
        for each in fetched:
            self._position.pop(each, None)
        self._fresh.pop(oid, None)
        for each in prefetched:
            self._fresh[each] = True
        self._window_prefetched += len(prefetched)
        self._window_batches += bool(prefetched)
        self.prefetched += len(prefetched)
        while len(self._fresh) > fresh_bound(self.limit):
            self._fresh.popitem(last=False)
        # Queued in the order their states came (the loaded one's first, then the
        # batch's order, which a walk follows: a BTree's buckets one after the
        # other), not the order the database listed the references in, so that a
        # miss brings what follows it (unordered: a statement a bucket).
        rank = {each: index for index, each in enumerate(prefetched)}
        rank[oid] = -1                  # the loaded state's own come first
        last = len(rank)
        tails: dict[int, int] = {}
        held = self._held
        for from_oid, to_oid in sorted(references, key=lambda ref: rank.get(ref[0], last)):
            tails[from_oid] = max(tails.get(from_oid, to_oid), to_oid)
            if (to_oid not in fetched and to_oid not in self._position
                    and not held(to_oid)):
                self._position[to_oid] = len(self._queue)
                self._queue.append(to_oid)
        for from_oid, tail in tails.items():
            self._tails[tail] = from_oid
            self._tails.move_to_end(tail)
        while len(self._tails) > self.max_tails:
            self._tails.popitem(last=False)
        if len(self._queue) > self.max_queued:
            self._compact()
        elif len(self._queue) > 2 * len(self._position) + DEAD_SLACK:
            self._drop_loaded()

    def _reconsider(self) -> None:
        if self._window_prefetched < max(1, min(WINDOW, self.bound)):
            return
        share = self._window_used / self._window_prefetched
        if share == 0:
            self.bound = 0
        elif share < SHRINK_BELOW:
            if self._window_batches < 2:
                return                  # one batch partly used: the next decides too
            self.bound //= 2
        elif share > GROW_ABOVE:
            growth = (GROWTH_ALL_USED if self._window_used >= self._window_prefetched
                      else GROWTH)
            self.bound = min(self.limit, max(PROBE, growth * self.bound))
        self._window_prefetched = self._window_used = self._window_batches = 0

    def _following(self, oid: int, count: int) -> list[int]:
        """Up to ``count`` oids still queued after ``oid`` (none if it isn't queued)."""
        start = self._position.get(oid)
        if start is None or count == 0:
            return []
        found: list[int] = []
        queue, position = self._queue, self._position
        end = min(len(queue), start + 1 + 4 * count)  # loaded oids leave gaps: skip a few
        for index in range(start + 1, end):
            candidate = queue[index]
            if position.get(candidate) == index:
                found.append(candidate)
                if len(found) == count:
                    break
        return found

    def _drop_loaded(self, keep_from: int = 0) -> None:
        """Forget the slots of oids loaded since they were queued (and, with
        ``keep_from``, the oldest live ones): a walk loads nearly everything it
        queues, and the dead slots (and the ints they hold) grew the queue to
        its limit before, ~8 MB at its peak over an OOBTree walk at 200,000."""
        live = [oid for index, oid in enumerate(self._queue)
                if self._position.get(oid) == index]
        self._queue = live[keep_from:]
        self._position = {oid: index for index, oid in enumerate(self._queue)}
        self._last_miss_slot = None     # its slot moved

    def _compact(self) -> None:
        """Keep the newest half of the queued oids."""
        # Every oid in _position is live at exactly one slot: it counts the live ones.
        self._drop_loaded(keep_from=len(self._position) // 2)
