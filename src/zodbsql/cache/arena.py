"""One segment of the state cache's current states, kept compactly: the values side by
side in a log of byte chunks, found through an ``LLBTree`` of their positions.

A segment as a plain dict (``segment.Segment``) spends ~125 bytes a state besides the
value: a slot of the dict's table (its share of a table that is a third to two thirds
full), the oid's ``int`` and the value's ``bytes`` header with pymalloc's rounding.
Here a state costs its value, a 12-byte header in the log (oid, length) and its entry
in the index: an ``LLBTree`` keeps oid -> position as two C int64s in arrays of up to
120, 25 to 46 bytes an entry as measured on this machine (filled in order, in random
order, and after a million first-in first-out replacements), so ``INDEX_BYTES`` counts
48.  In 32 MB that keeps 27% more states of ~180 bytes (``scripts/cache_memory.py``).

**Order.**  The state cache's segments are first-in first-out queues (a hit marks a
state and moves nothing), so the log's order is the segment's order: ``push`` appends
at the tail, ``pop_oldest`` takes from the head.  The newest leaving (admission turned
it away) steps the tail back; a state that leaves from the middle (a poll retired it)
leaves its bytes behind as a hole, skipped when the head reaches it and counted until
then (``table_bytes``); ``trim`` writes the log again once holes are most of it.  An entry is live while the
index points at it, so a stale header is recognised by its position.

**Memory.**  The log is a deque of chunks of up to ``chunk_size`` (a value larger than
that gets a chunk of its own): ``bytes`` once closed, the tail a ``bytearray`` that grows
as states come; a chunk is dropped whole when the head leaves it.  What is allocated is
counted exactly but for two parts, the head chunk's consumed start (up to a chunk) and
the room a ``bytearray`` keeps at its end (an eighth of it): ``reserve_bytes``, which
the cache counts as fixed.  A chunk is one allocation, so giving states back
gives memory back, where freed ``bytes`` objects leave pymalloc's pools fragmented.
"""
from __future__ import annotations

import struct
import sys
from collections import deque
from typing import Iterator

from BTrees.LLBTree import LLBTree

#: oid, then the value's length.
_HEADER = struct.Struct(">qI")
_LENGTH = struct.Struct(">I")
#: A value's length and its first 8 bytes as a number (the state cache's tid).
_STAMPED = struct.Struct(">IQ")
HEADER_BYTES = _HEADER.size
#: What one entry of the ``LLBTree`` index takes at most, measured (see above).
INDEX_BYTES = 48
#: What a state costs besides its value.
ENTRY_BYTES = HEADER_BYTES + INDEX_BYTES
#: A chunk object's header and its allocator's rounding, counted high.
CHUNK_OBJECT_BYTES = 64
#: The index's tree and first bucket while it holds few entries, counted high.
EMPTY_INDEX_BYTES = 512
#: The largest oid an ``LLBTree`` key holds (a signed 64-bit integer): the state cache
#: does not keep larger ones' states as current (ZODB's storages never make such oids).
LARGEST_OID = (1 << 63) - 1
_OFFSET_BITS = 32
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
_MISSING = object()


def entry_cost(value: bytes) -> int:
    """What a state with ``value`` costs in an arena segment, its share of the index
    included."""
    return len(value) + ENTRY_BYTES


