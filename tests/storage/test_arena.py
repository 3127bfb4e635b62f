"""The state cache's compact segments (``cache/arena.py``): states side by side in a log
of chunks, found through an ``LLBTree``; compared with an insertion-ordered dict, and
what they take in memory against what they count."""
from __future__ import annotations

import sys

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from zodbsql.cache.arena import (CHUNK_OBJECT_BYTES, ENTRY_BYTES, HEADER_BYTES, LARGEST_OID,
                                 ArenaSegment, entry_cost)


def allocated(segment: ArenaSegment) -> int:
    return sum(sys.getsizeof(chunk) for chunk in segment._chunks)


def live_bytes(segment: ArenaSegment) -> int:
    return sum(HEADER_BYTES + len(value) for value in segment.values())


def assert_memory_adds_up(segment: ArenaSegment) -> None:
    """The chunks hold the live entries and the holes counted, and at most the
    reserve more; the chunk objects are counted in ``table_bytes``."""
    live = live_bytes(segment)
    assert segment._live == live
    chunks = allocated(segment)
    assert live + segment._dead <= chunks
    assert chunks <= live + segment.table_bytes + segment.reserve_bytes
    assert segment.table_bytes == segment._dead + CHUNK_OBJECT_BYTES * len(segment._chunks)
    assert segment._head <= segment.chunk_size


def filled(count: int, size: int = 20, chunk: int = 256) -> ArenaSegment:
    segment = ArenaSegment(chunk)
    for oid in range(1, count + 1):
        segment.push(oid, oid.to_bytes(8, "big") + bytes([oid % 256]) * size)
    return segment


def test_a_state_costs_its_value_a_header_and_an_index_entry() -> None:
    assert HEADER_BYTES == 12 and ENTRY_BYTES == 60
    assert entry_cost(b"x" * 100) == 160


def test_values_come_back_whole_and_split_at_their_stamp() -> None:
    segment = filled(50)
    assert len(segment) == 50 and 7 in segment and 51 not in segment
    assert segment.get(7) == (7).to_bytes(8, "big") + bytes([7]) * 20
    assert segment.get_stamped(7) == (bytes([7]) * 20, 7)
    assert segment.get(51) is None and segment.get_stamped(51) is None
    assert segment.holds(7) and not segment.holds(51)
    assert len(segment._chunks) > 5          # most of them closed, as bytes
    assert all(type(chunk) is bytes for chunk in list(segment._chunks)[:-1])
    assert type(segment._chunks[-1]) is bytearray


def test_the_oldest_leave_first_and_their_chunks_go_with_them() -> None:
    segment = filled(50)
    chunks = len(segment._chunks)
    per_chunk = 256 // (HEADER_BYTES + 28)      # 6 entries of 40 bytes in 256
    for oid in range(1, per_chunk + 1):
        assert segment.oldest() == oid
        assert segment.pop_oldest() == (oid, oid.to_bytes(8, "big") + bytes([oid]) * 20)
    assert len(segment._chunks) == chunks - 1  # the first chunk given back at once
    assert segment._head == 0 and segment.oldest() == per_chunk + 1
    assert_memory_adds_up(segment)


def test_a_hole_is_counted_until_the_head_passes_it() -> None:
    segment = filled(10, chunk=1024)
    before = segment.table_bytes
    assert segment.pop(3) == (3).to_bytes(8, "big") + bytes([3]) * 20
    assert segment.table_bytes == before + HEADER_BYTES + 28
    assert list(segment) == [1, 2, 4, 5, 6, 7, 8, 9, 10]
    assert segment.pop_oldest()[0] == 1
    assert segment.table_bytes == before + HEADER_BYTES + 28
    assert segment.pop_oldest()[0] == 2            # the head passes the hole
    assert segment.table_bytes == before and segment.oldest() == 4
    assert_memory_adds_up(segment)


def test_the_newest_leaves_without_a_hole() -> None:
    segment = filled(10, chunk=1024)
    tail = len(segment._chunks[-1])
    before = segment.table_bytes
    segment.pop(10)
    assert len(segment._chunks[-1]) == tail - HEADER_BYTES - 28
    assert segment.table_bytes == before
    segment.push(11, b"eleven..")
    assert list(segment) == [*range(1, 10), 11] and segment.get(11) == b"eleven.."
    assert_memory_adds_up(segment)


def test_the_largest_oid_a_key_holds_and_one_beyond() -> None:
    segment = filled(2)
    segment.push(LARGEST_OID, b"largest")
    assert segment.get(LARGEST_OID) == b"largest"
    assert segment.pop(LARGEST_OID) == b"largest"
    assert segment.pop(LARGEST_OID + 1, None) is None     # asked, never held
    assert LARGEST_OID + 1 not in segment and segment.get(LARGEST_OID + 1) is None
    assert list(segment) == [1, 2]


