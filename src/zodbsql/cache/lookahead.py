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
from typing import Callable, Iterable, Sequence

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
    says.  ``cached_states(oids)``: the state the cache holds for the snapshot of each
    (None: none);
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
    parent: int | None = None
    after: Sequence[int] = ()
    largest = count * BYTES_READ_PER_OID
    if largest_read is not None:
        largest = min(largest, largest_read)
    asked = 0
    for candidate in reversed(parents):
        if candidate < 0 or candidate == oid:
            continue
        state = cached_states((candidate,))[0]
        if state is None:
            continue
        if len(state) > largest:
            if (following is None or asked == LARGE_ASKED
                    or (leaf is not None and leaf(state))):
                continue
            asked += 1
            found_after = following(candidate, oid)
            if found_after is not None:
                parent, after = candidate, found_after
                break
            continue
        held = references(candidate, state)
        at = bisect_left(held, oid)
        if at < len(held) and held[at] == oid:
            parent, after = candidate, [*held[at + 1:], *held[:min(at, FIRST_BEFORE)]]
            break
    if parent is None:
        return None, []
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
        if not refs:
            return parent, found


#: Of the parent's references before the miss, the first this many are looked through
#: (after those after it): a BTree bucket's next bucket, older than its items, opens the
#: list; the rest are, in a forward walk, the siblings read already, and looking through
#: all of them cost the last miss of a cold read of a 1,000-child mapping ~900 lookups in
#: the cache (PostgreSQL's prefetching statement takes the parent's first 16 the same
#: way, ``FIRST_OF_PARENT``).
FIRST_BEFORE = 16
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
