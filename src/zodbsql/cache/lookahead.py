"""What a miss among cached states should bring along: the uncached states after it.

A walk over more objects than the cache holds (a second pass over a large BTree) finds
some states in the cache and misses others.  Its misses come one by one in the middle of
containers whose states the cache holds (a bucket was a hit, one of its items is not),
so no load queued their references, and the database's own choice of what comes along
(the parent's references after the miss, and on PostgreSQL the walk onward from them)
brought states the cache already held: 48,000 of the 166,000 a second pass over 200,000
objects at 32 MB fetched.

Here the client looks through the cache instead: the miss's parent is the newest of the
states touched last (``Prefetcher.parents``) whose cached state refers to it; the oids
after the miss in the parent's references (ascending, the database's order), then
the first of those before it (``FIRST_BEFORE``), that are not cached come along (a
BTree's next bucket may have an older oid than the items of this one: without it
every bucket cost two statements),
and the cached ones among them are looked into in turn (the next bucket a walk will
enter, whose items may be missing), breadth first, until
``count`` oids are found, ``MAX_LOOKED_INTO`` states with references were read,
``MAX_BARREN`` slices of their references in a row brought nothing or ``MAX_EXAMINED``
oids were looked up.
Where the parent holds a few references and none is left to bring (an object's own
sub-objects), its own parent's next children are looked into instead (``_climbed``): a
walk of a container reads each child and what it holds.
A state larger than ``BYTES_READ_PER_OID`` per oid wanted, or than the caller's
``largest_read``, is not read: the caller's ``following`` answers for it from the
database, which keeps each revision's references (a sparse read of a container of
10,000 children).  MVCC is untouched:
a cached state is current at the snapshot, so its references are the snapshot's, and
what this picks is only a list of oids, each read as of the snapshot.
"""
from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict, deque
from typing import Callable, Container, Iterable, Protocol, Sequence, TypeVar

#: Cached states whose references are read at most, per miss (a bucket of an OOBTree
#: holds up to 30 items: 64 buckets cover a batch of 1,000 and more).
MAX_LOOKED_INTO = 64


def uncached_after(oid: int, parents: Sequence[int], count: int,
                   cached_states: Callable[[Sequence[int]], list[bytes | None]],
                   references: Callable[[int, bytes], Sequence[int]],
                   largest_read: int | None = None,
                   leaf: Callable[[bytes], bool] | None = None,
                   following: Callable[[int, int], Sequence[int] | None] | None = None,
                   looked_into_at_most: int = MAX_LOOKED_INTO,
                   ) -> tuple[int | None, list[int]]:
    """The cached parent of ``oid`` among ``parents`` (the likeliest last), or None, and
    up to ``count`` oids after ``oid`` that the cache does not hold, found as the module
    says; where a parent of a few references brought none, those its own parent's next
    children hold, and that parent (``_climbed``).  ``cached_states(oids)``: the state
    the cache holds for the snapshot of each (None: none);
    ``references(oid, state)``: the oids a state refers to, ascending; ``largest_read``:
    the largest state read, whatever ``count`` (None: no such bound); ``leaf(state)``:
    True for a state that certainly refers to nothing (never looked into, at the cost of
    a byte search instead of ``references``); ``following(parent, oid)``: the oids
    after ``oid`` in the references of a cached state too large to read, ``parent``,
    None when it does not refer to ``oid`` (asked of ``LARGE_ASKED`` such states at
    most: the database cuts them from the revision's references);
    ``looked_into_at_most``: cached states whose references are read after the
    parent's (0: the parent's own references only)."""
    if count <= 0:
        return None, []         # a batch of nothing: no state read, nothing asked
    largest = count * BYTES_READ_PER_OID
    if largest_read is not None:
        largest = min(largest, largest_read)
    met = _parent_of(oid, parents, cached_states, references, largest, leaf, following,
                     (oid,), LARGE_ASKED)
    if met is None:
        return None, []
    parent, held_after, held_before = met
    after: Sequence[int] = [*held_after, *held_before]
    found: list[int] = []
    seen = {oid, parent}
    refs: Sequence[int] = after
    # The cached states met, (oid, state) in order, whose references are read only once
    # the lists before them are through (a batch found among the first is read no further).
    cached: deque[tuple[int, bytes]] = deque()
    looked_into = 0
    # Slices in a row, past the parent's own references, without an uncached oid: the
    # cached subtrees around the miss were read already (a new container's siblings).
    barren = 0
    while True:
        # The cache is asked a slice at a time (one hold of its lock each), so a
        # container of 10,000 children is not looked through past the batch.
        for start in range(0, len(refs), PEEKED_TOGETHER):
            if len(seen) >= MAX_EXAMINED or barren >= MAX_BARREN:
                return parent, found
            chunk = [each for each in refs[start:start + PEEKED_TOGETHER] if each not in seen]
            seen.update(chunk)
            had = len(found)
            for each, state in zip(chunk, cached_states(chunk)):
                if state is None:
                    found.append(each)
                    if len(found) == count:
                        return parent, found
                elif len(state) <= largest and (leaf is None or not leaf(state)):
                    cached.append((each, state))
            if refs is not after:
                barren = barren + 1 if len(found) == had else 0
        refs = ()
        while not refs and cached and looked_into < looked_into_at_most:
            refs = references(*cached.popleft())
            if refs:            # a leaf costs a byte search, and is not counted
                looked_into += 1
        if not refs and not found and looked_into < looked_into_at_most:
            climbed = _climbed(parent, parents, cached_states, references, largest,
                               following, seen)
            if climbed is not None:
                # Read as the parent's own: its cached siblings are looked into.
                parent, refs = climbed
                after = refs
                looked_into, looked_into_at_most = 0, CLIMB_LOOKED_INTO
        if not refs:
            return parent, found