def test_a_chunk_is_filled_to_its_last_byte() -> None:
    segment = ArenaSegment(256)
    for oid in range(1, 6):
        segment.push(oid, bytes(64 - HEADER_BYTES))   # four fill 256 bytes exactly
    assert [len(chunk) for chunk in segment._chunks] == [256, 64]


def test_trim_waits_until_holes_outweigh_the_live_states_by_a_chunk() -> None:
    segment = ArenaSegment(40)                        # one 40-byte entry a chunk
    for oid in range(1, 6):
        segment.push(oid, bytes(40 - HEADER_BYTES))
    for oid in (2, 3, 4):
        segment.pop(oid)                              # holes: 120 = 80 live + 40
    segment.trim()
    assert segment._dead == 120 and len(segment._chunks) == 5
    for oid in (6, 7):
        segment.push(oid, bytes(40 - HEADER_BYTES))
    segment.pop(5)
    segment.pop(6)                                    # 200 against 80 + 40
    segment.trim()
    assert segment._dead == 0 and list(segment) == [1, 7]
    assert [len(chunk) for chunk in segment._chunks] == [40, 40]


def test_a_value_larger_than_a_chunk_gets_one_of_its_own() -> None:
    segment = filled(3, chunk=256)
    large = bytes(range(256)) * 4
    segment.push(99, large)
    segment.push(100, b"after it")
    assert [len(chunk) for chunk in segment._chunks][-2:] == [HEADER_BYTES + 1024,
                                                              HEADER_BYTES + 8]
    assert segment.get(99) == large and segment.get(100) == b"after it"
    assert_memory_adds_up(segment)


def test_the_last_state_out_gives_every_chunk_back() -> None:
    segment = filled(40)
    for oid in [*range(1, 41, 2), *range(40, 0, -2)]:   # head, middle, tail
        segment.pop(oid)
    assert not segment and len(segment) == 0 and segment.oldest() is None
    assert len(segment._chunks) == 1 and not segment._chunks[0]
    assert segment.table_bytes == CHUNK_OBJECT_BYTES and segment._dead == 0


def test_trim_writes_the_log_again_once_holes_are_most_of_it() -> None:
    segment = filled(60, chunk=256)
    for oid in range(2, 58):
        segment.pop(oid)                          # holes between 1 and 58
    assert segment._dead > segment._live + segment.chunk_size
    segment.trim()
    assert segment._dead == 0 and list(segment) == [1, 58, 59, 60]
    assert segment.get(58) == (58).to_bytes(8, "big") + bytes([58]) * 20
    assert_memory_adds_up(segment)
    live = segment._live
    segment.pop(59)
    segment.trim()                                # too few holes: left as it is
    assert segment._dead == HEADER_BYTES + 28 and segment._live == live - 40


def test_push_behind_puts_states_at_the_oldest_end_the_last_oldest() -> None:
    segment = filled(3)
    segment.push_behind([(10, b"ten"), (11, b"eleven")])
    assert list(segment) == [11, 10, 1, 2, 3]
    assert [segment.pop_oldest()[0] for _ in range(5)] == [11, 10, 1, 2, 3]


def test_touch_moves_a_state_to_the_newest_end() -> None:
    segment = filled(5)
    assert segment.touch(2) == (2).to_bytes(8, "big") + bytes([2]) * 20
    assert list(segment) == [1, 3, 4, 5, 2]
    assert segment.items()[-1] == (2, (2).to_bytes(8, "big") + bytes([2]) * 20)


def test_clear_and_a_missing_key() -> None:
    segment = filled(5)
    assert segment.pop(9, None) is None
    with pytest.raises(KeyError) as popped:
        segment.pop(9)
    assert popped.value.args == (9,)
    with pytest.raises(KeyError) as got:
        segment[9]
    assert got.value.args == (9,)
    del segment[1]
    assert segment[2] == segment.get(2)
    segment.clear()
    assert not segment and list(segment) == [] and segment.get(2) is None
    segment.push(2, b"two")
    assert segment.get(2) == b"two" and segment.oldest() == 2


def layout(segment: ArenaSegment) -> tuple[object, ...]:
    """Everything a segment keeps: its chunks' bytes, where each oid is, its counts."""
    return ([bytes(chunk) for chunk in segment._chunks], list(segment._index.items()),
            segment._first, segment._head, segment._live, segment._dead, segment._count)


