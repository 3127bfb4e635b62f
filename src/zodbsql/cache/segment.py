"""An insertion-ordered dict whose oldest entry is cheap to find: one segment of the
state cache's LRU.

A plain ``dict`` keeps insertion order, so it can be an LRU queue (a hit moves its key
to the newest end by popping and setting it again) at ~55 bytes an entry less than an
``OrderedDict``, which adds a linked-list node and a second index for every key.  What
a plain dict does badly is give up its oldest key: ``next(iter(d))`` walks from the
start of its entry table over every slot a deletion left empty, and deletions at the
old end are exactly what an LRU makes, so each eviction would scan all the earlier
ones until the next resize (measured: a second pass at half the speed of the first).

So the segment reads its oldest keys a batch at a time (one walk over those empty slots
for ``BATCH`` evictions) and hands them out from that batch.  A key in the batch is
stale once it left the segment; if it came back it is at the newest end, so ``push``
strikes it from the batch.  Every insertion goes through ``push`` (or ``push_many``),
never ``segment[key] = value``, or the batch would hand out a key that is no longer old.

The segment also keeps the size of its entry table (``table_bytes``), read with
``sys.getsizeof`` after each insertion (after each batch of them, ``push_many``): a
dict's table changes only when an insertion resizes it (deletions never shrink it), and
the state cache reads the sum of its tables on every access, where measuring all of them
each time took a third of a cache hit.

The segment holds its dict (``entries``) rather than being one.  CPython's collector
leaves alone a plain dict whose keys and values hold no references (ints and bytes
here), but walks every entry of a dict subclass at each full collection: a cache of
200,000 states in a subclass added 7 ms to every ``gc.collect()`` (4 ms without it),
and a process that commits or reads a lot runs one every few transactions.  Readers
on the hot path use ``entries`` directly, and may remove from it (a removed key left in
the batch is stale, as after ``del``); insertions go through the segment.
"""
from __future__ import annotations

import sys
from itertools import islice
from typing import Callable, ItemsView, Iterator, ValuesView

#: How many of the oldest keys one walk over the entry table reads, at most.
BATCH = 256


class Segment:
    __slots__ = ("entries", "_next", "_batch", "_batch_bytes", "table_bytes")

    def __init__(self, batch: int = BATCH) -> None:
        #: The segment's states by key, oldest first.  Read it and remove from it
        #: freely (the batch drops a removed key as stale); insert only through ``push``.
        self.entries: dict[int, bytes] = {}
        self.table_bytes = sys.getsizeof(self.entries)
        # The oldest keys as last read, oldest first (a dict: ordered, and a key that
        # comes back can be struck out in O(1)).
        self._next: dict[int, None] = {}
        self._batch = batch
        self._batch_bytes = sys.getsizeof(dict.fromkeys(range(batch)))

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: int) -> bool:
        return key in self.entries

    def __iter__(self) -> Iterator[int]:
        return iter(self.entries)

    def __delitem__(self, key: int) -> None:
        del self.entries[key]

    def items(self) -> ItemsView[int, bytes]:
        return self.entries.items()

    def values(self) -> ValuesView[bytes]:
        return self.entries.values()

    def pop(self, key: int) -> bytes:
        """Remove ``key`` (in the segment) and return its value, as ``ArenaSegment.pop``
        does: the state cache evicts from either kind of segment."""
        return self.entries.pop(key)

    @property
    def size_bytes(self) -> int:
        """The tables' bytes (the keys and values are the caller's to count); the
        batch counts as full, so reading a new one never adds to the count."""
        return self.table_bytes + self._batch_bytes

    def push(self, key: int, value: bytes) -> None:
        """Put ``key`` at the newest end (it must not be in the segment)."""
        if self._next:
            self._next.pop(key, None)
        entries = self.entries
        entries[key] = value
        self.table_bytes = sys.getsizeof(entries)

    def push_many(self, entries: dict[int, bytes]) -> None:
        """``push`` each of ``entries`` in their order (none in the segment), the table
        read once at the end: a commit's states come in a batch."""
        if self._next:
            pop = self._next.pop
            for key in entries:
                pop(key, None)
        self.entries.update(entries)
        self.table_bytes = sys.getsizeof(self.entries)

    def touch(self, key: int) -> bytes:
        """Move ``key`` (in the segment) to the newest end; its value."""
        value = self.entries.pop(key)
        self.push(key, value)
        return value

    def oldest(self) -> int | None:
        """The oldest key, None when the segment is empty."""
        entries = self.entries
        batch = self._next
        while True:
            for key in batch:
                if key in entries:
                    return key
                break
            else:
                if not entries:
                    return None
                self._next = batch = dict.fromkeys(islice(entries, self._batch))
                continue
            del batch[key]          # stale: it left the segment since the batch was read

    def pop_oldest(self) -> tuple[int, bytes]:
        """Remove and return the oldest entry (the segment must not be empty)."""
        key = self.oldest()
        assert key is not None
        del self._next[key]
        return key, self.entries.pop(key)

    def pop_oldest_until(self, excess: int, cost: Callable[[bytes], int]) -> int:
        """Remove the oldest entries, oldest first, until their ``cost`` adds up to
        ``excess`` or more (or none is left); what they cost.  The same entries as
        ``pop_oldest`` one at a time would remove, read in one walk: a commit's new
        revisions push out as many old ones (1,000 of them took 3 ms one at a time)."""
        return self.take_oldest_until(excess, cost)[1]

    def take_oldest_until(self, excess: float, cost: Callable[[bytes], int],
                          ) -> tuple[dict[int, bytes], int]:
        """``pop_oldest_until``, and the entries removed, oldest first."""
        entries = self.entries
        freed = 0
        gone: dict[int, bytes] = {}
        for key, value in entries.items():
            if freed >= excess:
                break
            freed += cost(value)
            gone[key] = value
        batch = self._next
        for key in gone:
            del entries[key]
            if batch:
                batch.pop(key, None)
        return gone, freed

    def clear(self) -> None:
        self.entries.clear()
        self._next = {}
        self.table_bytes = sys.getsizeof(self.entries)
