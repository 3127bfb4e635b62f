"""The prefetch plan on its own (``Prefetcher``, no database): what it counts, when it
decides, what it queues and hands out.  Each test pins one rule of the module's
docstring; the decisions only change how many statements a read takes, so these are
the tests that notice when a rule drifts."""
from __future__ import annotations

from zodbsql.cache.prefetch import (DEAD_SLACK, DEAD_SLOT_BYTES, NEAR, NO_PARENT, PROBE,
                                    PROBE_EVERY, QUEUED_BATCHES, QUEUED_ENTRY_BYTES, RECENT,
                                    REPORT_STEP, START, TAIL_BATCHES, TAIL_ENTRY_BYTES, WINDOW,
                                    Prefetcher)

#: The queue's and the tails' limits of a prefetcher whose bound goes up to 1,000.
MAX_QUEUED = QUEUED_BATCHES * 1000
MAX_TAILS = TAIL_BATCHES * 1000


def queued(prefetcher: Prefetcher, *oids: int) -> None:
    """References found to ``oids`` (by a load of nothing in particular)."""
    prefetcher.loaded(-1, [], [(-1, oid) for oid in oids])


def test_no_bytes_turns_prefetch_off() -> None:
    assert not Prefetcher(1000, 0).enabled
    assert not Prefetcher(0, 1 << 20).enabled
    assert Prefetcher(1, 1).enabled


def test_a_hit_counts_once_and_only_for_a_prefetched_state() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.loaded(1, [10, 11], [])
    assert prefetcher.note_hit(12) is False               # never prefetched
    assert prefetcher.note_hit(10) is True
    assert prefetcher.note_hit(10) is False               # used already
    assert (prefetcher.used, prefetcher._window_used) == (1, 1)
    prefetcher.loaded(2, [21], [])
    assert prefetcher.prefetched == 3


def test_a_prefetched_state_loaded_again_is_not_counted_used() -> None:
    """Evicted before use and loaded by a miss: it was not used."""
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.loaded(1, [10], [])
    prefetcher.loaded(10, [], [])
    assert prefetcher.note_hit(10) is False


def test_the_record_of_fresh_prefetches_keeps_the_newest() -> None:
    prefetcher = Prefetcher(20, 1 << 20)                  # 4 x 20 = 80 > 4 x WINDOW
    prefetcher.loaded(1, list(range(100, 190)), [])
    assert len(prefetcher._fresh) == 80
    assert prefetcher.note_hit(100) is False              # the oldest went
    assert prefetcher.note_hit(189) is True
    small = Prefetcher(1, 1 << 20)                        # 4 x WINDOW = 64 is the floor
    small.loaded(1, list(range(100, 200)), [])
    assert len(small._fresh) == 4 * WINDOW


def test_the_bound_is_reconsidered_after_a_window_of_prefetches_across_batches() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.bound = 1000
    prefetcher.loaded(1, list(range(100, 100 + WINDOW - 1)), [])
    prefetcher.plan(5000)
    assert prefetcher.bound == 1000                       # one short of a window
    prefetcher.loaded(2, [300], [])
    prefetcher.plan(6000)
    assert prefetcher.bound == 0                          # a whole window, none used
    one = Prefetcher(1000, 1 << 20)
    one.bound = 1
    one.loaded(1, [10], [])                               # a whole batch of one
    one.plan(5000)
    assert one.bound == 0