@pytest.mark.parametrize("sizes", [
    [100, 100, 100],            # the second closes the first chunk, the third the second
    [0, 256, 0],                # a value as large as a chunk gets a chunk of its own
    [100, 116, 0],              # (none before) the tail filled exactly, then the next
    [100, 117],                 # ... one byte over
    [300, 300],                 # two values larger than a chunk in a row
    [10] * 40,                  # many rollovers in one batch
])
@pytest.mark.parametrize("before", [0, 1, 7])
def test_push_many_leaves_the_log_push_would(sizes: list[int], before: int) -> None:
    # Twin segments: one fed state by state, the other in one batch after the same
    # states before it; a chunk's rollover must fall at the same entry in both, and
    # each position name the serial number of the chunk it is in.
    one_by_one, batched = ArenaSegment(256), ArenaSegment(256)
    for oid in range(1, before + 1):
        for segment in (one_by_one, batched):
            segment.push(oid, bytes([oid]) * 30)
    entries = {100 + i: i.to_bytes(8, "big") + bytes([i]) * size
               for i, size in enumerate(sizes)}
    for oid, value in entries.items():
        one_by_one.push(oid, value)
    batched.push_many(entries)
    assert layout(batched) == layout(one_by_one)
    for oid, value in entries.items():
        assert batched.get(oid) == value
    assert_memory_adds_up(batched)
    # After the oldest chunks went (their serial numbers no longer start at 0).
    while batched._first == 0 and batched:
        batched.pop_oldest()
        one_by_one.pop_oldest()
    more = {500 + i: bytes([i]) * 120 for i in range(5)}
    for oid, value in more.items():
        one_by_one.push(oid, value)
    batched.push_many(more)
    assert layout(batched) == layout(one_by_one)
    assert [batched.get(oid) for oid in more] == list(more.values())


class LogAgainstDict(RuleBasedStateMachine):
    """Every operation the state cache uses, on a segment and on a dict (whose order
    is insertion order), the two compared after each; and the memory counted against
    the chunks held."""

    def __init__(self) -> None:
        super().__init__()
        self.segment = ArenaSegment(128)
        self.model: dict[int, bytes] = {}
        self.next_oid = 1

    @rule(size=st.sampled_from([0, 1, 8, 30, 100, 300]), stamp=st.integers(0, 2**64 - 1))
    def push(self, size: int, stamp: int) -> None:
        value = stamp.to_bytes(8, "big") + bytes([self.next_oid % 256]) * size
        self.segment.push(self.next_oid, value)
        self.model[self.next_oid] = value
        self.next_oid += 1

    @rule(sizes=st.lists(st.sampled_from([0, 1, 30, 100, 300]), max_size=6))
    def push_many(self, sizes: list[int]) -> None:
        entries = {self.next_oid + i: bytes(8) + bytes([i + 1]) * size
                   for i, size in enumerate(sizes)}
        self.next_oid += len(sizes)
        self.segment.push_many(entries)
        self.model.update(entries)

    @precondition(lambda self: self.model)
    @rule()
    def pop_oldest(self) -> None:
        oldest = next(iter(self.model))
        assert self.segment.oldest() == oldest
        assert self.segment.pop_oldest() == (oldest, self.model.pop(oldest))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def pop_any(self, data: st.DataObject) -> None:
        oid = data.draw(st.sampled_from(sorted(self.model)))
        assert self.segment.pop(oid) == self.model.pop(oid)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def touch(self, data: st.DataObject) -> None:
        oid = data.draw(st.sampled_from(sorted(self.model)))
        value = self.model.pop(oid)
        self.model[oid] = value
        assert self.segment.touch(oid) == value

    @rule(count=st.integers(0, 3))
    def push_behind(self, count: int) -> None:
        entries = [(self.next_oid + i, bytes(8 + i)) for i in range(count)]
        self.next_oid += count
        self.segment.push_behind(entries)
        self.model = {**dict(reversed(entries)), **self.model}

    @rule()
    def trim(self) -> None:
        self.segment.trim()

    @rule(oid=st.integers(0, 60))
    def get(self, oid: int) -> None:
        value = self.model.get(oid)
        assert self.segment.get(oid) == value
        assert (oid in self.segment) == (value is not None)
        stamped = self.segment.get_stamped(oid)
        assert stamped == (None if value is None
                           else (value[8:], int.from_bytes(value[:8], "big")))

    @invariant()
    def the_same(self) -> None:
        assert len(self.segment) == len(self.model)
        assert bool(self.segment) == bool(self.model)
        assert self.segment.items() == list(self.model.items())
        assert_memory_adds_up(self.segment)


LogAgainstDict.TestCase.settings = settings(max_examples=150, stateful_step_count=60,
                                            deadline=None)
test_the_log_behaves_as_an_ordered_dict = LogAgainstDict.TestCase