def _climbed(parent: int, parents: Sequence[int],
             cached_states: Callable[[Sequence[int]], list[bytes | None]],
             references: Callable[[int, bytes], Sequence[int]], largest: int,
             following: Callable[[int, int], Sequence[int] | None] | None,
             seen: set[int]) -> tuple[int, list[int]] | None:
    """Where a miss's parent holds a few references (``CLIMB_FROM_AT_MOST``) and none
    of them is left to bring (an object's own sub-objects: its annotations, a list), the
    batch is its siblings' sub-objects, which a walk of their parent reads next: that
    parent among ``parents`` (cached), and its next ``CLIMB_LOOKED_INTO`` references
    after the miss's parent (read from its state within ``largest``, else asked of
    ``following``, once), or None.  (SQLite walked a mapping of 1,000 objects that each
    held one a statement an object.)"""
    state = cached_states((parent,))[0]
    if state is None or len(references(parent, state)) > CLIMB_FROM_AT_MOST:
        return None
    met = _parent_of(parent, parents, cached_states, references, largest, None, following,
                     seen, 1)
    if met is None:
        return None
    grandparent, siblings, _ = met
    seen.add(grandparent)
    return grandparent, [each for each in siblings[:CLIMB_LOOKED_INTO] if each not in seen]


def _parent_of(child: int, candidates: Sequence[int],
               cached_states: Callable[[Sequence[int]], list[bytes | None]],
               references: Callable[[int, bytes], Sequence[int]], largest: int,
               leaf: Callable[[bytes], bool] | None,
               following: Callable[[int, int], Sequence[int] | None] | None,
               passed_over: Container[int], ask_at_most: int,
               ) -> tuple[int, Sequence[int], Sequence[int]] | None:
    """The newest of ``candidates`` (the likeliest last, none of ``passed_over``) that
    is cached and refers to ``child``, with its references after ``child`` and the first
    ``FIRST_BEFORE`` before it; or None.  A state within ``largest`` is read; a larger
    one (not a ``leaf``) is asked of ``following`` for those after (``ask_at_most`` such
    states at most), and none before come."""
    asked = 0
    for candidate in reversed(candidates):
        if candidate < 0 or candidate in passed_over:
            continue
        state = cached_states((candidate,))[0]
        if state is None:
            continue
        if len(state) > largest:
            if (following is None or asked == ask_at_most
                    or (leaf is not None and leaf(state))):
                continue
            asked += 1
            after = following(candidate, child)
            if after is not None:
                return candidate, after, ()
            continue
        held = references(candidate, state)
        at = bisect_left(held, child)
        if at < len(held) and held[at] == child:
            return candidate, held[at + 1:], held[:min(at, FIRST_BEFORE)]
    return None


class Came(Protocol):
    """A state a load brought (a mover's ``LoadedState``)."""

    @property
    def oid(self) -> int: ...

    @property
    def state(self) -> bytes | None: ...