def decided(used: int, bound: int = 1000) -> int:
    """The bound after a window of WINDOW prefetches, in two batches, of which ``used``
    were used."""
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.bound = bound
    states = list(range(100, 100 + WINDOW))
    prefetcher.loaded(1, states[:WINDOW // 2], [])
    prefetcher.loaded(2, states[WINDOW // 2:], [])
    for oid in states[:used]:
        prefetcher.note_hit(oid)
    prefetcher.plan(5000)
    return prefetcher.bound


def test_the_share_used_halves_keeps_or_grows_the_bound() -> None:
    assert WINDOW == 16
    assert decided(0) == 0
    assert decided(2) == 500                              # 1/8: halved
    assert decided(4, bound=200) == 200                   # 1/4 exactly: kept
    assert decided(8, bound=200) == 200                   # 1/2 exactly: kept
    assert decided(9, bound=200) == 800                   # over half: fourfold
    assert decided(15, bound=20) == 80                    # all but one: fourfold
    assert decided(16, bound=20) == 320                   # every one: sixteenfold
    assert decided(16, bound=0) == PROBE                  # from 0: a probe's worth
    assert decided(16) == 1000                            # at the limit already


def test_one_batch_little_of_which_was_used_does_not_halve_the_bound_alone() -> None:
    # A miss's own references (the root's containers, a folder's documents) may be
    # read later or never, while the walk that follows reads the next batch: at a
    # second reader's warm read, the containers of the other writer that came with
    # the root halved the bound, and its 1,000 children took four statements, not two.
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.bound = 1000
    containers = list(range(100, 100 + WINDOW))
    prefetcher.loaded(1, containers, [])
    prefetcher.note_hit(containers[0])                    # 1 in 16 read
    prefetcher.loaded(4000, [], [])                       # a load that brought nothing
    assert prefetcher.plan(5000)[0] == 1000               # one batch: not yet
    children = list(range(6000, 6000 + 984))
    prefetcher.loaded(5000, children, [])
    for oid in children:
        prefetcher.note_hit(oid)
    assert prefetcher.plan(7000)[0] == 1000               # the two: mostly used
    sparse = Prefetcher(1000, 1 << 20)
    sparse.bound = 1000
    for miss, first in enumerate((100, 2000)):            # 1 in 100 read, twice
        batch = list(range(first, first + 1000))
        sparse.loaded(miss, batch, [])
        for oid in batch[::100]:
            sparse.note_hit(oid)
        sparse.plan(10_000 + miss)
    assert sparse.bound == 500                            # two such batches: halved


def test_at_bound_zero_every_probe_every_th_miss_probes() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.bound = 0
    probes = [miss for miss in range(1, 2 * PROBE_EVERY + 1)
              if prefetcher.plan(100 * miss)[0] == PROBE]  # far apart: never sequential
    assert probes == [PROBE_EVERY, 2 * PROBE_EVERY]


def test_sequential_in_the_queue_means_one_to_near_slots_on() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.bound = 0
    queued(prefetcher, *range(1000, 100_000, 1000))      # far apart oids, adjacent slots
    assert prefetcher.plan(11_000)[0] == 0
    assert prefetcher.plan(12_000)[0] == PROBE            # the next slot
    assert prefetcher.plan(12_000 + 1000 * NEAR)[0] == PROBE   # NEAR slots on
    assert prefetcher.plan(17_000 + 1000 * NEAR)[0] == 0  # NEAR + 1
    assert prefetcher.plan(17_000 + 1000 * NEAR)[0] == 0  # the same slot again
    assert prefetcher.plan(40_000)[0] == 0


def test_the_same_oid_missed_twice_is_not_sequential() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.bound = 0
    assert prefetcher.plan(500)[0] == 0
    assert prefetcher.plan(500)[0] == 0
    # Nor a queued one whose first load did not report (it failed): its slot stayed.
    queued(prefetcher, *range(1000, 1100))
    prefetcher.bound = START
    assert prefetcher.plan(1050)[0] == START
    prefetcher.bound = 0
    assert prefetcher.plan(1050)[0] == 0


def test_a_batch_of_one_gets_one_follower() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.bound = 1
    queued(prefetcher, 1, 2, 3)
    assert prefetcher.plan(1) == (1, [2])


def test_followers_are_looked_for_up_to_four_slots_a_state_past_loaded_ones() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    queued(prefetcher, *range(1, 11))
    prefetcher.loaded(100, list(range(2, 9)), [])         # 2..8 loaded: dead slots
    prefetcher.bound = 2
    prefetcher._window_prefetched = 0                     # no decision at this miss
    assert prefetcher.plan(1) == (2, [9])                 # slots 2..9 only: 10 is past
    fewer = Prefetcher(1000, 1 << 20)
    queued(fewer, *range(1, 11))
    fewer.loaded(100, list(range(2, 7)), [])              # 2..6 dead
    fewer.bound = 2
    fewer._window_prefetched = 0
    assert fewer.plan(1) == (2, [7, 8])


def test_references_are_queued_once_loaded_one_first_unknown_referrers_last() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.loaded(1, [10], [(99, 31), (10, 21), (1, 11), (1, 10), (10, 11)])
    assert prefetcher._queue == [11, 21, 31]              # 10 came: not queued
    prefetcher.loaded(2, [], [(2, 11), (2, 40)])
    assert prefetcher._queue == [11, 21, 31, 40]          # 11 queued already


def test_dead_slots_are_dropped_and_the_live_ones_stay_in_order() -> None:
    prefetcher = Prefetcher(10_000, 1 << 20)
    queued(prefetcher, *range(1, 5001))
    prefetcher.loaded(10_000, list(range(1, 4991)), [])   # 4,990 loaded: dead
    assert len(prefetcher._queue) == 10                   # more than 2 x 10 + DEAD_SLACK
    assert DEAD_SLACK < 4990
    prefetcher.bound = 0
    assert prefetcher.plan(4991)[0] == 0                  # its slot after the rewrite
    assert prefetcher._last_miss_slot == 0
    prefetcher.bound = 8
    prefetcher._window_prefetched = 0
    assert prefetcher.plan(4992) == (8, list(range(4993, 5001)))


def test_a_queue_past_max_queued_keeps_its_newest_half() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    queued(prefetcher, *range(1, MAX_QUEUED + 2))
    assert len(prefetcher._position) == (MAX_QUEUED + 1) - (MAX_QUEUED + 1) // 2
    assert 1 not in prefetcher._position and MAX_QUEUED + 1 in prefetcher._position
    assert prefetcher._queue[0] == (MAX_QUEUED + 1) // 2 + 1


def test_the_queue_and_the_tails_are_bounded_in_batches_of_the_limit() -> None:
    assert (Prefetcher(1000, 1 << 20).max_queued, Prefetcher(1000, 1 << 20).max_tails) == (
        MAX_QUEUED, MAX_TAILS) == (20_000, 4_000)
    small = Prefetcher(8, 1 << 20)           # a tiny cache's: still a window's worth
    assert (small.max_queued, small.max_tails) == (QUEUED_BATCHES * WINDOW, TAIL_BATCHES * WINDOW)


def test_what_the_queue_and_the_tails_cost_is_counted_and_reported_by_steps() -> None:
    told: list[int] = []
    prefetcher = Prefetcher(1000, 1 << 20, report=told.append)
    assert prefetcher.bookkeeping_bytes() == 0
    queued(prefetcher, 1, 2, 3)                   # three live, one tail (-1 -> 3)
    assert prefetcher.bookkeeping_bytes() == 3 * QUEUED_ENTRY_BYTES + TAIL_ENTRY_BYTES
    assert told == []                             # under a step: not told
    prefetcher.note_hit(2)                        # its slot is dead now
    assert prefetcher.bookkeeping_bytes() == (2 * QUEUED_ENTRY_BYTES + DEAD_SLOT_BYTES
                                              + TAIL_ENTRY_BYTES)
    many = REPORT_STEP // QUEUED_ENTRY_BYTES + 1
    queued(prefetcher, *range(10, 10 + many))     # a step more: told what it costs now
    assert told == [prefetcher.bookkeeping_bytes()] and told[0] >= REPORT_STEP
    queued(prefetcher, 10 ** 6)                   # one more: not told again
    assert len(told) == 1
    more = 2 * many
    queued(prefetcher, *range(10 ** 7, 10 ** 7 + more))
    top = max(told)
    for oid in range(10 ** 7, 10 ** 7 + more):    # loads take oids off: the cost falls
        prefetcher.loaded(oid, [], [])
    assert told[-1] < top                         # and the cache is told, by steps
    assert abs(told[-1] - prefetcher.bookkeeping_bytes()) < REPORT_STEP


def test_the_queue_is_compacted_only_past_max_queued() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    queued(prefetcher, *range(1, MAX_QUEUED + 1))
    assert len(prefetcher._position) == MAX_QUEUED        # at the limit: all kept


def test_dead_slots_are_dropped_past_twice_the_live_ones_and_the_slack() -> None:
    def after(live: int, dead: int) -> int:
        prefetcher = Prefetcher(1000, 1 << 20)
        queued(prefetcher, *range(1, live + dead + 1))
        prefetcher.loaded(10 ** 9, list(range(1, dead + 1)), [])
        return len(prefetcher._queue)
    assert after(10, 10 + DEAD_SLACK) == 2 * 10 + DEAD_SLACK    # at the threshold: kept
    assert after(10, 11 + DEAD_SLACK) == 10                     # past it: dropped
    assert after(5000, 10_000) == 5000                          # 15,000 > 2 x 5,000 + slack


def test_queued_references_come_along_in_the_order_found() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.loaded(1, [10], [(1, 10), (1, 11), (1, 12), (10, 20), (10, 21)])
    bound, queued = prefetcher.plan(11)
    assert (bound, queued) == (START, [12, 20, 21])
    prefetcher.loaded(11, [12, 20], [])
    assert prefetcher.plan(21) == (START, [])             # the last one queued



def test_a_queued_oid_found_in_the_cache_leaves_the_queue() -> None:
    """A hit on a queued oid takes its slot: no load will (a second pass over more than
    the cache holds left 31,000 such slots, 3 MB), and a miss before it no longer
    brings it along."""
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.loaded(1, [], [(1, 10), (1, 11), (1, 12)])
    assert prefetcher.note_hit(11) is False               # not prefetched: only queued
    assert 11 not in prefetcher._position
    assert prefetcher.plan(10) == (START, [12])

def test_references_are_queued_in_the_order_their_states_came() -> None:
    """The database lists a batch's references in any order; the queue takes the
    loaded state's first, then those of each prefetched state in the batch's order."""
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.loaded(1, [30, 20], [(20, 200), (20, 201), (30, 300), (1, 5)])
    assert prefetcher.plan(5) == (START, [300, 200, 201])


def test_a_walk_that_loads_what_it_queued_keeps_the_queue_short() -> None:
    """A BTree walk: each bucket queues its items, and loading them leaves their slots
    dead; the queue drops them instead of growing to MAX_QUEUED (~8 MB of ints)."""
    prefetcher = Prefetcher(1000, 1 << 20)
    longest = 0
    for bucket in range(10_000):                          # 300,000 items in all
        items = [bucket * 100 + n for n in range(30)]
        queued(prefetcher, *items)
        prefetcher.loaded(items[0], items[1:], [])        # the walk loads them all
        for item in items[1:]:
            prefetcher.note_hit(item)
        longest = max(longest, len(prefetcher._queue))
    assert longest <= 2 * 30 + 4096 + 1 == 2 * 30 + DEAD_SLACK + 1
    assert prefetcher._position == {}
    # What is still queued (not loaded) stays, in order.
    queued(prefetcher, 7, 8, 9)
    assert prefetcher.plan(7)[1] == [8, 9]


def test_unused_prefetches_shrink_the_bound_to_zero_and_a_probe_grows_it_back() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    fresh = iter(range(1000, 10**7))
    misses = 0
    while prefetcher.bound:                               # nothing prefetched is used
        bound, _ = prefetcher.plan(misses)
        prefetcher.loaded(misses, [next(fresh) for _ in range(bound)], [])
        misses += 1
    assert misses <= 10
    for miss in range(4 * PROBE_EVERY):                   # everything prefetched is used
        bound, _ = prefetcher.plan(miss)
        used = [next(fresh) for _ in range(bound)]
        prefetcher.loaded(miss, used, [])
        for oid in used:
            prefetcher.note_hit(oid)
    assert prefetcher.bound >= 2 * PROBE


def test_a_batch_of_which_nothing_was_used_stops_prefetching_at_once() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    queued(prefetcher, *range(1000))
    bound, following = prefetcher.plan(0)
    assert bound == START and following == list(range(1, START + 1))
    prefetcher.loaded(0, following, [])                   # none of them is read
    assert prefetcher.plan(100)[0] == 0                   # not halved: 0 at the next miss


def test_misses_one_after_another_in_the_queue_probe_again_and_sparse_ones_do_not() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.bound = 0                                  # a sparse walk taught it
    queued(prefetcher, *range(10_000))
    for child in range(0, 3000, 100):                     # sparse: one in a hundred
        bound, following = prefetcher.plan(child)
        assert (bound, following) == (0, [])
        prefetcher.loaded(child, [], [])
    # A full walk now: its second miss follows the first in the queue.
    assert prefetcher.plan(5000)[0] == 0
    prefetcher.loaded(5000, [], [])
    bound, following = prefetcher.plan(5001)
    assert bound == PROBE and following == list(range(5002, 5002 + PROBE))
    prefetcher.loaded(5001, following, [])
    for child in following:
        prefetcher.note_hit(child)
    assert prefetcher.bound == 0
    assert prefetcher.plan(5002 + PROBE)[0] == PROBE      # the bound is back, to grow
    # A miss further on than NEAR slots is not sequential.
    prefetcher.bound = 0
    prefetcher.plan(6000)
    prefetcher.loaded(6000, [], [])
    assert prefetcher.plan(6001 + NEAR)[0] == 0


def test_misses_at_consecutive_oids_probe_again_though_nothing_was_queued() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.bound = 0                                  # a sparse walk taught it
    for oid in (500, 600, 700):                           # one in a hundred
        assert prefetcher.plan(oid)[0] == 0
    assert prefetcher.plan(701)[0] == PROBE               # the next oid: sequential
    assert prefetcher.plan(701 + NEAR)[0] == PROBE        # NEAR oids on
    assert prefetcher.plan(702 + 2 * NEAR)[0] == 0        # further on: not
    assert prefetcher.plan(700)[0] == 0                   # backwards: not


def test_a_miss_offers_the_states_touched_last_as_its_parents() -> None:
    """The parent of a miss is looked for among the RECENT oids missed or hit last: a
    bucket a walk just entered is one of them when its first item misses."""
    prefetcher = Prefetcher(1000, 1 << 20)
    assert prefetcher.parents() == [NO_PARENT] * RECENT  # nothing touched yet
    prefetcher.plan(10)                                   # a miss
    prefetcher.note_hit(11)                               # a hit
    prefetcher.plan(12)
    assert prefetcher.parents() == [NO_PARENT] * (RECENT - 3) + [10, 11, 12]
    for oid in range(100, 100 + 2 * RECENT):
        prefetcher.note_hit(oid)
    newest = list(range(100 + RECENT, 100 + 2 * RECENT))
    assert prefetcher.parents() == newest
    # A container found for a miss (note_parent) is offered last, once: in place of
    # the oldest when it is not the newest touched.
    prefetcher.note_parent(newest[-1])
    assert prefetcher.parents() == newest
    prefetcher.note_parent(newest[0])
    assert prefetcher.parents() == [*newest[1:], newest[0]]


def test_reaching_the_last_reference_found_of_a_state_offers_that_state() -> None:
    """A container's references come capped: when a hit or a miss reaches the last one
    found (its tail), the container becomes the likeliest parent of the next miss, so
    the children after the tail come with it."""
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.loaded(1, [], [(1, 9), (1, 5), (1, 7), (2, 30)])
    prefetcher.note_hit(7)                                # not a tail
    assert prefetcher.parents()[-1] == 7
    prefetcher.note_hit(9)                                # 1's tail
    assert prefetcher.parents()[-2:] == [9, 1]
    prefetcher.note_hit(9)                                # offered once
    assert prefetcher.parents()[-3:] == [9, 1, 9]
    prefetcher.plan(30)                                   # a miss on 2's tail
    assert prefetcher.parents()[-2:] == [30, 2]


def test_the_record_of_tails_keeps_the_newest() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.loaded(-1, [], [(parent, 10 ** 6 + parent) for parent in range(MAX_TAILS + 5)])
    assert len(prefetcher._tails) == MAX_TAILS
    prefetcher.note_hit(10 ** 6)                          # the oldest went
    assert prefetcher.parents()[-1] == 10 ** 6
    prefetcher.note_hit(10 ** 6 + MAX_TAILS + 4)
    assert prefetcher.parents()[-1] == MAX_TAILS + 4


def test_a_miss_loaded_alone_at_bound_zero_leaves_the_queue() -> None:
    """At bound 0 a miss that does not probe is loaded alone, and nothing reports it to
    ``loaded``: it leaves the queue at the miss.  (It stayed: a 1 MB cache on
    PostgreSQL, whose prefetches were all turned away, queued every item of a
    200,000-object walk, 37 MB of peak RSS above the cache-off run.)"""
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.bound = 0
    queued(prefetcher, *range(0, 10_000, 100))
    for oid in range(4900, -1, -100):                     # backwards: never sequential
        assert prefetcher.plan(oid) == (0, [])
    assert not any(oid in prefetcher._position for oid in range(0, 5000, 100))
    assert sorted(prefetcher._position) == list(range(5000, 10_000, 100))


def test_a_reference_to_a_state_the_cache_holds_is_not_queued() -> None:
    """Its load will be a hit: a walk that found it in the cache has passed it, and a
    reference found again later (a parent's references after a miss are read anew)
    would stay queued for good."""
    held = {11}
    prefetcher = Prefetcher(1000, 1 << 20, held=held.__contains__)
    queued(prefetcher, 10, 11, 12)
    assert set(prefetcher._position) == {10, 12}
    prefetcher.note_hit(10)                  # the walk passes 10, found in the cache
    held.add(10)
    queued(prefetcher, 10, 12, 13)           # the parent's references, found again
    assert set(prefetcher._position) == {12, 13}
