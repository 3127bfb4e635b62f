"""StateCache's finer rules, each pinned by a test that mutation testing showed missing:
the allocator's block sizes, the sketch's width and when it halves, the restore paths
(``cover``, ``adopt``, ``shared_key``, ``current_states``), what ``put_revision`` and
``put_loaded`` keep and where, protected's share, eviction with a newcomer, and a count
that follows the index and both segments as tracemalloc does.
"""
from __future__ import annotations

import sys
import tracemalloc

from zodbsql.cache.arena import ENTRY_BYTES, INDEX_BYTES, LARGEST_OID, entry_cost
from zodbsql.cache.statecache import (PROMOTION_RUN, SKETCH_START, FrequencySketch,
                                      StateCache, allocated, state_cost, state_costs)

from .test_statecache import STATE, assert_counts_add_up, promote_asked


def started(limit: int = 100_000, at: int = 10) -> StateCache:
    cache = StateCache(limit)
    cache.after_poll(at, at, [])                  # the first poll: base = polled = at
    return cache


def value(tid: int, state: bytes) -> bytes:
    """A state as the cache keeps it: tid (8 bytes, big-endian) and pickle."""
    return tid.to_bytes(8, "big") + state


def current_oids(cache: StateCache) -> list[int]:
    return [oid for oid, _ in cache.current_states()[1]]


# -- the allocator's blocks and the sketch -------------------------------------------------------------

def test_allocated_rounds_as_pymalloc_and_the_c_allocator_do() -> None:
    # pymalloc: 16-byte blocks up to 512 bytes; above, the C allocator's 16-byte
    # header, rounded up to 16.
    assert [allocated(n) for n in (1, 15, 16, 17, 511, 512)] == [16, 16, 16, 32, 512, 512]
    assert [allocated(n) for n in (513, 528, 600, 1024)] == [544, 544, 624, 1040]


def test_a_state_costs_what_the_allocator_gives_its_bytes_object() -> None:
    # state_cost computes from the length what allocated(sys.getsizeof(...)) says, on
    # both sides of every 16-byte step and of pymalloc's 512-byte limit.
    for length in range(0, 1100):
        state = b"x" * length
        assert state_cost(state) == allocated(sys.getsizeof(state)), length


def test_state_costs_is_state_cost_of_each() -> None:
    states = [b"x" * length for length in range(0, 1100, 7)] + [b"", b"x" * 479, b"x" * 480]
    assert state_costs(states) == [state_cost(state) for state in states]
    assert state_costs([]) == []