CameT = TypeVar("CameT", bound=Came)


def walked_on(came: Sequence[CameT], count: int, room: int | None,
              cached_states: Callable[[Sequence[int]], list[bytes | None]],
              references: Callable[[int, bytes], Sequence[int]], largest_read: int,
              leaf: Callable[[bytes], bool],
              load: Callable[[list[int]], list[CameT]],
              loaded_already: Iterable[int] = (),
              load_walked: Callable[[list[int], int], list[CameT] | None] | None = None,
              ) -> list[CameT]:
    """Past a pick that came short of its bound (the parent's references ran out: a
    BTree bucket's last items and the next bucket), what the states that ``came`` refer
    to and the cache does not hold, then what those refer to, a ``load`` a step: the
    next buckets and their items, as PostgreSQL's walking statement brings them on the
    server.  A cold walk over an OOBTree on SQLite otherwise paid a whole miss (the
    lookahead, the batch's entry into the cache, the prefetch plan: ~240 us) for every
    bucket's 15 to 30 items.

    A step is taken whole or not at all: within ``count`` states and, at the sizes seen,
    ``room`` bytes (None: no bound).  A step cut short left a bucket's last items to
    misses of their own, and without the bucket among the states touched last, each was
    a statement without a batch.  The first cached states met are read too
    (``CACHED_LOOKED_INTO`` a step).  The walk ends after ``WALK_STEPS`` steps, at a
    step that lists more than ``count`` references (a container's children), or when
    nothing it reads refers to a state not held; states larger than
    ``largest_read`` and ``leaf`` ones are not read for their references.
    ``loaded_already``: oids loaded with ``came`` but not walked from (the miss's own),
    never loaded again.

    ``load_walked(seeds, limit)``, where the mover has it: the rest of the walk in one
    statement from the first step's oids, breadth first through references, up to
    ``limit`` states (as many of ``count`` as ``room`` holds at the sizes seen), those
    of ``came`` left out and the last cut to ``room``; it returns None where it can't,
    and the walk takes its steps.  It does not see the cache: a cached state on the
    way comes again (a bucket a walk left, its items gone), a cost within the batch."""
    brought: list[CameT] = []
    seen = {each.oid for each in came}
    seen.update(loaded_already)
    came_before = frozenset(seen)
    sizes = [len(each.state) for each in came if each.state is not None]
    seen_bytes, seen_states = sum(sizes), max(1, len(sizes))

    def readable(state: bytes | None) -> bool:
        """Is ``state`` one whose references the walk reads?"""
        return state is not None and len(state) <= largest_read and not leaf(state)

    def uncached(states: Iterable[tuple[int, bytes | None]],
                 ) -> tuple[list[int], list[tuple[int, bytes]]] | None:
        """The references of ``states`` not met before: those not cached, and the
        cached ones to read, with their states; None past ``count`` of them (a container's
        children, not a bucket's: not this walk's to bring)."""
        listed: list[int] = []
        for parent, state in states:
            if state is None or not readable(state):
                continue
            for oid in references(parent, state):
                if oid not in seen:
                    seen.add(oid)
                    listed.append(oid)
            if len(listed) > count:
                return None
        found: list[int] = []
        held: list[tuple[int, bytes]] = []
        for oid, state in zip(listed, cached_states(listed) if listed else ()):
            if state is None:
                found.append(oid)
            elif readable(state):
                held.append((oid, state))
        return found, held

    frontier: list[tuple[int, bytes | None]] = [(each.oid, each.state) for each in came]
    for _ in range(WALK_STEPS):
        step = uncached(frontier)
        if step is None:
            break
        wanted, held = step
        # Cached states they refer to: the next bucket an earlier miss brought, whose
        # items did not come.  A few, one level: more is a subtree read before (a warm
        # reader next to a BTree it walked looked through 4,000 of its states).
        for each in held[:CACHED_LOOKED_INTO]:
            more = uncached([each])
            if more is not None:
                wanted += more[0]
        if (not wanted or len(wanted) > count
                or (room is not None and len(wanted) * seen_bytes // seen_states > room)):
            break
        if load_walked is not None and not brought:
            limit = (count if room is None
                     else min(count, room * seen_states // max(1, seen_bytes)))
            walked = load_walked(wanted, limit)
            if walked is not None:
                return _within(
                    [each for each in walked if each.oid not in came_before], room)
        loaded = load(wanted)
        brought += loaded
        frontier = [(each.oid, each.state) for each in loaded]
        count -= len(loaded)
        step_bytes = sum(len(each.state or b"") for each in loaded)
        seen_bytes += step_bytes
        seen_states += len(loaded)
        if room is not None:
            room -= step_bytes
    return brought


def _within(walked: list[CameT], room: int | None) -> list[CameT]:
    """The first of ``walked`` whose states fit in ``room`` bytes (None: all)."""
    if room is None:
        return walked
    for at, each in enumerate(walked):
        room -= len(each.state or b"")
        if room < 0:
            return walked[:at]
    return walked


#: Cached states a step of ``walked_on`` reads the references of, at most.
CACHED_LOOKED_INTO = 2
#: Loads ``walked_on`` makes at most, one after the other (each a statement).
WALK_STEPS = 16
#: A walk that may bring ``count`` states is taken from at most this many times as many
#: states that came: past a pick of a container's 999 leaf children a walk of one
#: state read them all for references they do not have, 0.5 ms of a 1,000-object
#: read on SQLite.
WALKED_FROM_EACH = 4

#: Of the parent's references before the miss, the first this many are looked through
#: (after those after it): a BTree bucket's next bucket, older than its items, opens the
#: list; the rest are, in a forward walk, the siblings read already, and looking through
#: all of them cost the last miss of a cold read of a 1,000-child mapping ~900 lookups in
#: the cache (PostgreSQL's prefetching statement takes the parent's first 16 the same
#: way, ``FIRST_OF_PARENT``).
FIRST_BEFORE = 16
#: A miss's parent with at most this many references, none of them left to bring,
#: passes the batch up to its own parent (``_climbed``): the sub-objects of an object's
#: next siblings.
CLIMB_FROM_AT_MOST = 16
#: The siblings a climb looks into at most, for a sub-object each (a walk of 1,000
#: such objects on SQLite: 64 a miss, 59 statements and 46.7 ms; 128, 35 and 43.0 ms;
#: 512, 19 and 39.4 ms).  A second pass, which finds them cached, stops after
#: ``MAX_BARREN`` slices of them, and ``MAX_EXAMINED`` bounds every call.
CLIMB_LOOKED_INTO = 512
#: Cached states too large to read that ``uncached_after`` asks ``following`` about
#: at most (each a statement).
LARGE_ASKED = 2
#: Oids whose cached states ``uncached_after`` asks for at once.
PEEKED_TOGETHER = 128
#: Slices of the references of cached states, one after the other, without an
#: uncached oid, after which a call looks no further.
MAX_BARREN = 4
#: Oids one call asks the cache about at most (then it returns what it found): a miss
#: next to cached containers of cached children (the bench's warm read, on PostgreSQL)
#: read the references of 3,500 cached states at every miss.
MAX_EXAMINED = 4096


#: The largest state read for its references, per oid wanted: reading them costs
#: ~50 ns a byte (a container of 10,000 children: 7 ms), a load saved on SQLite ~10 us.
#: A miss that may bring 8 states does not read a container of 10,000 children (a
#: sparse read of it), one that may bring 1,000 does (a walk over it, whose misses
#: then find its references remembered, ``ReferenceMemo``).
BYTES_READ_PER_OID = 256
#: Parsed states remembered by ``ReferenceMemo``.
MEMO_STATES = 16


class ReferenceMemo:
    """``references(oid, state)`` ascending, remembered for the states read last: a
    walk's misses look into the same container again and again, and reading the
    references of one with 10,000 children takes ~7 ms.  A state is remembered with
    its bytes, so a changed one is read again."""

    def __init__(self, references: Callable[[int, bytes], Iterable[int]]) -> None:
        self._references = references
        self._memo: OrderedDict[int, tuple[bytes, list[int]]] = OrderedDict()

    def __call__(self, oid: int, state: bytes) -> list[int]:
        known = self._memo.get(oid)
        if known is not None and known[0] == state:
            return known[1]
        refs = sorted(self._references(oid, state))
        if refs:        # a leaf is read in a byte search: not worth a place
            self._memo[oid] = (state, refs)
            while len(self._memo) > MEMO_STATES:
                self._memo.popitem(last=False)
        return refs