class ArenaSegment:
    """oid -> value (``bytes``), oldest first; see the module's docstring."""

    __slots__ = ("chunk_size", "_chunks", "_tail", "_first", "_head", "_index", "_dead",
                 "_live", "_count", "holds")

    def __init__(self, chunk_size: int = 1 << 16) -> None:
        self.chunk_size = chunk_size
        # Closed chunks are ``bytes`` (never written again, and a slice of one is the
        # value a reader gets, one copy); the tail is a ``bytearray`` that grows as
        # states come, so its length is always where the next one goes.
        self._tail = bytearray()
        self._chunks: deque[bytes | bytearray] = deque([self._tail])
        self._first = 0             # the serial number of ``_chunks[0]``
        self._head = 0              # the offset of the oldest entry in ``_chunks[0]``
        self._index = LLBTree()     # oid -> serial << 32 | offset
        #: ``oid in segment`` as one C call (a poll asks it of every oid it names).
        self.holds = self._index.__contains__
        self._dead = 0              # bytes of holes between head and tail
        self._live = 0              # bytes the live entries take in the log
        self._count = 0             # entries (a BTree's len() walks all its buckets)

    # -- what it costs -------------------------------------------------------------
    @property
    def table_bytes(self) -> int:
        """What the log takes beyond its live entries and the reserve: its holes and
        its chunks' object headers."""
        return self._dead + CHUNK_OBJECT_BYTES * len(self._chunks)

    @property
    def reserve_bytes(self) -> int:
        """What the log may hold besides its live entries and ``table_bytes``, at most:
        the consumed start of the head chunk (up to a chunk), the room ``bytearray``
        keeps at the tail's end (an eighth of its length and a few bytes), and the
        index's tree while it is small."""
        return self.chunk_size + self.chunk_size // 8 + 64 + EMPTY_INDEX_BYTES

    @property
    def size_bytes(self) -> int:
        return self.table_bytes + self.reserve_bytes

    # -- a mapping, oldest first ------------------------------------------------------
    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __contains__(self, oid: object) -> bool:
        return oid in self._index

    def largest(self) -> int:
        """The largest oid held (-1 when empty): a poll's new objects, numbered after
        everything read before, are told apart by it without a lookup each."""
        return self._index.maxKey() if self._count else -1

    def get(self, oid: int, default: bytes | None = None) -> bytes | None:
        position = self._index.get(oid)
        if position is None:
            return default
        chunk = self._chunks[(position >> _OFFSET_BITS) - self._first]
        offset = position & _OFFSET_MASK
        start = offset + HEADER_BYTES
        # bytes() of a slice of a closed chunk is that slice itself: one copy either way.
        return bytes(chunk[start:start + _LENGTH.unpack_from(chunk, offset + 8)[0]])

    def get_stamped(self, oid: int) -> tuple[bytes, int] | None:
        """For values that start with a big-endian 8-byte stamp (the state cache's
        ``tid + state``): the rest and the stamp, without building the whole value."""
        position = self._index.get(oid)
        if position is None:
            return None
        chunk = self._chunks[(position >> _OFFSET_BITS) - self._first]
        offset = position & _OFFSET_MASK
        length, stamp = _STAMPED.unpack_from(chunk, offset + 8)
        start = offset + HEADER_BYTES + 8
        return bytes(chunk[start:start + length - 8]), stamp

    def __getitem__(self, oid: int) -> bytes:
        value = self.get(oid)
        if value is None:
            raise KeyError(oid)
        return value

    def _entries(self) -> Iterator[tuple[int, bytes | bytearray, int, int]]:
        """(oid, chunk, start and end of the value) of each live entry, oldest first."""
        index = self._index
        first = self._first
        offset = self._head
        for number, chunk in enumerate(self._chunks):
            end = len(chunk)
            while offset < end:
                oid, length = _HEADER.unpack_from(chunk, offset)
                start = offset + HEADER_BYTES
                if index.get(oid) == (first + number) << _OFFSET_BITS | offset:
                    yield oid, chunk, start, start + length
                offset = start + length
            offset = 0

    def __iter__(self) -> Iterator[int]:
        return (oid for oid, _, _, _ in self._entries())

    def items(self) -> list[tuple[int, bytes]]:
        return [(oid, bytes(chunk[start:end])) for oid, chunk, start, end in self._entries()]

    def values(self) -> list[bytes]:
        return [bytes(chunk[start:end]) for _, chunk, start, end in self._entries()]

    # -- putting in ------------------------------------------------------------------
    def push(self, oid: int, value: bytes) -> None:
        """Put ``oid`` at the newest end (it must not be in the segment)."""
        chunks = self._chunks
        tail = self._tail
        needed = HEADER_BYTES + len(value)
        if tail and len(tail) + needed > self.chunk_size:
            chunks[-1] = bytes(tail)           # closed; a value larger than a chunk
            self._tail = tail = bytearray()    # gets one of its own
            chunks.append(tail)
        offset = len(tail)
        tail += _HEADER.pack(oid, len(value))
        tail += value
        self._index[oid] = (self._first + len(chunks) - 1) << _OFFSET_BITS | offset
        self._live += needed
        self._count += 1

    def push_many(self, entries: dict[int, bytes]) -> None:
        """``push`` each of ``entries`` in their order (none in the segment): the
        positions enter the index in one ``update`` (a prefetch's batch leaving the
        window: 1.8 -> 1.2 us a state, 50 batches of 1,000)."""
        chunks = self._chunks
        tail = self._tail
        chunk_size = self.chunk_size
        header = _HEADER.pack
        positions: dict[int, int] = {}
        number = self._first + len(chunks) - 1      # the tail's serial number
        serial = number << _OFFSET_BITS
        offset = len(tail)
        # A chunk's headers and values are joined once and appended to it in one step
        # (two appends a state: 0.83 -> 0.67 ms for 1,000 states of 160 to 300 bytes).
        parts: list[bytes] = []
        for oid, value in entries.items():
            size = len(value)
            needed = HEADER_BYTES + size
            if offset and offset + needed > chunk_size:
                tail += b"".join(parts)
                parts = []
                chunks[-1] = bytes(tail)
                self._tail = tail = bytearray()
                chunks.append(tail)
                number += 1
                serial = number << _OFFSET_BITS
                offset = 0
            positions[oid] = serial | offset
            parts.append(header(oid, size))
            parts.append(value)
            offset += needed
        tail += b"".join(parts)
        self._index.update(positions)
        self._live += HEADER_BYTES * len(entries) + sum(map(len, entries.values()))
        self._count += len(positions)

    def push_behind(self, entries: list[tuple[int, bytes]] | tuple[tuple[int, bytes], ...]
                    ) -> None:
        """Put ``entries`` (oldest last, none in the segment) at the oldest end, behind
        every state already here: the log is written again, once per call."""
        behind = list(entries)
        behind.reverse()
        ahead = self.items()
        self.clear()
        for oid, value in behind:
            self.push(oid, value)
        for oid, value in ahead:
            self.push(oid, value)

    # -- taking out ------------------------------------------------------------------
    def pop(self, oid: int, default: object = _MISSING) -> bytes:
        position = self._index.pop(oid, None) if oid <= LARGEST_OID else None
        if position is None:
            if default is _MISSING:
                raise KeyError(oid)
            return default  # type: ignore[return-value]
        chunks = self._chunks
        number = (position >> _OFFSET_BITS) - self._first
        offset = position & _OFFSET_MASK
        chunk = chunks[number]
        start = offset + HEADER_BYTES
        end = start + _LENGTH.unpack_from(chunk, offset + 8)[0]
        value = bytes(chunk[start:end])
        self._live -= end - offset
        self._count -= 1
        if not self._count:
            self.clear()                        # the last one: the chunks go
        elif number == 0 and offset == self._head:
            self._head = end
            self._drop_spent()
        elif number == len(chunks) - 1 and end == len(chunk):
            del self._tail[offset:]             # the newest: the tail steps back over it
        else:
            self._dead += end - offset          # a hole, until the head reaches it
        return value

    def __delitem__(self, oid: int) -> None:
        self.pop(oid)

    def touch(self, oid: int) -> bytes:
        """Move ``oid`` (in the segment) to the newest end; its value."""
        value = self.pop(oid)
        self.push(oid, value)
        return value

    def _drop_spent(self) -> None:
        """Move the head past holes and out of the chunks it has finished, which go:
        the head is always a live entry (or the segment is empty)."""
        chunks = self._chunks
        index = self._index
        while True:
            chunk = chunks[0]
            head = self._head
            if head < len(chunk):
                oid, length = _HEADER.unpack_from(chunk, head)
                if index.get(oid) == self._first << _OFFSET_BITS | head:
                    return                      # a live entry: the oldest
                self._dead -= HEADER_BYTES + length
                self._head = head + HEADER_BYTES + length
            elif len(chunks) == 1:
                return
            else:
                chunks.popleft()
                self._first += 1
                self._head = 0

    def oldest(self) -> int | None:
        """The oldest oid, None when the segment is empty."""
        if not self._count:
            return None
        return int(_HEADER.unpack_from(self._chunks[0], self._head)[0])

    def pop_oldest(self) -> tuple[int, bytes]:
        """Remove and return the oldest entry (the segment must not be empty)."""
        chunk = self._chunks[0]
        head = self._head
        oid, length = _HEADER.unpack_from(chunk, head)
        del self._index[oid]
        start = head + HEADER_BYTES
        value = bytes(chunk[start:start + length])
        self._live -= HEADER_BYTES + length
        self._count -= 1
        if self._count:
            self._head = start + length
            self._drop_spent()          # a chunk left behind is given back at once
        else:
            self.clear()
        return oid, value

    def trim(self) -> None:
        """Write the log again when holes are most of it."""
        if self._dead > self._live + self.chunk_size:
            kept = self.items()
            self.clear()
            for oid, value in kept:
                self.push(oid, value)

    def clear(self) -> None:
        self._chunks.clear()
        self._tail = bytearray()
        self._chunks.append(self._tail)
        self._first = 0
        self._head = 0
        self._index.clear()
        self._dead = self._live = self._count = 0