def counted_by_hand(bits: int, oids: list[int]) -> tuple[list[list[int]], int]:
    """A 4-bit count-min sketch of two rows with conservative update, halved every
    ``10 x width`` additions: the rows and the additions since the last halving."""
    width, mask, samples = 1 << bits, (1 << 64) - 1, 0
    rows = [[0] * width, [0] * width]
    for oid in oids:
        slots = [((oid * FrequencySketch._FIRST) & mask) >> (64 - bits),
                 ((oid * FrequencySketch._SECOND) & mask) >> (64 - bits)]
        low = min(rows[0][slots[0]], rows[1][slots[1]])
        for row, slot in zip(rows, slots):
            if row[slot] == low and low < 15:
                row[slot] += 1
        samples += 1
        if samples >= 10 * width:
            rows = [[count // 2 for count in row] for row in rows]
            samples //= 2
    return rows, samples


def test_add_and_add_many_count_as_the_sketch_is_meant_to_through_the_halvings() -> None:
    """One at a time or a batch at once: the same counters, the same halvings (64
    counters a row halve at 640 additions) and what is left toward the next."""
    oids = [42] * 30 + [oid % 97 * 7919 for oid in range(1570)]   # 42 reaches 15
    one, many = FrequencySketch(64), FrequencySketch(64)
    for oid in oids[:100]:
        one.add(oid)
    many.add_many(oids[:100])
    rows, samples = counted_by_hand(6, oids[:100])
    assert [list(row) for row in one.rows] == [list(row) for row in many.rows] == rows
    assert max(max(row) for row in rows) == 15 and samples == 100
    for oid in oids[100:]:
        one.add(oid)
    many.add_many(oids[100:])
    rows, samples = counted_by_hand(6, oids)
    assert [list(row) for row in one.rows] == [list(row) for row in many.rows] == rows
    # Halved at the 640th addition (to 320), then every 320 more: 960, 1,280, 1,600.
    assert one.samples == many.samples == samples == 320
    many.add_many([])
    assert many.samples == samples


def test_mark_many_marks_as_mark_does() -> None:
    one, many = FrequencySketch(64), FrequencySketch(64)
    oids = [oid * 104729 for oid in range(40)]
    for oid in oids:
        one.mark(oid)
    many.mark_many(oids)
    assert many.marks == one.marks and any(many.marks)


def test_hits_noted_where_some_left_the_cache_take_the_loop_that_puts_them_back() -> None:
    """``note_hits``'s bulk count serves batches all still held; one with a state the
    cache let go counts, marks and puts back as state by state."""
    plain, told = started(limit=64 * 1024), started(limit=64 * 1024)
    for cache in (plain, told):
        for oid in range(400):
            cache.put_loaded(oid, 5, STATE, snapshot=10)
    gone = [oid for oid in range(400) if not told.has(oid, 10)][:5]
    held = [oid for oid in range(400) if told.has(oid, 10)][::7]
    assert gone and len(held) > 10
    rows = [(oid, 5, STATE) for oid in held[:5] + gone + held[5:]]
    told.note_hits(rows, 10, told.epoch)
    for oid, tid, state in rows:
        if plain.get(oid, 10) is None:
            plain.put_loaded(oid, tid, state, snapshot=10)
    assert told.hits == len(rows)
    assert told._sketch.rows == plain._sketch.rows and told._sketch.marks == plain._sketch.marks
    assert current_oids(told) == current_oids(plain)


def test_hits_on_protected_move_nothing_and_keep_its_table() -> None:
    # An LRU moves a hit to the newest end: a dict appends it to its entry table and,
    # once that is full of the slots hits left behind, resizes to three slots per live
    # entry.  Protected marks a hit instead (CLOCK): its order and its table stay, and
    # the cache stays within its bound.
    cache = started(limit=600_000)
    states = [(oid, 5, STATE * 3) for oid in range(1, 5000)]
    cache.put_loaded_many(states, 10)
    kept = [oid for oid in range(1, 5000) if cache.has(oid, 10)]
    for oid in kept:
        cache.get(oid, 10)                        # marked
    promote_asked(cache)                          # to protected
    protected = list(cache._protected)
    assert len(protected) > 100
    table = cache._protected.table_bytes
    for round in range(20):
        for oid in reversed(protected):
            assert cache.get(oid, 10) == (STATE * 3, 5)
        assert list(cache._protected) == protected
        assert cache._protected.table_bytes == table
        assert cache.bytes_used <= cache.limit
    assert_counts_add_up(cache)


def test_a_hit_on_protected_is_a_second_chance_against_demotion() -> None:
    """Protected over its share demotes its oldest state unless that one was asked for
    since it came in: then it goes to protected's newest end, its mark taken, and the
    next oldest goes (a state asked for once more is kept once more)."""
    limit = 1_000_000
    cache = started(limit=limit)
    size = 190_000                   # four fit protected's 80%, a fifth does not
    for oid in (1, 2, 3, 4, 5):
        cache.put_loaded(oid, 9, bytes(size), snapshot=10)
    for oid in (1, 2, 3, 4):
        assert cache.get(oid, 10) is not None
    promote_asked(cache)                          # protected holds 1 to 4
    assert list(cache._protected) == [1, 2, 3, 4]
    assert cache.get(1, 10) is not None           # marked, not moved
    assert list(cache._protected) == [1, 2, 3, 4]

    def ask_and_promote(oid: int) -> None:
        assert cache.get(oid, 10) is not None
        promote_asked(cache)
    ask_and_promote(5)                            # protected is over: one must go
    assert list(cache._protected) == [3, 4, 5, 1]
    assert list(cache._probation) == [2]          # the oldest one not asked for again
    assert cache.get(3, 10) is not None           # marked
    ask_and_promote(2)                            # 3 is kept, 4 goes
    assert list(cache._protected) == [5, 1, 2, 3]
    assert list(cache._probation) == [4]
    ask_and_promote(4)                            # 5 was not asked for in protected
    assert list(cache._protected) == [1, 2, 3, 4]
    ask_and_promote(5)                            # 1's mark was taken: it goes now
    assert list(cache._protected) == [2, 3, 4, 5]
    assert list(cache._probation) == [1]
    assert cache._protected_bytes <= 0.8 * limit
    assert_counts_add_up(cache)


def test_an_eviction_promotes_the_states_asked_for_before_the_victim() -> None:
    """A hit on probation only marks: the state moves to protected when it comes up for
    eviction, and the victim is the oldest state nobody asked for."""
    cache = started(limit=100_000)
    cache._admission = False                      # the victim goes, whatever its count
    oid = 0
    while len(cache) == oid:                      # until the cache is full
        oid += 1
        cache.put_loaded(oid, 5, STATE, snapshot=10)
    order = list(cache._probation)
    for asked in order[:2] + order[3:5]:
        assert cache.get(asked, 10) is not None
    assert list(cache._probation) == order and not cache._protected
    asked_for = order[:2] + order[3:5]
    while order[2] in cache._probation:           # until the next eviction
        oid += 1
        cache.put_loaded(oid, 5, STATE, snapshot=10)
    # Promoted on the way to the victim (and maybe, for the room the promotions took,
    # the next two asked for).
    assert list(cache._protected)[:2] == order[:2]
    assert order[2] not in cache._probation       # evicted
    assert all(cache.has(state, 10) for state in asked_for)
    gone = set(order) - set(cache._probation) - set(cache._protected)
    assert order[2] in gone and not gone & set(asked_for)
    assert cache.bytes_used <= cache.limit
    assert_counts_add_up(cache)


def test_the_sketch_has_a_counter_per_entry_rounded_up_to_a_power_of_two() -> None:
    assert [FrequencySketch(n).bits for n in (0, 1, 64, 65, 128, 129, 1000)] == [
        6, 6, 6, 7, 7, 8, 10]
    assert all(len(row) == 1 << 8 for row in FrequencySketch(129).rows)
    # The cache sizes its sketch at one counter per 128 bytes of limit.
    assert StateCache(128 * 129)._sketch.bits == 8
    assert StateCache(128 * 128)._sketch.bits == 7


def test_a_large_caches_sketch_starts_narrow_and_grows_to_its_width_as_states_come() -> None:
    """A fresh process's first loads wrote a full sketch's pages (1 MB at 64 MB):
    page faults.  It starts at SKETCH_START counters and grows as the states outnumber
    them, to one counter per 128 bytes of limit, never past it."""
    assert StateCache(64 << 20)._sketch.bits == SKETCH_START.bit_length() - 1
    assert StateCache(4 << 20)._sketch.bits == 15                 # its full width
    cache = started(limit=48 << 20)                                # 393,216 counters
    before = cache.bytes_used
    state = bytes(20)
    for oid in range(SKETCH_START):
        cache.put_loaded(oid, 9, state, snapshot=10)
    assert cache._sketch.bits == 16                                # not outnumbered yet
    cache.put_loaded(SKETCH_START, 9, state, snapshot=10)
    assert cache._sketch.bits == 18                                # twice the states
    assert cache.bytes_used - before > 2 * (1 << 18) - 2 * (1 << 16)
    for oid in range(SKETCH_START + 1, 300_000):
        cache.put_loaded(oid, 9, state, snapshot=10)
    assert cache._sketch.bits == 19                                # capped at its width
    assert cache.bytes_used <= cache.limit
    assert_counts_add_up(cache)


def test_a_sketch_that_grows_keeps_every_count() -> None:
    sketch = FrequencySketch(64)
    for oid in range(200):
        for _ in range(oid % 7):
            sketch.add(oid)
    counts = [sketch.count(oid) for oid in range(200)]
    sketch.grow(1000)
    assert sketch.bits == 10 and all(len(row) == 1024 for row in sketch.rows)
    assert sketch.period == 10 * 1024
    # Each old counter's value is in both counters that split it: every oid reads
    # exactly what it read before.
    assert [sketch.count(oid) for oid in range(200)] == counts
    sketch.grow(10)                                                # never narrower
    assert sketch.bits == 10
    sketch.grow(1024)                                              # 1,024 counters fit
    assert sketch.bits == 10
    sketch.grow(1025)
    assert sketch.bits == 11


def test_the_sketch_grows_with_the_states_of_every_segment() -> None:
    """Protected states count toward the sketch's width as much as new ones."""
    cache = started(limit=48 << 20)
    state = bytes(20)
    held = 40_000
    for oid in range(held):
        cache.put_loaded(oid, 9, state, snapshot=10)
    for oid in range(held):
        assert cache.get(oid, 10) is not None                      # asked again
    promote_asked(cache)                                           # to protected
    assert len(cache._protected) > 0.75 * held
    assert cache._sketch.bits == 16
    for oid in range(held, SKETCH_START + 1000):
        cache.put_loaded(oid, 9, state, snapshot=10)
    assert cache._sketch.bits == 18


def test_the_sketch_spreads_over_the_whole_row() -> None:
    sketch = FrequencySketch(64)
    for oid in range(300):                        # fewer than the 640 that halve
        sketch.add(oid)
    for row in sketch.rows:
        assert any(row[32:]), "the upper half of a row is never used"
        assert any(row[:32])


def test_the_sketch_counts_each_access_once_toward_its_halving() -> None:
    sketch = FrequencySketch(64)                  # halved at 640 accesses, not before
    for _ in range(20):
        sketch.add(7)
    for oid in range(1000, 1300):                 # 320 accesses in all
        sketch.add(oid)
    assert sketch.count(7) == 15
    assert sketch.samples == 320


def test_the_sketch_halves_after_exactly_ten_times_its_width_and_again_after_half() -> None:
    sketch = FrequencySketch(64)                  # width 64: halved at 640 accesses
    for _ in range(639):
        sketch.add(7)
    assert sketch.count(7) == 15
    sketch.add(7)                                 # the 640th
    assert sketch.count(7) == 7
    assert sketch.samples == 320
    for _ in range(319):                          # up to 15 again, not halved yet
        sketch.add(7)
    assert sketch.count(7) == 15
    sketch.add(7)                                 # 320 more: halved again
    assert sketch.count(7) == 7
    assert sketch.samples == 320


# -- cover: a poll from the persistent or shared cache ---------------------------------------------

def test_cover_is_refused_by_a_disabled_cache_and_across_a_gap() -> None:
    assert StateCache(0).cover(0, 10, []) is False
    cache = started(at=10)
    assert cache.cover(11, 20, []) is False       # starts after polled: a gap
    assert cache.cover(10, 20, []) is True        # starts at polled: no gap
    assert (cache.base, cache.polled) == (10, 20)
    assert cache.cover(0, 9, []) is False         # ends before base: a gap
    assert cache.cover(0, 10, []) is True         # ends at base
    assert (cache.base, cache.polled) == (0, 20)


def test_cover_after_a_first_poll_at_tid_zero_still_sees_a_gap() -> None:
    cache = started(at=0)                         # an empty database polled: tid 0
    cache.put_loaded(1, 0, b"at zero", snapshot=0)
    assert cache.cover(5, 10, []) is False
    assert cache.cover(0, 10, [(2, 7)]) is True
    assert cache.get(1, 10) == (b"at zero", 0)    # kept: the cover did not start afresh
    assert (cache.base, cache.polled) == (0, 10)


def test_cover_takes_up_to_the_index_bound_and_no_more() -> None:
    cache = started(limit=100_000, at=10)         # the index holds 1000 oids at least
    assert cache._max_index == 1000
    assert cache.cover(10, 20, [(n, 15) for n in range(1001)]) is False
    assert cache._changed == {}
    assert cache.cover(10, 20, [(n, 15) for n in range(1000)]) is True
    assert len(cache._changed) == 1000


def test_cover_keeps_the_newest_change_an_older_poll_names() -> None:
    cache = started(at=0)
    cache.put_revision(7, 5, b"seven at 5")
    cache.after_poll(0, 10, [(7, 9)])             # 7 changed at 9
    # A poll over (2, 6] that a restored cache made names 7 at 5: older news.
    assert cache.cover(2, 6, [(7, 5)]) is True
    assert cache.get(7, 10) is None               # 9 is current, and not cached
    assert cache.get_revision(7, 5) == b"seven at 5"


def test_cover_records_a_change_at_tid_one() -> None:
    cache = started(at=0)
    assert cache.cover(0, 1, [(3, 1)]) is True
    cache.put_revision(3, 1, b"three at 1")       # named by the poll: current
    assert cache.get(3, 1) == (b"three at 1", 1)


def test_cover_retires_a_current_state_it_names_newer() -> None:
    cache = started(at=10)
    cache.put_loaded(4, 8, b"four at 8", snapshot=10)
    assert cache.cover(10, 20, [(4, 15)]) is True
    assert 4 not in current_oids(cache)
    cache.put_loaded(4, 15, b"four at 15", snapshot=20)
    assert cache.get(4, 20) == (b"four at 15", 15)
    assert cache.get_revision(4, 8) == b"four at 8"
    assert_counts_add_up(cache)


# -- adopt: states a persistent or shared cache knew current -------------------------------------------

def test_adopt_into_a_disabled_cache_takes_nothing() -> None:
    assert StateCache(0).adopt([(1, 5, value(5, b"x"))], 5) == (0, False)


def test_adopt_keeps_what_this_process_loaded_itself_and_puts_the_rest_behind_it() -> None:
    cache = started(at=10)
    cache.put_loaded(5, 9, b"mine", snapshot=10)
    taken = cache.adopt([(5, 9, value(9, b"theirs")), (6, 9, value(9, b"six")),
                         (7, 9, value(9, b"seven"))], 10)
    assert taken == (2, True)
    assert cache.get(5, 10) == (b"mine", 9)
    # Hottest first: this process's own state, then the adopted ones (the first
    # adopted is the hottest of them, so it sits nearer the new end).
    assert current_oids(cache) == [5, 6, 7]
    assert_counts_add_up(cache)


def test_adopt_stops_when_the_cache_is_full_and_says_so() -> None:
    cache = started(limit=64 * 1024, at=10)
    entries = [(oid, 9, value(9, STATE)) for oid in range(1000)]    # far more than fit
    taken, more = cache.adopt(entries, 10)
    assert more is False
    assert 100 < taken < 1000
    assert len(cache) == taken                    # what it took, it keeps
    assert cache.bytes_used <= cache.limit
    assert all(cache.has(oid, 10) for oid in range(taken))
    assert_counts_add_up(cache)
    fits = started(limit=64 * 1024, at=10)
    assert fits.adopt(entries[:10], 10) == (10, True)


def test_adopt_takes_a_state_that_fills_the_cache_exactly_and_not_one_byte_more() -> None:
    def prepared(limit: int) -> StateCache:
        cache = started(limit=limit, at=10)
        for oid in (2, 3):
            cache.put_loaded(oid, 9, STATE, snapshot=10)
        return cache
    entry = value(9, STATE)
    measure = prepared(1 << 20)
    assert measure.adopt([(1, 9, entry)], 10) == (1, True)
    exact = measure.bytes_used                    # what the three take, tables included
    for limit, taken in ((exact, (1, True)), (exact - 1, (0, False))):
        cache = prepared(1 << 20)
        cache.limit = limit
        assert cache.adopt([(1, 9, entry)], 10) == taken
        assert len(cache) == 2 + taken[0]
        assert cache.bytes_used <= limit
        assert_counts_add_up(cache)


# -- shared_key and current_states ------------------------------------------------------------------------

def test_shared_key_names_the_tid_a_shared_cache_keeps_a_state_under() -> None:
    assert StateCache(0).shared_key(1, 10, 5) is None
    cache = started(at=0)
    assert cache.shared_key(1, 0, -1) is None     # no checkpoint
    assert cache.shared_key(1, 0, 0) == 0         # checkpoint at the base: unchanged
    cache.after_poll(0, 20, [(2, 12), (3, 8), (4, 15)])
    assert cache.shared_key(1, 20, 8) == 8        # unchanged since the checkpoint
    assert cache.shared_key(3, 20, 8) == 8        # changed at the checkpoint itself
    assert cache.shared_key(2, 20, 8) == 12       # changed after it, before the snapshot
    assert cache.shared_key(2, 12, 8) == 12       # ... at the snapshot itself
    assert cache.shared_key(4, 12, 8) is None     # changed after the snapshot
    assert cache.shared_key(1, 8, 8) == 8         # checkpoint == snapshot
    assert cache.shared_key(3, 8, 8) == 8
    assert cache.shared_key(1, 21, 8) is None     # snapshot after polled
    cache.after_poll(20, 30, [(5, 25)] * 1)
    cache._changed.clear()
    cache.base = 20                               # as an overflowing poll leaves it
    assert cache.shared_key(1, 30, 19) is None    # checkpoint before the base
    assert cache.shared_key(1, 30, 20) == 20


def test_current_states_before_a_poll_and_at_tid_zero() -> None:
    assert StateCache(100_000).current_states() == (-1, [])
    cache = started(at=0)
    cache.put_loaded(1, 0, b"one", snapshot=0)
    assert cache.current_states() == (0, [(1, value(0, b"one"))])


# -- what put_loaded and put_revision keep ------------------------------------------------------------------

def test_put_loaded_refuses_a_revision_other_than_the_one_the_index_names() -> None:
    cache = started(at=0)
    cache.after_poll(0, 10, [(1, 9)])
    cache.put_loaded(1, 5, b"one at 5", snapshot=10)     # not what 10 sees
    assert len(cache) == 0
    cache.put_loaded(1, 9, b"one at 9", snapshot=10)
    assert cache.get(1, 10) == (b"one at 9", 9)


def test_put_loaded_keeps_the_first_copy_of_a_current_state() -> None:
    cache = started(at=10)
    cache.put_loaded(1, 9, b"first", snapshot=10)
    cache.put_loaded(1, 9, b"second", snapshot=10)
    assert cache.get(1, 10) == (b"first", 9)
    cache.put_loaded(1, 9, b"third", snapshot=10)        # now in protected
    assert cache.get(1, 10) == (b"first", 9)
    assert len(cache) == 1
    assert_counts_add_up(cache)


def test_put_revision_makes_current_only_what_a_poll_named() -> None:
    cache = started(at=10)
    cache.put_revision(1, 5, b"one at 5")         # a commit's state, no poll named it
    assert cache.get(1, 10) is None
    assert current_oids(cache) == []
    assert cache.get_revision(1, 5) == b"one at 5"
    cache.after_poll(10, 20, [(2, 20)])
    cache.put_revision(2, 20, b"two at 20")       # named, at polled itself
    assert current_oids(cache) == [2]
    cache.put_revision(2, 20, b"two again")       # known already
    assert cache.get(2, 20) == (b"two at 20", 20)
    assert len(cache) == 2
    assert_counts_add_up(cache)


def test_put_revision_of_a_quarter_of_the_cache_is_kept_and_no_larger() -> None:
    limit = 100_000
    cache = started(limit=limit, at=10)
    cache.after_poll(10, 20, [(1, 20), (2, 20), (3, 20)])
    cache.put_revision(1, 20, bytes(limit // 4))          # a quarter: kept, current
    assert current_oids(cache) == [1]
    cache.put_revision(2, 20, bytes(limit // 5 + 1))      # between a fifth and a quarter
    assert 2 in current_oids(cache)
    cache.put_revision(3, 20, bytes(limit // 4 + 1))      # larger: not kept
    assert 3 not in current_oids(cache) and cache.get_revision(3, 20) is None
    plain = started(limit=limit, at=10)
    plain.put_revision(4, 5, bytes(limit // 4))           # an exact revision, a quarter
    assert plain.get_revision(4, 5) == bytes(limit // 4)
    plain.put_revision(5, 5, bytes(limit // 5 + 1))
    assert plain.get_revision(5, 5) == bytes(limit // 5 + 1)


def test_a_loaded_batch_keeps_a_state_of_a_quarter_of_the_cache_and_no_larger() -> None:
    """``put_loaded_many`` keeps a state up to a quarter of the limit, into a cache with
    room (one step) and into a full one (state by state, through admission)."""
    limit = 400_000
    roomy = started(limit=limit, at=10)
    roomy.put_loaded_many([(1, 9, bytes(limit // 4)), (2, 9, bytes(limit // 4 + 1))],
                          snapshot=10)
    assert roomy.has(1, 10) and not roomy.has(2, 10)
    full = started(limit=limit, at=10)
    oid = 100
    while full.bytes_used + 1000 < limit:
        full.put_loaded(oid, 9, bytes(500), snapshot=10)
        oid += 1
    for big in (1, 2):
        for _ in range(15):                       # asked for more than any victim
            full._sketch.add(big)
    assert not full._fits_without_eviction([(1, 9, bytes(limit // 4))])
    full.put_loaded_many([(1, 9, bytes(limit // 4)), (2, 9, bytes(limit // 4 + 1))],
                         snapshot=10)
    assert full.has(1, 10) and not full.has(2, 10)
    assert full.bytes_used <= limit
    assert_counts_add_up(full)


def test_a_revision_already_current_is_not_kept_twice() -> None:
    cache = started(at=10)
    cache.put_loaded(1, 9, b"one", snapshot=10)
    cache.put_revision(1, 9, b"one")
    assert len(cache) == 1
    assert_counts_add_up(cache)


# -- the segments -------------------------------------------------------------------------------------------

def test_the_lru_policy_serves_a_state_it_holds() -> None:
    cache = StateCache(64 * 1024)
    cache._policy_for_comparison("lru")
    cache.after_poll(1, 1, [])
    cache.put_loaded(1, 1, STATE, snapshot=1)
    assert cache.get(1, 1) == (STATE, 1)
    assert cache.get(1, 1) == (STATE, 1)


def test_protected_keeps_its_share_of_what_revisions_leave_and_demotes_its_oldest() -> None:
    """Two current states of nearly a quarter of the cache each, asked for twice, with
    exact revisions holding 38% of it: protected may take 80% of the rest, which one of
    them fits and two do not, so the one promoted first falls back to probation."""
    limit = 1_000_000
    cache = started(limit=limit, at=10)
    cache.put_revision(100, 5, bytes(190_000))
    cache.put_revision(101, 5, bytes(190_000))
    for oid, size in ((1, 249_000), (2, 248_000)):
        cache.put_loaded(oid, 9, bytes(size), snapshot=10)
        assert cache.get(oid, 10) is not None
        promote_asked(cache)                      # promoted to protected
    assert list(cache._protected) == [2]
    assert list(cache._probation) == [1]
    assert cache._protected_bytes <= 0.8 * (limit - cache._revision_bytes)
    assert len(cache) == 4                        # nothing evicted
    assert_counts_add_up(cache)


def test_protected_may_fill_its_share_exactly() -> None:
    """Eight states of 20,000 bytes each (as counted) fill protected's 80% of a
    200,000-byte cache exactly: none falls back."""
    cache = started(limit=200_000, at=10)
    state = bytes(20_000 - ENTRY_BYTES - 8)       # tid + state and its entry: 20,000
    assert entry_cost(value(9, state)) == 20_000
    for oid in range(8):
        cache.put_loaded(oid, 9, state, snapshot=10)
        assert cache.get(oid, 10) is not None
    promote_asked(cache)
    assert cache._protected_bytes == 160_000 == 0.8 * cache.limit
    assert len(cache._protected) == 8 and not cache._probation


def test_revisions_may_fill_their_share_exactly() -> None:
    cache = started(limit=20_000, at=10)
    key_bytes = allocated(sys.getsizeof(1 << 127))
    state = bytes(2000 - key_bytes - 41 - 16)     # each revision counted as 2,000 bytes
    assert allocated(sys.getsizeof(state)) + key_bytes == 2000
    for oid in range(5):
        cache.put_revision(oid, 5, state)
    assert cache._revision_bytes == 10_000 == 0.5 * cache.limit
    assert all(cache.get_revision(oid, 5) == state for oid in range(5))


def test_a_cache_filled_exactly_to_its_limit_evicts_nothing() -> None:
    cache = started(limit=64 * 1024, at=10)
    for oid in range(20):
        cache.put_loaded(oid, 9, STATE, snapshot=10)
    cache.limit = cache.bytes_used
    cache.after_poll(10, 11, [])                  # the poll checks the bound
    assert len(cache) == 20


def test_a_newcomer_that_fills_the_cache_exactly_meets_no_admission_test() -> None:
    """Leaving the window for a cache it fills to its limit exactly, a newcomer enters
    probation without the admission test (which it would lose) and nothing goes."""
    def filled() -> StateCache:
        cache = started(limit=64 * 1024, at=10)
        for oid in range(19):         # the newcomer fits the open chunk of the log
            cache.put_loaded(oid, 9, STATE, snapshot=10)
        return cache
    twin = filled()
    twin.put_loaded(100, 9, STATE, snapshot=10)
    cache = filled()
    assert cache._window_limit == 0
    cache.limit = twin.bytes_used                 # room for the newcomer and no more
    for _ in range(5):
        cache._sketch.add(0)                      # the victim, were there a test
    cache.put_loaded_many([(100, 9, STATE)], snapshot=10)
    assert cache.has(100, 10) and len(cache) == 20
    assert cache.bytes_used == cache.limit


def test_the_count_follows_what_each_table_and_entry_takes() -> None:
    """A state moving between segments costs only what their tables change by; an
    index entry costs its oid and tid objects, and the index's table what it grew by."""
    cache = started(limit=10 << 20, at=10)
    cache._window_limit = 0                       # no window: a state starts in probation
    cache.put_loaded(1, 9, STATE, snapshot=10)

    def tables() -> int:
        return (sys.getsizeof(cache._probation) + sys.getsizeof(cache._protected)
                + sys.getsizeof(cache._window.entries))
    before, tables_before = cache.bytes_used, tables()
    assert cache.get(1, 10) == (STATE, 9)
    promote_asked(cache)                          # probation -> protected
    assert list(cache._protected) == [1]
    assert cache.bytes_used - before == tables() - tables_before
    before, index_before = cache.bytes_used, sys.getsizeof(cache._changed)
    cache.after_poll(10, 20, [(1000 + n, 20) for n in range(100)])
    entry = allocated(sys.getsizeof(1 << 59)) + allocated(sys.getsizeof(1 << 62))
    assert cache.bytes_used - before == (sys.getsizeof(cache._changed) - index_before
                                         + 100 * entry)


def test_a_newcomer_that_beat_one_victim_still_faces_the_next() -> None:
    """Room for a large newcomer takes two states; it was asked for more often than the
    first victim but not than the second, so it pushes the first out and goes itself."""
    limit = 16 * 1024
    cache = started(limit=limit, at=10)
    cache._protected_share = 0.0                  # one segment: probation, in order
    filler = 4
    while cache.bytes_used + 6000 < limit:        # the warmest of all, asked for most
        for _ in range(15):
            cache._sketch.add(filler)
        cache.put_loaded(filler, 9, bytes(100), snapshot=10)
        filler += 1
    cache.put_loaded(1, 9, bytes(2000), snapshot=10)          # the first victim, cold
    cache.put_loaded(2, 9, bytes(2000), snapshot=10)          # the second, hot
    for _ in range(10):
        cache._sketch.add(2)
    for _ in range(3):
        cache._sketch.add(3)
    moved = [(oid, cache._probation.pop(oid)) for oid in (2, 1)]
    cache._probation.push_behind(moved)           # oldest first: 1, 2, the fillers
    assert len(cache) == filler - 2               # nothing evicted yet
    assert cache.limit - cache.bytes_used < 4000 - 2100   # 1 alone would not do
    cache.put_loaded(3, 9, bytes(4000), snapshot=10)          # needs both to go
    assert not cache.has(1, 10)
    assert cache.has(2, 10)
    assert not cache.has(3, 10)
    assert cache.bytes_used <= limit
    assert_counts_add_up(cache)


def test_the_count_to_beat_is_found_again_after_a_newcomer_wins() -> None:
    """A batch into a full cache: newcomers that lose admission share one victim's count,
    but one that wins evicts that victim, and the next newcomer faces the next one."""
    limit = 16 * 1024
    cache = started(limit=limit, at=10)
    cache._protected_share = 0.0                  # one segment: probation, in order
    assert cache._window_limit == 0               # every newcomer meets admission at once
    size = 2000
    first_victim, second_victim, loser, winner, next_one = 1, 2, 3, 4, 5
    cache.put_loaded(first_victim, 9, bytes(size), snapshot=10)
    cache.put_loaded(second_victim, 9, bytes(size), snapshot=10)
    filler = 100
    while cache.bytes_used + 600 < limit:          # newer than both victims
        cache.put_loaded(filler, 9, bytes(100), snapshot=10)
        filler += 1
    assert cache.limit - cache.bytes_used < size  # each newcomer needs a victim to go
    for oid, times in ((first_victim, 3), (winner, 6), (next_one, 2)):
        for _ in range(times):
            cache._sketch.add(oid)
    counts = [cache._sketch.count(oid)
              for oid in (first_victim, second_victim, loser, winner, next_one)]
    assert counts == [3, 0, 0, 6, 2]
    held = len(cache)
    cache.put_loaded_many([(oid, 9, bytes(size)) for oid in (loser, winner, next_one)],
                          snapshot=10)
    assert not cache.has(loser, 10)               # 0 against the first victim's 3
    assert cache.has(winner, 10) and not cache.has(first_victim, 10)   # 6 against 3
    # 2 against the second victim's 0: against the first's 3 it would have lost.
    assert cache.has(next_one, 10) and not cache.has(second_victim, 10)
    assert len(cache) == held
    assert cache.bytes_used <= limit
    assert_counts_add_up(cache)


def test_a_run_of_asked_states_longer_than_one_step_all_go_to_protected() -> None:
    """Lazy promotion moves the marked states before the victim in runs of at most
    ``PROMOTION_RUN``; all of them go, in their order, and the victim is the first
    state not asked for."""
    cache = started(limit=1_000_000, at=10)
    assert cache._window_limit == 0
    count = 2 * PROMOTION_RUN + 50
    for oid in range(1, count + 1):
        cache.put_loaded(oid, 9, STATE, snapshot=10)
    order = list(cache._probation)
    asked = order[:2 * PROMOTION_RUN + 10]
    for oid in asked:
        assert cache.get(oid, 10) is not None
    with cache._lock:
        victim = cache._oldest_unmarked(None)
    assert victim == order[len(asked)]
    assert list(cache._protected) == asked        # within protected's share: none back
    assert list(cache._probation) == order[len(asked):]
    assert_counts_add_up(cache)


def test_a_newcomer_level_with_the_next_victims_count_to_beat_goes() -> None:
    """As above, but the second victim was asked for just one time less than the
    newcomer (its count and the margin): the newcomer does not pass it, so it goes."""
    limit = 16 * 1024
    cache = started(limit=limit, at=10)
    cache._protected_share = 0.0
    filler = 4
    while cache.bytes_used + 6000 < limit:
        for _ in range(15):
            cache._sketch.add(filler)
        cache.put_loaded(filler, 9, bytes(100), snapshot=10)
        filler += 1
    cache.put_loaded(1, 9, bytes(2000), snapshot=10)
    cache.put_loaded(2, 9, bytes(2000), snapshot=10)
    for _ in range(2):
        cache._sketch.add(2)
    for _ in range(3):
        cache._sketch.add(3)
    assert [cache._sketch.count(oid) for oid in (1, 2, 3)] == [0, 2, 3]
    moved = [(oid, cache._probation.pop(oid)) for oid in (2, 1)]
    cache._probation.push_behind(moved)
    cache.put_loaded(3, 9, bytes(4000), snapshot=10)
    assert not cache.has(1, 10)
    assert cache.has(2, 10)
    assert not cache.has(3, 10)
    assert cache.bytes_used <= limit
    assert_counts_add_up(cache)


def test_revisions_make_room_when_no_current_state_is_left() -> None:
    """A poll naming many oids grows the index; with only exact revisions left to
    evict, as many of them go as it takes."""
    cache = started(limit=200 * 1024, at=10)
    for oid in range(600):
        cache.put_revision(oid, 5, STATE)         # up to half the cache
    assert not current_oids(cache)
    held = len(cache)
    assert cache._max_index == 1000               # a poll of 999 changes is kept
    cache.after_poll(10, 20, [(1_000_000 + n, 20) for n in range(999)])
    assert cache.bytes_used <= cache.limit
    assert len(cache) < held - 10
    assert_counts_add_up(cache)


def test_the_count_follows_both_segments_and_the_index_as_tracemalloc_does() -> None:
    """As test_the_count_is_what_python_allocates, with most states promoted to
    protected and an index of changed oids as large as its bound allows."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = StateCache(4 << 20)
        cache.after_poll(1, 1, [])
        cache.after_poll(1, 2, [(1 << 50 | n, 2) for n in range(cache._max_index)])
        for oid in range(15_000):
            key = oid + (1 << 40)
            cache.put_loaded(key, 1, bytes(190) + oid.to_bytes(4, "big"), 2)
        for oid in range(15_000):                 # asked again once out of the window
            cache.get(oid + (1 << 40), 2)
        with cache._lock:
            cache._oldest_unmarked(None)          # as an eviction: promoted up to 80%,
            cache._shrink(None)                   # the bound fitted after it as there
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(cache._protected) > 2000 and len(cache._changed) == cache._max_index
    # The segments' indexes are BTrees' C arrays, which tracemalloc does not see.
    indexes = INDEX_BYTES * (len(cache._probation) + len(cache._protected)
                             + len(cache._window))
    assert traced <= cache.bytes_used - indexes and cache.bytes_used <= cache.limit
    assert traced > 0.85 * (cache.bytes_used - indexes)
    assert sys.getsizeof(cache._changed) < cache.bytes_used


def test_a_marked_protected_state_stays_in_protected_while_probation_holds_others() -> None:
    """The second chance keeps the state in protected (at its newest end), not on
    probation behind the states waiting there."""
    cache = started(limit=1_250_000)             # protected's cap: 1,000,000 bytes
    cache._window_limit = 0                       # the states go to probation at once
    for oid in range(1, 7):
        cache.put_loaded(oid, 9, bytes(190_000), snapshot=10)
    for oid in (7, 8):
        cache.put_loaded(oid, 9, bytes(1000), snapshot=10)
    for oid in range(1, 6):
        assert cache.get(oid, 10) is not None
    promote_asked(cache)
    assert list(cache._protected) == [1, 2, 3, 4, 5]
    assert list(cache._probation) == [6, 7, 8]
    assert cache.get(1, 10) is not None           # marked in protected
    assert cache.get(6, 10) is not None           # marked on probation's head
    promote_asked(cache)                          # 6 in: one must leave protected
    assert list(cache._protected) == [3, 4, 5, 6, 1]
    assert list(cache._probation) == [7, 8, 2]
    assert_counts_add_up(cache)


def test_the_lru_comparison_policy_moves_a_hit_and_keeps_the_bound() -> None:
    """``_policy_for_comparison("lru")`` (``scripts/cache_memory.py --admission lru``,
    the policy before issue 24): one plain LRU, whose hit moves the state to the newest
    end, and the bound holds after every move (a move from the middle of the log
    leaves a hole, counted until the head reaches it)."""
    cache = started(limit=920_000)
    cache._policy_for_comparison("lru")
    cache.put_loaded_many([(oid, 5, STATE) for oid in (1, 2, 3)], 10)
    assert list(cache._probation) == [1, 2, 3]
    assert cache.get(1, 10) == (STATE, 5)
    assert list(cache._probation) == [2, 3, 1]
    cache.put_loaded_many([(oid, 5, STATE * 3) for oid in range(4, 2004)], 10)
    order = list(cache._probation)
    holes = 0
    for oid in order[1::2] + order[::2]:
        table = cache._probation.table_bytes
        cache.get(oid, 10)
        holes += cache._probation.table_bytes > table
        assert cache.bytes_used <= cache.limit
        assert cache._probation.oldest() != oid or len(cache._probation) == 1
    assert holes
    assert list(cache._probation) == [o for o in order[1::2] + order[::2]
                                      if o in cache._probation]
    assert_counts_add_up(cache)


def test_an_oid_beyond_a_signed_64_bit_key_is_served_but_not_kept_as_current() -> None:
    """The logs' index keys are signed 64-bit integers; an oid above them (an 8-byte
    oid with its top bit set) is never kept as current, and nothing fails on it."""
    huge = (1 << 64) - 1
    cache = started(limit=1 << 20)
    cache.put_loaded(huge, 5, b"huge", snapshot=10)
    cache.put_loaded_many([(huge - 1, 5, b"huge too"), (7, 5, b"seven")], 10)
    assert cache.get(huge, 10) is None and cache.get(huge - 1, 10) is None
    assert cache.get(7, 10) == (b"seven", 5)
    cache.put_revision(huge, 12, b"huge at 12")
    cache.after_poll(10, 12, [(huge, 12), (huge - 1, 12)])     # named: now current
    assert cache.get(huge, 12) == (b"huge at 12", 12)            # served once
    assert cache.get(huge, 12) is None                           # not kept
    assert cache.cover(8, 12, [(huge, 9)])
    assert cache.adopt([(huge - 2, 5, value(5, b"x"))], 12) == (0, True)
    assert_counts_add_up(cache)
    # The largest key is kept: loaded, named by a poll, restored.
    loaded = started(limit=1 << 20)
    loaded.put_loaded(LARGEST_OID, 5, b"largest", snapshot=10)
    assert loaded._holds(LARGEST_OID) and loaded.get(LARGEST_OID, 10) == (b"largest", 5)
    named = started(limit=1 << 20)
    named.put_revision(LARGEST_OID, 11, b"named")
    named.after_poll(10, 11, [(LARGEST_OID, 11)])
    assert named.get(LARGEST_OID, 11) == (b"named", 11) and named._holds(LARGEST_OID)
    restored = started(limit=1 << 20)
    assert restored.adopt([(LARGEST_OID, 5, value(5, b"kept"))], 10) == (1, True)
    assert restored.get(LARGEST_OID, 10) == (b"kept", 5)


def test_a_state_waiting_in_the_window_is_its_exact_revision_too() -> None:
    """get_revision and put_revision find a current state in the window by its tid, as
    in probation and protected (``_stamped``)."""
    cache = started(limit=4 << 20)
    cache.put_loaded(1, 5, b"one at 5", snapshot=10)
    assert 1 in cache._window
    assert cache.get_revision(1, 5) == b"one at 5"
    assert cache.get_revision(1, 4) is None
    cache.put_revision(1, 5, b"one at 5")          # kept already, as the current state
    assert not cache._revisions
    assert_counts_add_up(cache)
