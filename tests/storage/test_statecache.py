"""StateCache on its own: what it remembers, for which snapshots, and how much.

The storage-level tests (test_snapshots.py, the model test) show no connection reads
outside its snapshot; these pin the cache's own rules: the index is reset by a poll
that leaves a gap or grows it past its bound, states larger than a quarter of the cache
are not kept, the memory bound holds (counted as CPython allocates, checked with
tracemalloc), a state asked for often survives a scan, a poll retires the states it
names, and the hit and miss counters count.
"""
from __future__ import annotations

import random
import sys
import tracemalloc
from typing import Any

import pytest

from zodbsql.cache.arena import (CHUNK_OBJECT_BYTES, HEADER_BYTES, LARGEST_OID,
                                 ArenaSegment, entry_cost)
from zodbsql.cache.compression import LIBRARY_BYTES
from zodbsql.cache.statecache import (_BYTES_HEADER, _OID_BYTES, RETIRED_KEPT,
                                      RETIRED_LARGEST, RETIRED_SHARE, REVISIONS_SHARE,
                                      ROOM_PER_STATE, SKETCH_START, FrequencySketch,
                                      StateCache, _revision_cost, allocated, state_cost)

STATE = b"s" * 100
ENTRY = len(STATE) + 64


def polled_cache(limit: int = 100_000) -> StateCache:
    cache = StateCache(limit)
    cache.after_poll(10, 10, [])                 # the first poll: index starts at 10
    return cache


def protect(cache: StateCache, oid: int) -> None:
    """Move ``oid`` from probation to protected, as a promotion would."""
    value = cache._probation.pop(oid)
    cache._protected.push(oid, value)
    cache._protected_bytes += entry_cost(value)


def test_first_poll_starts_the_index() -> None:
    cache = StateCache(100_000)
    assert cache.position() == (None, None)      # never polled
    cache.after_poll(0, 0, [])                   # an empty database: last tid 0
    assert (cache.base, cache.polled) == (0, 0)
    # Where a new instance's first poll starts: at tid 0, and no deletion record seen.
    assert cache.position() == (0, None)
    cache.after_poll(0, 0, [], gone_seq=0)       # deletion record 0 seen
    assert cache.position() == (0, 0)
    cache.after_poll(0, 5, [(1, 5)])             # covers (0, 5]: the index goes on
    assert (cache.base, cache.polled) == (0, 5)
    cache.put_revision(1, 5, STATE)
    assert cache.get(1, 5) == (STATE, 5)


def test_a_poll_with_a_gap_resets_the_index() -> None:
    cache = polled_cache()
    cache.put_loaded(7, 3, STATE, snapshot=10)   # oid 7 is at tid 3 as of 10
    assert cache.get(7, 10) == (STATE, 3)
    cache.after_poll(20, 30, [])                 # (10, 20] not covered: 7 may have changed
    assert (cache.base, cache.polled) == (30, 30)
    assert cache.get(7, 30) is None


def test_a_truncated_poll_past_the_index_drops_the_current_states() -> None:
    cache = polled_cache()
    cache.put_loaded(7, 3, STATE, snapshot=10)
    cache.after_poll(10, 20, [], truncated=True)     # more changed than it could list
    assert (cache.base, cache.polled) == (20, 20)
    assert cache.get(7, 20) is None


def test_a_truncated_poll_that_the_index_covers_changes_nothing() -> None:
    """Another instance polled from further back, up to where the index reaches."""
    cache = polled_cache()
    cache.after_poll(10, 20, [(1, 20)])
    cache.put_loaded(7, 3, STATE, snapshot=20)
    cache.after_poll(5, 20, [], truncated=True)
    cache.after_poll(12, 18, [], truncated=True)
    assert (cache.base, cache.polled) == (10, 20)
    assert cache.get(7, 20) == (STATE, 3)


def test_a_poll_from_before_the_index_takes_only_the_changes_after_it() -> None:
    """Another instance polls from a snapshot before the index's last poll: the changes
    it names up to that poll were taken already; a state loaded since, current then,
    stays current (not retired: without keep_revisions that would drop it), and the
    index keeps the tid it had for its object."""
    cache = polled_cache()
    cache.after_poll(10, 20, [(7, 15)])
    cache.put_loaded(7, 15, STATE, snapshot=20)
    cache.after_poll(10, 30, [(7, 15), (8, 25)], keep_revisions=False)
    assert (cache.base, cache.polled) == (10, 30)
    assert cache.get(7, 30) == (STATE, 15)
    assert (cache._changed[7], cache._changed[8]) == (15, 25)


def test_polls_feed_the_index_until_it_overflows() -> None:
    cache = polled_cache(limit=2_000_000)        # every state fits
    limit = cache._max_index
    assert limit == 2_000_000 // 400             # about a quarter of the cache's bytes
    assert StateCache(1000)._max_index == 1000   # and never fewer than 1000 oids
    cache.after_poll(10, 20, [(oid, 20) for oid in range(limit)])   # exactly full
    assert cache.base == 10
    for oid in range(limit):
        cache.put_revision(oid, 20, STATE)
    assert cache.get(0, 20) == (STATE, 20)
    cache.after_poll(20, 30, [(limit, 30)])      # one past the bound: emptied
    assert (cache.base, cache.polled) == (30, 30)
    assert cache.get(0, 25) is None               # before the new base: ask
    assert cache.get(0, 30) == (STATE, 20)        # current states stay (not changed)


def test_an_old_poll_changes_nothing() -> None:
    cache = polled_cache()
    cache.after_poll(10, 20, [(1, 20)])
    cache.after_poll(10, 20, [(1, 20)])          # the same poll again
    cache.after_poll(10, 15, [(1, 15)])          # an instance behind the newest poll
    assert (cache.base, cache.polled) == (10, 20)
    cache.put_revision(1, 20, STATE)
    assert cache.get(1, 20) == (STATE, 20)


def test_snapshots_before_the_base_are_not_answered() -> None:
    cache = polled_cache()
    cache.put_loaded(1, 5, STATE, snapshot=10)
    assert cache.get(1, 9) is None                # 9 < base: unknown what 9 saw
    assert cache.get(1, 10) == (STATE, 5)
    cache.put_loaded(2, 5, STATE, snapshot=9)     # loaded before the base: not indexed
    assert cache.get(2, 10) is None
    cache.put_loaded(3, 5, STATE, snapshot=11)    # after the newest poll: not indexed
    assert cache.get(3, 10) is None


def test_hits_and_misses_are_counted() -> None:
    cache = polled_cache()
    cache.put_loaded(1, 5, STATE, snapshot=10)
    assert (cache.hits, cache.misses) == (0, 0)
    cache.get(1, 10)
    cache.get(1, 10)
    cache.get(2, 10)
    cache.get(3, 10)
    assert (cache.hits, cache.misses) == (2, 2)


def test_the_memory_bound_holds() -> None:
    cache = StateCache(64 * 1024)
    cache.after_poll(1, 1, [])
    empty = cache.bytes_used
    assert 0 < empty < 12 << 10                   # the sketch, tables, the logs' reserves
    for oid in range(2000):                       # far more than fit
        cache.put_loaded(oid, 1, STATE, snapshot=1)
        cache.get(oid, 1)
        assert cache.bytes_used <= cache.limit
    assert 200 < len(cache) < 400                 # ~200 bytes each, all told
    kept = next(oid for oid in range(2000) if cache.get(oid, 1) is not None)
    counted = cache.bytes_used
    cache.put_loaded(kept, 1, STATE, snapshot=1)  # known already: nothing counted twice
    cache.put_revision(kept, 1, STATE)
    assert cache.bytes_used == counted
    cache.clear()
    assert cache.bytes_used == empty


def test_a_reserve_counts_against_the_bound() -> None:
    """Memory spent for the cache outside it (a prefetch's batches) is counted as part
    of it: the cache keeps fewer states, and a second reserve replaces the first."""
    def kept(reserved: int) -> int:
        cache = StateCache(1 << 20)
        empty = cache.bytes_used
        cache.reserve(reserved)
        cache.reserve(reserved)                   # replaces, never adds
        assert cache.bytes_used == empty + reserved
        cache.after_poll(1, 1, [])
        for oid in range(20_000):
            cache.put_loaded(oid, 1, STATE, snapshot=1)
            cache.get(oid, 1)
            assert cache.bytes_used <= cache.limit
        assert_counts_add_up(cache)
        return len(cache)
    plain, reserved = kept(0), kept(256 << 10)
    assert 0 < reserved < plain * 0.8
    big = StateCache(1 << 20)
    empty = big.bytes_used
    big.reserve(900 << 10)                        # half the bound at most
    assert big.bytes_used == empty + (512 << 10)
    tiny = StateCache(1000 << 10)                 # under 1 MB: nothing
    empty = tiny.bytes_used
    tiny.reserve(18_000)
    assert tiny.bytes_used == empty and tiny._reserved == 0
    disabled = StateCache(0)
    disabled.reserve(16 * 1024)
    assert disabled.bytes_used == 0 and disabled._reserved == 0


def test_a_reserve_that_grows_on_a_full_cache_makes_room_at_once() -> None:
    """The prefetcher's queue grows while the cache is in use: a larger reserve evicts
    states there and then, so the count never stays over the bound."""
    cache = StateCache(2 << 20)
    cache.after_poll(1, 1, [])
    for oid in range(20_000):
        cache.put_loaded(oid, 1, STATE, snapshot=1)
    full, held = cache.bytes_used, len(cache)
    assert full > cache.limit - (64 << 10)
    cache.reserve(256 << 10)
    assert cache.bytes_used <= cache.limit and len(cache) < held
    assert_counts_add_up(cache)
    cache.reserve(0)                              # it falls: room, nothing evicted
    assert cache.bytes_used <= cache.limit - (200 << 10)


def test_the_compressor_s_memory_counts_against_the_bound() -> None:
    """Importing zstandard and using its contexts adds ~0.9 MB to RSS, only where the
    cache compresses: counted as fixed (within half the bound, from 1 MB)."""
    off, auto, zstd = (StateCache(4 << 20, compress=mode) for mode in ("off", "auto", "zstd"))
    assert auto.bytes_used == zstd.bytes_used == off.bytes_used + LIBRARY_BYTES
    auto.reserve(100_000)
    assert auto.bytes_used == off.bytes_used + LIBRARY_BYTES + 100_000
    assert auto._reserved == LIBRARY_BYTES + 100_000
    small = StateCache(1 << 20, compress="auto")
    assert small._reserved == 512 << 10
    assert StateCache(64 << 10, compress="zstd")._reserved == 0


def test_the_count_is_what_python_allocates() -> None:
    """tracemalloc sees what the cache's objects take (requested sizes, so a little
    less than the count, which rounds up to pymalloc's blocks): never more than the
    count, and the count never more than the limit."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = StateCache(4 << 20)
        cache.after_poll(1, 1, [])
        for oid in range(40_000):                 # ~8 MB offered
            cache.put_loaded(oid + (1 << 40), 1, bytes(190) + oid.to_bytes(4, "big"), 1)
        for oid in range(0, 40_000, 7):           # some exact revisions too
            cache.put_revision(oid, 2, bytes(150) + oid.to_bytes(4, "big"))
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert traced <= cache.bytes_used <= cache.limit
    assert traced > 0.85 * cache.bytes_used


def test_a_hot_state_survives_a_scan() -> None:
    """TinyLFU admission: states asked for once (a scan of many more than fit) don't
    push out states asked for often; a plain LRU loses them."""
    for policy in ("tinylfu", "lru"):
        cache = StateCache(64 * 1024)
        if policy == "lru":
            cache._policy_for_comparison("lru")
        cache.after_poll(1, 1, [])
        hot = range(1_000_000, 1_000_020)
        for _ in range(3):
            for oid in hot:
                if cache.get(oid, 1) is None:
                    cache.put_loaded(oid, 1, STATE, snapshot=1)
        for oid in range(5000):                   # the scan: each asked once
            if cache.get(oid, 1) is None:
                cache.put_loaded(oid, 1, STATE, snapshot=1)
        kept = sum(cache.get(oid, 1) is not None for oid in hot)
        assert kept == (20 if policy == "tinylfu" else 0), policy


def test_a_second_pass_over_more_than_fits_is_served_in_part() -> None:
    """A loop over twice what fits: LRU serves nothing on the second pass, TinyLFU
    keeps what filled the cache first."""
    cache = StateCache(64 * 1024)
    cache.after_poll(1, 1, [])
    for oid in range(700):
        if cache.get(oid, 1) is None:
            cache.put_loaded(oid, 1, STATE, snapshot=1)
    assert 250 < len(cache) < 350                 # 700 is more than twice that
    kept = len(cache)
    for oid in range(700):
        if cache.get(oid, 1) is None:
            cache.put_loaded(oid, 1, STATE, snapshot=1)
    assert cache.hits > 0.75 * kept


def test_a_poll_retires_a_current_state_to_an_exact_revision() -> None:
    """A state a poll names as changed is no longer current (get misses), but stays
    the exact revision conflict resolution asks for; a commit's own revision becomes
    current once a poll names it."""
    cache = polled_cache()
    cache.put_loaded(1, 5, b"one at 5", snapshot=10)
    cache.put_revision(1, 20, b"one at 20")       # committed, not polled yet
    assert cache.get(1, 10) == (b"one at 5", 5)
    cache.after_poll(10, 20, [(1, 20)])
    assert cache.get(1, 15) is None               # 15 < 20: which revision? ask
    assert cache.get_revision(1, 5) == b"one at 5"
    assert cache.get(1, 20) == (b"one at 20", 20)
    assert cache.get_revision(1, 20) == b"one at 20"
    cache.put_loaded(1, 5, b"one at 5", snapshot=15)   # an older snapshot's load
    assert cache.get(1, 20) == (b"one at 20", 20)


@pytest.mark.parametrize("keep_revisions", [True, False])
def test_a_poll_keeps_a_state_it_retired_for_one_look_at_its_references(
        keep_revisions: bool) -> None:
    """The state a poll retired (held, then changed) is given once to the miss of its
    new revision (``take_retired``), whether or not it stays as an exact revision;
    one not held, or deleted, is not kept; the bytes kept count in the cache's."""
    cache = polled_cache()
    cache.put_loaded(1, 5, b"one at 5", snapshot=10)
    cache.put_loaded(3, 5, b"three at 5", snapshot=10)
    cache.after_poll(10, 20, [(1, 20), (2, 20)], keep_revisions=keep_revisions)
    assert cache.take_retired(2) is None            # not held
    with_it = cache._bytes()
    assert cache.take_retired(1) == b"one at 5"
    assert with_it - cache._bytes() == len(b"one at 5") + 8
    assert cache.take_retired(1) is None            # once
    cache.after_poll(20, 30, [], gone=[3], gone_seq=1)
    assert cache.take_retired(3) is None            # deleted: no new revision to miss


def test_a_poll_that_reaches_back_keeps_what_it_retired_too() -> None:
    """``cover`` (the poll of a restored cache, reaching back before its index) keeps
    the state it retires for the miss of the new revision, as ``after_poll`` does."""
    cache = polled_cache()
    cache.put_loaded(1, 5, b"one at 5", snapshot=10)
    assert cache.cover(10, 20, [(1, 20), (2, 20)])
    assert cache.get(1, 20) is None
    assert cache.take_retired(1) == b"one at 5"
    assert cache.take_retired(2) is None


def test_a_poll_keeps_the_last_states_it_retired_and_not_the_largest() -> None:
    """Of many retired at once, the last ``RETIRED_KEPT`` in the poll's order; an
    earlier one retired again moves to the newest; a state over ``RETIRED_LARGEST`` is
    not kept; ``clear`` drops them all."""
    cache = StateCache(8 * RETIRED_LARGEST)
    cache.after_poll(10, 10, [])
    count = RETIRED_KEPT + 8
    for oid in range(1, count + 1):
        cache.put_loaded(oid, 5, b"%d at 5" % oid, snapshot=10)
    cache.put_loaded(count + 1, 5, b"x" * (RETIRED_LARGEST + 1), snapshot=10)
    # The last RETIRED_KEPT retired are 10 to count + 1, the largest not kept.
    cache.after_poll(10, 20, [(oid, 20) for oid in range(1, count + 2)])
    assert list(cache._retired) == list(range(10, count + 1))
    cache.put_loaded(9, 20, b"9 at 20", snapshot=20)
    cache.put_loaded(10, 20, b"10 at 20", snapshot=20)
    cache.after_poll(20, 30, [(9, 30), (10, 30)])   # 10 retired again: the newest
    assert list(cache._retired) == [*range(11, count + 1), 9, 10]
    assert cache._retired_bytes == sum(len(b"%d at 5" % oid) + 8 for oid in range(
        11, count + 1)) + len(b"9 at 20") + len(b"10 at 20") + 16
    assert cache.take_retired(9) == b"9 at 20"
    assert cache.take_retired(10) == b"10 at 20"
    assert cache.take_retired(count + 1) is None
    cache.clear()
    assert cache.take_retired(11) is None and cache._retired_bytes == 0


def test_the_retired_states_kept_take_a_share_of_the_bound_at_most() -> None:
    """In a small cache the states kept for their references stay within
    ``RETIRED_SHARE`` of its bound, exactly reached, the oldest going first; one
    larger than that share is not kept, one exactly as large is."""
    cache = StateCache(64_000)
    cache.after_poll(10, 10, [])
    share = int(64_000 * RETIRED_SHARE)             # 2,000 bytes
    for oid in range(1, 6):                         # 500 bytes kept each, the tid's too
        cache.put_loaded(oid, 5, b"s" * 492, snapshot=10)
    cache.put_loaded(6, 5, b"s" * (share - 7), snapshot=10)
    cache.after_poll(10, 20, [(oid, 20) for oid in range(1, 7)])
    assert list(cache._retired) == [2, 3, 4, 5]     # 6 not kept
    assert cache._retired_bytes == 4 * 500 == share
    cache.put_loaded(7, 5, b"s" * (share - 8), snapshot=20)
    cache.after_poll(20, 30, [(7, 30)])
    assert list(cache._retired) == [7] and cache._retired_bytes == share


def test_a_retired_state_kept_compressed_comes_back_as_it_was() -> None:
    """A state retired from probation, where it was kept compressed, is given back
    plain."""
    cache = StateCache(100_000, compress="zstd")
    cache.after_poll(10, 10, [])
    state = b"a compressible state " * 50
    cache.put_loaded(1, 5, state, snapshot=10)
    assert cache._probation.holds(1) and cache._retired == {}
    cache.after_poll(10, 20, [(1, 20)])
    assert cache._retired[1][1]                      # kept as probation held it
    assert cache.take_retired(1) == state


@pytest.mark.parametrize("roomy", [True, False])
def test_large_states_are_not_kept(roomy: bool) -> None:
    """A quarter of the cache, exactly, is kept; more is not: in a batch that enters at
    once and in one that enters state by state (``_enter``)."""
    cache = StateCache(4 * 16_000 + 3)
    if not roomy:
        cache._fits_without_eviction = lambda rows: False    # type: ignore[method-assign]
    cache.after_poll(1, 1, [])
    cache.put_loaded(1, 1, b"x" * 16_000, snapshot=1)   # a quarter: kept
    cache.put_loaded(2, 1, b"x" * 16_001, snapshot=1)   # more: not kept
    assert cache.get(1, 1) == (b"x" * 16_000, 1)
    assert cache.get(2, 1) is None
    assert len(cache) == 1


def test_clear_forgets_everything() -> None:
    cache = StateCache(10 * ENTRY)
    cache.after_poll(1, 1, [])
    cache.put_loaded(1, 1, STATE, snapshot=1)
    cache.clear()
    assert (len(cache), cache.base, cache.polled) == (0, -1, -1)
    assert cache.get(1, 1) is None
    assert cache.bytes_used == StateCache(10 * ENTRY).bytes_used


def test_close_gives_the_memory_back() -> None:
    """A closed storage can stay referenced (pytest keeps every test's instance); its
    cache, admission sketch included, must not stay allocated (CI was once killed
    for memory by a race test that opens hundreds of storages)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = StateCache(64 << 20)
        cache.after_poll(1, 1, [])
        for oid in range(1000):
            cache.put_loaded(oid, 1, bytes(200), 1)
        assert tracemalloc.get_traced_memory()[0] - before > 1000 * 200
        cache.close()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 16 << 10
    assert not cache.enabled
    cache.put_loaded(1, 1, STATE, snapshot=1)
    assert cache.get(1, 1) is None


def test_a_disabled_cache_keeps_nothing() -> None:
    cache = StateCache(0)
    assert not cache.enabled
    cache.after_poll(1, 1, [(1, 1)])
    cache.put_revision(1, 1, b"")
    cache.put_loaded(1, 1, b"", snapshot=1)
    assert cache.get(1, 1) is None
    assert (len(cache), cache.base, cache.hits, cache.misses) == (0, -1, 0, 0)


def test_exact_revisions_are_served_whatever_the_index() -> None:
    """get_revision (conflict resolution's lookup) answers by (oid, tid) alone: a
    revision is the same whenever it is asked for, polled or not."""
    cache = StateCache(1 << 20)
    cache.put_revision(7, 100, b"seven at 100")
    cache.put_revision(7, 200, b"seven at 200")
    assert cache.get_revision(7, 100) == b"seven at 100"
    assert cache.get_revision(7, 200) == b"seven at 200"
    assert cache.get_revision(7, 150) is None
    assert cache.get_revision(8, 100) is None
    disabled = StateCache(0)
    disabled.put_revision(7, 100, b"seven at 100")
    assert disabled.get_revision(7, 100) is None


def test_a_load_at_an_older_snapshot_does_not_vouch_for_the_present() -> None:
    """Found by the model test (history-free SQLite, a pack during commits): a change
    whose row a pack deleted before any poll saw it is missing from the index, so a
    state loaded at an older snapshot must not be recorded as current; a newer
    snapshot would be served a revision that was never current at it."""
    cache = StateCache(1 << 20)
    cache.after_poll(-1, 10, [])                 # the index starts at tid 10
    # Commit 20 changes oid 5 (from tid 1); a pack deletes oid 5 before a poll: the
    # next poll, up to 30, cannot report it.
    cache.after_poll(10, 30, [])
    cache.put_loaded(5, 1, b"tid 1", snapshot=15)   # a connection still at 15 reads it
    assert cache.get(5, 25) is None                 # at 25 the object was at tid 20
    assert cache.get(5, 30) is None
    # Loaded at the newest polled snapshot, the state is the one current there.
    cache.put_loaded(6, 7, b"tid 7", snapshot=30)
    assert cache.get(6, 30) == (b"tid 7", 7)


@pytest.mark.parametrize("compress", ["off", "zstd", "auto"])
def test_random_histories_never_serve_a_stale_state(compress: str) -> None:
    """Random commits, polls by instances at different points, loads at their
    snapshots and small caches (evictions, retired states, exact revisions), against
    the true history: ``get`` answers nothing or the revision current at the snapshot,
    ``has`` says exactly whether ``get`` would answer, ``get_revision`` nothing or the
    exact revision, ``peek_many`` what ``get`` would, ``missing`` the oids ``has`` says
    no to, and ``current_states`` (what the
    persistent cache saves) the revisions current at ``polled``.  With compression the
    states of 40 and 300 zeros are kept packed, the short ones tagged as they are; with
    ``auto`` as they came until the cache is first full, then squeezed."""
    rng = random.Random(23)
    for run in range(40):
        oids = range(1, rng.choice([4, 12, 40]))
        cache = StateCache(rng.choice([6000, 16384, 1 << 20]), compress=compress)
        history: dict[int, list[tuple[int, bytes]]] = {oid: [(1, b"%d@1" % oid)] for oid in oids}
        last = 1
        snapshots = [1]                           # tids some instance polled up to
        cache.after_poll(-1, 1, [])
        for _ in range(300):
            step = rng.random()
            if step < 0.2:                        # a commit; its states go in as revisions
                last += rng.choice([1, 7])
                for oid in rng.sample(list(oids), rng.randint(1, 3)):
                    state = b"%d@%d" % (oid, last) + bytes(rng.choice([0, 40, 300]))
                    history[oid].append((last, state))
                    if rng.random() < 0.7:
                        cache.put_revision(oid, last, state)
            elif step < 0.35:                     # an instance polls from where it was
                since = rng.choice(snapshots[-4:]) if rng.random() < 0.9 else last
                changes = [(oid, revs[-1][0]) for oid, revs in history.items()
                           if since < revs[-1][0] <= last]
                cache.after_poll(since, last, changes)
                snapshots.append(last)
            else:                                 # a load at some instance's snapshot
                oid = rng.choice(list(oids))
                snapshot = rng.choice(snapshots[-5:])
                tid, state = [r for r in history[oid] if r[0] <= snapshot][-1]
                would = cache.has(oid, snapshot)
                assert cache.missing(list(oids), snapshot) == [
                    each for each in oids if not cache.has(each, snapshot)], (run, snapshot)
                found = cache.get(oid, snapshot)
                assert would == (found is not None), (run, oid, snapshot)
                if found is None:
                    cache.put_loaded(oid, tid, state, snapshot)
                else:
                    assert found == (state, tid), (run, oid, snapshot)
                old_tid, old_state = rng.choice(history[oid])
                exact = cache.get_revision(oid, old_tid)
                assert exact in (None, old_state), (run, oid, old_tid)
                peeked = cache.peek_many([oid], snapshot)[0]
                assert peeked in (None, state), (run, oid, snapshot)
            if step > 0.97:
                polled, kept = cache.current_states()
                for oid, value in kept:
                    tid = int.from_bytes(value[:8], "big")
                    assert (tid, value[8:]) == [r for r in history[oid] if r[0] <= polled][-1]
            assert_counts_add_up(cache)


def test_exact_revisions_are_kept_first_in_first_out_within_their_share() -> None:
    """Revisions not known current (a commit's own states, retired ones) take at most
    half the cache: the newest stay, the oldest go first, as many as that half holds."""
    cache = StateCache(64 * 1024)
    state = bytes(200)
    for tid in range(1, 1001):
        cache.put_revision(9, tid, state)
    kept = [tid for tid in range(1, 1001) if cache.get_revision(9, tid) is not None]
    assert kept == list(range(1001 - len(kept), 1001))     # the newest, none missing
    each = state_cost(state) + allocated(sys.getsizeof(1 << 127))   # state and key
    assert 0.8 * REVISIONS_SHARE * cache.limit / each <= len(kept)
    assert len(kept) <= REVISIONS_SHARE * cache.limit / each
    assert len(cache) == len(kept)
    assert cache.bytes_used <= cache.limit


def test_a_poll_that_grows_the_index_keeps_the_bound() -> None:
    """The index of changed oids counts in the bound: a poll naming many oids the
    cache does not hold makes room for them at once (not at the next insert)."""
    cache = StateCache(256 * 1024)
    cache.after_poll(1, 1, [])
    for oid in range(5000):
        cache.put_loaded(oid, 1, STATE, snapshot=1)
    assert cache.limit - 2 * ENTRY < cache.bytes_used <= cache.limit   # full
    held = len(cache)
    cache.after_poll(1, 2, [(1_000_000 + n, 2) for n in range(600)])
    assert cache.bytes_used <= cache.limit
    assert 0 < len(cache) < held
    assert cache.get(1_000_000, 2) is None        # named by the poll: not known


def promote_asked(cache: StateCache) -> None:
    """What an eviction does first (lazy promotion): probation's oldest states that were
    asked for since they came in go to protected, up to the first that was not."""
    with cache._lock:
        cache._oldest_unmarked(None)


def assert_counts_add_up(cache: StateCache) -> None:
    """The running byte counts behind ``bytes_used`` are what the states held take."""
    protected = sum(entry_cost(v) for v in cache._protected.values())
    window = sum(state_cost(v) for v in cache._window.values())
    current = (protected + window
               + sum(entry_cost(v) for v in cache._probation.values()))
    key = allocated(sys.getsizeof(1 << 127))
    revisions = sum(state_cost(v) + key for v in cache._revisions.values())
    assert (cache._protected_bytes, cache._window_bytes, cache._current_bytes,
            cache._revision_bytes) == (protected, window, current, revisions)
    # The sketch's rows as they are now, however often they grew.
    assert cache._fixed_bytes == (cache._sketch.size_bytes + cache._batches_bytes()
                                  + cache._reserved)
    # The table sizes kept as they change, rather than measured at every access.
    for table in (cache._window, cache._revisions):
        assert table.table_bytes == sys.getsizeof(table.entries)
    for segment in (cache._probation, cache._protected):
        assert_log_adds_up(segment)


def assert_log_adds_up(segment: ArenaSegment) -> None:
    """What a segment's chunks take is its live entries and the holes it counts
    (``table_bytes``), and at most its reserve more (a consumed head, the room at the
    tail's end)."""
    allocated_bytes = sum(sys.getsizeof(chunk) for chunk in segment._chunks)
    live = sum(HEADER_BYTES + len(value) for value in segment.values())
    assert live + segment._dead <= allocated_bytes
    assert allocated_bytes <= live + segment.table_bytes + segment.reserve_bytes


def test_a_state_served_from_either_segment_is_also_its_exact_revision() -> None:
    """get_revision finds a current state wherever the policy put it: asked for once
    (probation) or again (protected); a poll naming it keeps it as a revision."""
    cache = polled_cache()
    cache.put_loaded(1, 5, b"one at 5", snapshot=10)
    assert cache.get_revision(1, 5) == b"one at 5"             # probation
    cache.put_loaded(2, 6, b"two at 6", snapshot=10)
    assert cache.get(2, 10) == (b"two at 6", 6)                 # now protected
    assert cache.get_revision(2, 6) == b"two at 6"
    cache.after_poll(10, 20, [(1, 20), (2, 20)])                # both changed
    assert cache.get(1, 20) is None and cache.get(2, 20) is None
    assert cache.get_revision(1, 5) == b"one at 5"
    assert cache.get_revision(2, 6) == b"two at 6"
    cache.put_loaded(1, 20, b"one at 20", snapshot=20)          # the new revision
    cache.put_loaded(2, 20, b"two at 20", snapshot=20)
    assert cache.get(1, 20) == (b"one at 20", 20)
    assert cache.get(2, 20) == (b"two at 20", 20)
    assert_counts_add_up(cache)


def test_the_lru_comparison_policy_keeps_the_newest_state() -> None:
    """scripts/cache_memory.py's plain LRU: no admission filter, the least recently
    used state goes, the one just loaded always stays."""
    cache = StateCache(64 * 1024)
    cache._policy_for_comparison("lru")
    cache.after_poll(1, 1, [])
    for oid in range(3):                          # often asked for, then not again
        for _ in range(5):
            if cache.get(oid, 1) is None:
                cache.put_loaded(oid, 1, STATE, snapshot=1)
    for oid in range(3, 2000):
        assert cache.get(oid, 1) is None
        cache.put_loaded(oid, 1, STATE, snapshot=1)
        assert cache.has(oid, 1), oid
    assert not any(cache.has(oid, 1) for oid in range(3))
    assert_counts_add_up(cache)


def every_state_protected() -> StateCache:
    """A full 256 KB cache (no window) whose index of changed oids takes much of it,
    every current state asked for twice: probation empty, all in protected."""
    cache = StateCache(256 * 1024)
    cache.after_poll(1, 1, [])
    cache.after_poll(1, 2, [(10_000_000 + n, 2) for n in range(900)])   # a big index
    for oid in range(2000):
        if cache.get(oid, 2) is None:
            cache.put_loaded(oid, 1, STATE, snapshot=2)
        cache.get(oid, 2)                          # a second hit: protected
    assert not cache._probation and cache._protected
    return cache


def test_a_frequent_newcomer_enters_when_every_state_is_protected() -> None:
    """When the index of changed oids takes much of the cache, every current state
    can sit in protected; a newcomer asked for more often than protected's oldest
    still gets in (that one goes), one asked for once does not."""
    cache = every_state_protected()
    for _ in range(6):
        assert cache.get(5000, 2) is None
    cache.put_loaded(5000, 1, STATE, snapshot=2)
    assert cache.has(5000, 2)
    assert cache.get(5001, 2) is None
    cache.put_loaded(5001, 1, STATE, snapshot=2)
    assert not cache.has(5001, 2)
    assert cache.bytes_used <= cache.limit
    assert_counts_add_up(cache)


def test_the_frequency_sketch_saturates_at_15_and_forgets() -> None:
    """Admission compares recent popularity: 4-bit counters (a state asked for 100
    times counts 15), halved every 10 x width accesses, so old popularity fades."""
    sketch = FrequencySketch(64)                  # 64 counters a row: halved every 640
    for _ in range(100):
        sketch.add(7)
    assert sketch.count(7) == 15
    for oid in range(1000, 1000 + 10 * 64):       # others, once each
        sketch.add(oid)
    assert sketch.count(7) <= 8


def test_a_commits_states_are_remembered_together_within_the_bound() -> None:
    cache = polled_cache(limit=64 * 1024)
    for oid in range(100):                        # current states, to be evicted first
        cache.put_loaded(oid, 5, STATE, snapshot=10)
    # A deletion first: it is passed over, and so is nothing after it.
    written = [(5000, None)] + [(1000 + n, STATE) for n in range(2000)]
    cache.put_revisions(20, written)
    assert cache.bytes_used <= cache.limit        # the bound holds once the call returns
    assert cache.get_revision(5000, 20) is None   # nothing kept for the deletion
    kept = [oid for oid, _ in written[1:] if cache.get_revision(oid, 20) == STATE]
    # The newest revisions stay (first in, first out), within their share.
    assert kept and kept == [oid for oid, _ in written[len(written) - len(kept):]]
    assert len(kept) * (len(STATE) + 40) <= REVISIONS_SHARE * cache.limit


def put_both(batched: StateCache, one_by_one: StateCache, tid: int,
             written: list[tuple[int, bytes]]) -> None:
    """A commit's ``written`` states at ``tid``: into ``batched`` by ``put_revisions``,
    into ``one_by_one`` a state at a time by ``_put_revision``."""
    batched.put_revisions(tid, written)
    with one_by_one._lock:
        for oid, state in written:
            one_by_one._put_revision(oid, tid, state)
        one_by_one._shrink(None)


def test_a_commits_batch_keeps_what_one_state_at_a_time_keeps() -> None:
    """``put_revisions`` of a new tid does its bookkeeping once for the batch; what it
    keeps is what ``_put_revision`` state by state keeps (first in, first out within the
    share), and the bound holds, whether the batch fits beside the older revisions or
    pushes them all out."""
    rng = random.Random(7)
    for size in (3_000, 40_000, 200_000):
        batched, one_by_one = polled_cache(limit=64 * 1024), polled_cache(limit=64 * 1024)
        for tid in (20, 21, 22):
            oids = range(tid * 1000, tid * 1000 + size // 450)
            written = [(oid, b"s" * rng.randrange(1, 900)) for oid in oids]
            put_both(batched, one_by_one, tid, written)
            assert list(batched._revisions) == list(one_by_one._revisions)
            assert batched._revision_bytes == one_by_one._revision_bytes
            assert batched.bytes_used <= batched.limit


def batched_and_one_by_one(limit: int, batches: list[list[tuple[int, bytes]]],
                           ) -> tuple[StateCache, StateCache]:
    """Two caches given ``batches`` (the commits' states, tids 20, 21, ...): one by
    ``put_revisions``, the other a state at a time by ``_put_revision``."""
    batched, one_by_one = polled_cache(limit=limit), polled_cache(limit=limit)
    for tid, written in enumerate(batches, 20):
        put_both(batched, one_by_one, tid, written)
    return batched, one_by_one


def test_a_commits_batch_keeps_what_one_state_at_a_time_keeps_at_the_edges() -> None:
    """Where the batch's own arithmetic turns: a state larger than a quarter of the
    cache among others (left out alone, the rest kept), states whose size with their
    header is the allocator's step (512 bytes) or one either side, and a batch that
    passes the revisions' share by half a byte (the oldest revision goes)."""
    large = b"L" * (16 * 1024 + 1)            # above a quarter of 64 KB
    batched, one_by_one = batched_and_one_by_one(
        64 * 1024, [[(1, b"a"), (2, large), (3, b"c"), (4, b"d")]])
    assert list(batched._revisions) == list(one_by_one._revisions)
    assert len(batched._revisions) == 3
    step = [(oid, b"s" * (512 - _BYTES_HEADER + oid)) for oid in (-1, 0, 1)]
    batched, one_by_one = batched_and_one_by_one(64 * 1024, [[(oid + 10, state)
                                                             for oid, state in step]])
    assert batched._revision_bytes == one_by_one._revision_bytes == sum(
        _revision_cost(state) for _, state in step)
    # 400 states of one cost in two commits fill the share but for half a byte.
    state = b"r" * 400
    total = 400 * _revision_cost(state)
    batches = [[(oid, state) for oid in range(first, first + 200)] for first in (100, 300)]
    batched, one_by_one = batched_and_one_by_one(2 * total - 1, batches)
    assert list(batched._revisions) == list(one_by_one._revisions)
    assert batched._revision_bytes == one_by_one._revision_bytes == total - _revision_cost(state)
    assert batched._revision_bytes <= REVISIONS_SHARE * batched.limit


def test_states_a_full_cache_would_not_admit_are_served_from_the_window() -> None:
    """A prefetch into a cache full of states asked for often: admission keeps the
    newcomers out of probation, but they wait in the window, so the loads that follow
    the prefetch find them (with no window every one of them was a miss, and the
    prefetch bound fell to 0)."""
    cache = polled_cache(limit=4 << 20)
    assert cache._window_limit == (4 << 20) // 16  # WINDOW_FLOOR's share of a small cache
    hot = range(1 << 30, (1 << 30) + 30_000)      # more than fit: the cache fills up
    for _ in range(2):
        for oid in hot:
            if cache.get(oid, 10) is None:
                cache.put_loaded(oid, 9, STATE, snapshot=10)
    held = len(cache)
    in_window = sum(oid in cache._window for oid in hot)
    batch = range(1000)                           # a prefetch: about 200 KB of 256
    for oid in batch:
        cache.put_loaded(oid, 9, STATE, snapshot=10)
    assert all(cache.get(oid, 10) == (STATE, 9) for oid in batch)
    assert len(cache) == held                     # each pushed one out of the window
    assert cache.bytes_used <= cache.limit
    # Out of the window they face admission: asked for once, they lose to states
    # asked for twice, and go without entering probation; the hot states kept stay
    # (but those the window held, which the newcomers pushed out).
    for oid in range(10_000, 12_000):
        cache.put_loaded(oid, 9, STATE, snapshot=10)
    assert not any(cache.has(oid, 10) for oid in batch)
    kept_hot = sum(cache.has(oid, 10) for oid in hot)
    assert kept_hot >= held - in_window
    assert_counts_add_up(cache)




@pytest.mark.parametrize("megabytes, window", [(1, 64 << 10), (2, 128 << 10),
                                               (4, 256 << 10), (10, 512 << 10),
                                               (64, 0.01 * (64 << 20))])
def test_the_window_holds_a_prefetch_batch(megabytes: int, window: float) -> None:
    """The window is 1% of the cache but at least WINDOW_FLOOR (up to a 16th of the
    cache): at 1%, a 10 MB cache's 100 KB turned most of a 1,000-state prefetch away
    before its loads came (PostgreSQL, first pass over 200,000 objects: 7,700 objects/s
    against 27,500 with the floor).  From 1 MB (without it a 1 MB cache turned away
    every prefetched state: 1,300 objects/s, a statement each); none below."""
    assert StateCache(megabytes << 20)._window_limit == window


@pytest.mark.parametrize("megabytes, count, size", [
    (0, 1000, 1 << 20),                          # disabled: the Redis level may take them
    (0.008, 8, 8 * ROOM_PER_STATE),              # a few states without a window
    (1, (64 << 10) // ROOM_PER_STATE, 64 << 10),
    (4, 1000, 256 << 10),
    (64, 1000, int(0.01 * (64 << 20)))])
def test_a_prefetch_batch_fits_the_window(megabytes: float, count: int, size: int) -> None:
    """What one prefetch brings (at most prefetch-count states of prefetch-bytes) is
    lowered to what the window holds while it waits for its loads."""
    assert StateCache(int(megabytes * (1 << 20))).prefetch_batch(1000, 1 << 20) == (count, size)


@pytest.mark.parametrize("roomy", [True, False])
def test_the_window_holds_exactly_its_limit(roomy: bool) -> None:
    """States fill the window up to its limit, not one fewer: 1,024 states of 256
    bytes each (a 215-byte state, its 8-byte tid and the bytes header, in pymalloc's
    blocks) are the 256 KB window of a 4 MB cache.  The same state by state, as in a
    cache too full for a batch to enter at once (``_enter``), and in one step
    (``_enter_all``)."""
    cache = polled_cache(limit=4 << 20)
    if not roomy:
        cache._fits_without_eviction = lambda rows: False    # type: ignore[method-assign]
    assert state_cost(bytes(8 + 215)) == 256
    for oid in range(1024):
        cache.put_loaded(oid, 9, bytes(215), snapshot=10)
    assert len(cache._window) == 1024 and not cache._probation
    cache.put_loaded(1024, 9, bytes(215), snapshot=10)
    assert len(cache._window) == 1024 and list(cache._probation) == [0]


def test_a_large_newcomer_pushes_out_of_the_window_all_it_must() -> None:
    """A state larger than those in a full cache's window pushes several out; each is
    turned away, and the window ends within its limit (not after the first)."""
    cache = polled_cache(limit=4 << 20)
    for _ in range(2):                                   # asked twice: they stay
        for oid in range(1 << 30, (1 << 30) + 30_000):
            if cache.get(oid, 10) is None:
                cache.put_loaded(oid, 9, STATE, snapshot=10)
    for oid in range(2000):                              # asked once: turned away
        cache.put_loaded(oid, 9, STATE, snapshot=10)
    cache.put_loaded(5000, 9, bytes(4000), snapshot=10)  # ~28 small states' bytes
    assert cache._window_bytes <= cache._window_limit
    assert cache.bytes_used <= cache.limit
    assert_counts_add_up(cache)

def test_a_scan_turned_away_leaves_the_states_kept_in_place() -> None:
    """A scan through a full cache (each state asked for once, as the states already
    kept were): every newcomer loses admission and goes straight from the window, never
    into probation.  Pushed in and popped again, each left a dead slot in probation's
    entry table, which resized to three slots per live state and more (~87 bytes a
    state here, against ~35 for a table of the live ones), and what the table took was
    taken from the states kept: at 10 MB a second pass over twice the cache found none
    of them, and this cache held 15,200 states instead of 17,000."""
    cache = polled_cache(limit=4 << 20)
    for oid in range(1 << 30, (1 << 30) + 30_000):       # more than fit
        cache.get(oid, 10)
        cache.put_loaded(oid, 9, STATE, snapshot=10)
    assert cache._probation.table_bytes < 50 * len(cache._probation)
    kept = [oid for oid in range(1 << 30, (1 << 30) + 30_000)
            if oid in cache._probation or oid in cache._protected]
    table = cache._probation.table_bytes
    for oid in range(60_000):                            # the scan
        cache.get(oid, 10)
        cache.put_loaded(oid, 9, STATE, snapshot=10)
    assert cache._probation.table_bytes <= table
    still = sum(cache.has(oid, 10) for oid in kept)
    # Those the sketch over-counts (shared counters) still win admission now and then.
    assert still > 0.97 * len(kept)
    assert cache.bytes_used <= cache.limit
    assert_counts_add_up(cache)


def full_cache_without_window() -> tuple[StateCache, int]:
    """A small cache without a window, filled with states of 60 bytes (oids 1 to the
    first one it did not keep, returned with it)."""
    cache = polled_cache(limit=26_000)
    cache._window_limit = 0
    oid = 0
    while len(cache) == oid:                      # until the cache is full
        oid += 1
        cache.put_loaded(oid, 5, b"s" * 60, snapshot=10)
    return cache, oid


def test_a_poll_retires_a_protected_state() -> None:
    """A state in protected that a poll names changed leaves protected (counted) for
    the exact revisions, like one in probation or the window; left there, it would be
    served as current again once the index that names the change is emptied."""
    cache, oid = full_cache_without_window()
    first, second = list(cache._probation)[:2]
    for asked in (first, second):
        assert cache.get(asked, 10) is not None
    cache.put_loaded(oid + 1, 5, b"s" * 60, snapshot=10)   # promotes both
    assert list(cache._protected) == [first, second]
    cache.after_poll(10, 20, [(second, 20)])
    assert list(cache._protected) == [first] and second not in cache._probation
    assert cache.get(second, 20) is None
    assert cache.get_revision(second, 5) == b"s" * 60
    assert_counts_add_up(cache)
    # The index emptied (more changes than it holds): nothing names the change now.
    cache.after_poll(20, 30, [(10_000 + n, 30) for n in range(cache._max_index + 1)])
    assert cache.base == 30 and not cache._changed
    assert cache.get(second, 30) is None
    assert cache.get(first, 30) == (b"s" * 60, 5)


@pytest.mark.parametrize("largest_in", ["probation", "protected"])
def test_a_poll_retires_the_largest_oid_held_and_skips_only_those_above(
        largest_in: str) -> None:
    """A poll asks the segments' indexes only of the oids up to the largest they hold
    (``ArenaSegment.largest``): the largest itself is retired, in either segment, and
    so is one in the window above it; the new objects above are not looked up."""
    cache = polled_cache(limit=26_000)
    cache._window_limit = 0
    for oid in (3, 7, 9):
        cache.put_loaded(oid, 5, b"s" * 60, snapshot=10)
    if largest_in == "protected":
        protect(cache, 9)
    assert cache._probation.largest() == (7 if largest_in == "protected" else 9)
    cache._window_limit = 1 << 20
    cache.put_loaded(11, 5, b"w" * 60, snapshot=10)        # waits in the window
    assert 11 in cache._window
    cache.after_poll(10, 20, [(9, 20), (11, 20), (12, 20)])
    assert cache.get(9, 20) is None and cache.get(11, 20) is None
    assert cache.get_revision(9, 5) == b"s" * 60
    assert cache.get(7, 20) == (b"s" * 60, 5)
    assert_counts_add_up(cache)
    # Retired, not only named by the index: once the index is emptied (more changes
    # than it holds), a state left current would be served again.
    cache.after_poll(20, 30, [(10_000 + n, 30) for n in range(cache._max_index + 1)])
    assert cache.base == 30 and not cache._changed
    assert cache.get(9, 30) is None and cache.get(11, 30) is None
    assert cache.get(7, 30) == (b"s" * 60, 5)


def test_a_cover_retires_what_it_names_from_every_segment_and_keeps_the_revisions() -> None:
    """``cover`` (a restored cache's poll that reaches back) retires each state it
    names as changed from whichever segment holds it, as ``after_poll`` does, and a
    deleted object's too; the retired states stay as exact revisions."""
    cache = polled_cache(limit=26_000)
    cache._window_limit = 0
    for oid in (3, 7, 9):
        cache.put_loaded(oid, 5, bytes([oid]) * 60, snapshot=10)
    protect(cache, 9)
    cache._window_limit = 1 << 20
    cache.put_loaded(11, 5, bytes([11]) * 60, snapshot=10)   # waits in the window
    cache.put_loaded(12, 5, bytes([12]) * 60, snapshot=10)   # not named: stays
    assert (list(cache._probation), list(cache._protected)) == ([3, 7], [9])
    assert 11 in cache._window and 12 in cache._window
    assert cache.cover(10, 20, [(7, 20), (9, 20), (11, 20)], gone=[3], gone_seq=1)
    for oid in (3, 7, 9, 11):
        assert cache.get(oid, 20) is None
        assert cache.get_revision(oid, 5) == bytes([oid]) * 60
    assert not cache._probation and not cache._protected and 11 not in cache._window
    assert_counts_add_up(cache)
    # Retired, not only named by the index: once the index is emptied (more changes
    # than it holds), a state left current would be served again.
    cache.after_poll(20, 30, [(10_000 + n, 30) for n in range(cache._max_index + 1)])
    assert cache.base == 30 and not cache._changed
    for oid in (3, 7, 9, 11):
        assert cache.get(oid, 30) is None
    assert cache.get(12, 30) == (bytes([12]) * 60, 5)


def test_a_polled_commit_s_deletion_does_not_hide_its_other_states() -> None:
    """``put_revisions`` of a commit a poll has already named (its tid at or below
    ``polled``): a deletion among its states is skipped, and the states after it are
    still kept (the one the poll named as current)."""
    cache = polled_cache()
    cache.after_poll(10, 20, [(1, 20), (2, 20), (3, 20)])
    cache.put_revisions(20, [(1, b"one"), (2, None), (3, b"three")])
    assert cache.get(1, 20) == (b"one", 20)
    assert cache.get(2, 20) is None
    assert cache.get(3, 20) == (b"three", 20)
    assert cache.get_revision(3, 20) == b"three"


@pytest.mark.parametrize("keep", [True, False])
def test_a_poll_keeps_a_deleted_object_s_state_as_a_revision_only_if_asked(
        keep: bool) -> None:
    """A poll that reports an object deleted retires its current state as the other
    changes it names are: kept as an exact revision with ``keep_revisions``, dropped
    without (no snapshot before the poll will read it)."""
    cache = polled_cache()
    cache.after_poll(10, 10, [], gone_seq=0)
    cache.put_loaded(4, 5, b"four", snapshot=10)
    cache.put_loaded(6, 5, b"six", snapshot=10)
    cache.after_poll(10, 20, [(6, 20)], gone=[4], gone_seq=1, keep_revisions=keep)
    assert cache.get(4, 20) is None and cache.get(6, 20) is None
    assert cache.get_revision(4, 5) == (b"four" if keep else None)
    assert cache.get_revision(6, 5) == (b"six" if keep else None)


def test_holds_says_which_states_are_cached_as_current() -> None:
    cache = polled_cache()
    cache.put_loaded(4, 5, b"four", snapshot=10)
    cache.put_revision(6, 20, b"six")             # an exact revision only
    assert cache.holds(4) and not cache.holds(5) and not cache.holds(6)
    assert not StateCache(0).holds(4)


@pytest.mark.parametrize("segment", ["window", "probation", "protected"])
def test_a_poll_retires_the_root_object_in_any_segment(segment: str) -> None:
    """Oid 0 (the root), which is false as a number: a poll that names it retires its
    state from whichever segment holds it, as any other (a truth test standing in for a
    lookup would keep it current, and serve it once the index is emptied)."""
    cache = polled_cache(limit=4 << 20)           # a cache with a window
    if segment != "window":
        cache._window_limit = 0
    cache.put_loaded(0, 5, b"root at 5", snapshot=10)
    cache.put_loaded(4, 5, b"four at 5", snapshot=10)
    if segment == "protected":
        protect(cache, 0)
    holder: Any = {"window": cache._window, "probation": cache._probation,
                   "protected": cache._protected}[segment]
    assert 0 in holder
    cache.after_poll(10, 20, [(0, 20)])
    assert 0 not in holder and cache.get_revision(0, 5) == b"root at 5"
    cache.after_poll(20, 30, [(10_000 + n, 30) for n in range(cache._max_index + 1)])
    assert not cache._changed
    assert cache.get(0, 30) is None
    assert cache.get(4, 30) == (b"four at 5", 5)
    assert_counts_add_up(cache)


def test_a_poll_retires_a_state_waiting_in_the_window() -> None:
    """In a cache with a window, a state loaded a moment ago waits there: a poll that
    names it changed takes it out of the window (counted) into the exact revisions."""
    cache = polled_cache(limit=4 << 20)
    cache.put_loaded(1, 5, b"one at 5", snapshot=10)
    # Of another size than the first: the window's count must lose the right one.
    cache.put_loaded(2, 5, b"two at 5, a longer state", snapshot=10)
    assert list(cache._window) == [1, 2] and len(cache) == 2
    cache.after_poll(10, 20, [(1, 20)])
    assert list(cache._window) == [2]
    assert cache.get(1, 20) is None
    assert cache.get_revision(1, 5) == b"one at 5"
    assert len(cache) == 2                        # one current state, one revision
    assert_counts_add_up(cache)


def test_a_cover_that_grows_the_index_counts_its_table() -> None:
    cache = polled_cache()
    cache.put_loaded(1, 5, b"one at 5", snapshot=10)
    assert cache.cover(5, 30, [(oid, 20) for oid in range(2, 600)])
    assert len(cache._changed) == 598
    assert_counts_add_up(cache)


def test_a_revision_a_poll_named_becomes_current_within_the_bound() -> None:
    """A full cache with a window: a commit's own revision, named by a poll, becomes
    current when asked for (into the window) and the cache still fits its bound."""
    cache = polled_cache(limit=4 << 20)
    for oid in range(1 << 20, (1 << 20) + 30_000):            # more than fit
        cache.put_loaded(oid, 9, STATE, snapshot=10)
    assert cache.bytes_used > cache.limit - 1000
    large = b"L" * 30_000                                   # fits the 41 KB window
    cache.put_revision(1, 20, large)
    cache.after_poll(10, 20, [(1, 20)])
    assert cache.get(1, 20) == (large, 20)
    assert 1 in cache._window
    assert cache.bytes_used <= cache.limit
    assert_counts_add_up(cache)


def test_a_cache_below_1_mb_has_no_window() -> None:
    cache = polled_cache(limit=(1 << 20) - 1)
    assert cache._window_limit == 0
    cache.put_loaded(1, 9, STATE, snapshot=10)
    assert list(cache._probation) == [1] and not cache._window


def sketch_slots(sketch: FrequencySketch, oid: int) -> tuple[int, int]:
    """The counter ``oid`` has in each row."""
    return tuple(((oid * factor) & sketch._MASK) >> sketch._shift   # type: ignore[return-value]
                 for factor in (sketch._FIRST, sketch._SECOND))


def test_the_sketch_counts_in_both_rows_answers_the_smaller_and_halves_both() -> None:
    """Each access counts one in both rows while they agree; an oid sharing a counter
    with a frequent one is counted by its other row alone (up to 15), and ``count``
    answers the smaller of its two; the periodic halving halves both rows."""
    sketch = FrequencySketch(64)
    first, second = sketch_slots(sketch, 7)
    for n in range(1, 6):
        sketch.add(7)
        assert (sketch.rows[0][first], sketch.rows[1][second]) == (n, n)
    for _ in range(30):
        sketch.add(7)
    assert (sketch.rows[0][first], sketch.rows[1][second]) == (15, 15)
    others = range(8, 1_000_000)
    same_first = [oid for oid in others if sketch_slots(sketch, oid)[0] == first
                  and sketch_slots(sketch, oid)[1] != second][:2]
    same_second = next(oid for oid in others if sketch_slots(sketch, oid)[1] == second
                       and sketch_slots(sketch, oid)[0] != first)
    loud, quiet = same_first
    for _ in range(40):
        sketch.add(loud)                          # its first counter is 7's, at 15
    assert sketch.rows[1][sketch_slots(sketch, loud)[1]] == 15
    if sketch_slots(sketch, quiet)[1] != sketch_slots(sketch, loud)[1]:
        sketch.add(quiet)
        sketch.add(quiet)
        assert sketch.count(quiet) == 2           # not 15, its first row's
    sketch.add(same_second)
    sketch.add(same_second)
    assert sketch.count(same_second) == 2         # not 15, its second row's
    sketch.samples = sketch.period - 1
    untouched = next(oid for oid in others if not set(sketch_slots(sketch, oid))
                     & {first, second})
    sketch.add(untouched)                         # the period's last access: halving
    assert (sketch.rows[0][first], sketch.rows[1][second]) == (7, 7)


def test_a_state_waiting_in_the_window_is_counted_as_fully_as_an_admitted_one() -> None:
    cache = polled_cache(limit=4 << 20)
    before, table = cache.bytes_used, cache._window.table_bytes
    cache.put_loaded(1, 5, STATE, snapshot=10)
    assert list(cache._window) == [1]
    grown = cache._window.table_bytes - table
    assert cache.bytes_used - before == (state_cost((5).to_bytes(8, "big") + STATE)
                                         + _OID_BYTES + grown)


def test_a_poll_that_fills_a_small_cache_drops_only_the_revisions_it_must() -> None:
    """With no current state left to evict, the bound is kept by dropping the oldest
    exact revisions, as many as needed and no more."""
    def filled(changes: int) -> StateCache:
        cache = polled_cache(limit=120_000)
        cache.put_revisions(5, [(oid, b"r" * 1000) for oid in range(50)])
        cache.after_poll(10, 20, [(oid, 20) for oid in range(1000, 1000 + changes)])
        return cache
    assert len(filled(0)._revisions) == 50
    changes = next(n for n in range(0, 1000, 5) if len(filled(n)._revisions) < 50)
    cache = filled(changes)
    assert 0 < len(cache._revisions) < 50
    assert cache.bytes_used <= cache.limit
    assert list(cache._revisions)[-1] == 49 << 64 | 5   # the newest stayed
    assert_counts_add_up(cache)


def test_a_promotion_on_the_way_to_an_eviction_keeps_the_bound() -> None:
    """An eviction first moves probation's oldest states that were asked for to
    protected, whose log grows by them: the bound is checked again then."""
    cache, oid = full_cache_without_window()
    oldest = list(cache._probation)[:3]
    for asked in oldest:
        assert cache.get(asked, 10) is not None   # marked, not moved
    assert not cache._protected
    cache.put_loaded(oid + 1, 5, b"s" * 60, snapshot=10)   # an eviction
    assert list(cache._protected) == oldest
    assert cache.bytes_used <= cache.limit
    assert_counts_add_up(cache)


@pytest.mark.parametrize("roomy", [True, False])
def test_a_batch_goes_on_past_a_state_it_does_not_keep(roomy: bool) -> None:
    """A prefetch's batch may hold an older revision than the index names, or a state
    too large or kept already: those are skipped, the rest of the batch is kept; by a
    batch that fits (no admission test) and by one that must be admitted state by
    state."""
    cache = polled_cache(limit=100_000)
    if not roomy:
        cache._fits_without_eviction = lambda rows: False   # type: ignore[method-assign]
    cache.after_poll(10, 20, [(1, 20)])           # oid 1 changed at 20
    cache.put_loaded(3, 8, b"three", snapshot=20)
    cache.put_loaded_many([(1, 8, b"one, older"), (2, 8, b"two"),
                           (4, 8, b"x" * (cache.limit // 4 + 1)), (5, 8, b"five"),
                           (3, 8, b"three"), (6, 8, b"six")], snapshot=20)
    assert cache.get(1, 20) is None and cache.get(4, 20) is None
    assert not cache._holds(1) and not cache._holds(4)   # not kept at all
    assert [cache.get(oid, 20) for oid in (2, 5, 3, 6)] == [
        (b"two", 8), (b"five", 8), (b"three", 8), (b"six", 8)]


def test_a_commits_batch_keeps_a_quarter_and_goes_on_past_a_state_named_twice() -> None:
    """A commit's states (``put_revisions`` before a poll saw their tid) are kept up to
    a quarter of the cache each, exactly; an oid named twice, or kept already at that
    tid, keeps its first state, is counted once, and the batch goes on after it."""
    cache = polled_cache(limit=4 * 16_000 + 3)
    quarter = cache.limit // 4
    cache.put_revisions(20, [(1, b"q" * quarter), (2, b"q" * (quarter + 1))])
    assert cache.get_revision(1, 20) == b"q" * quarter
    assert cache.get_revision(2, 20) is None
    cache.put_revisions(30, [(3, b"three"), (3, b"three again"), (4, b"four"), (5, None)])
    cache.put_revisions(30, [(4, b"four again"), (6, b"six")])
    assert [cache.get_revision(oid, 30) for oid in (3, 4, 6)] == [b"three", b"four", b"six"]
    assert cache.get_revision(5, 30) is None
    assert_counts_add_up(cache)


def test_a_commits_batch_fills_the_revisions_share_exactly() -> None:
    """The revisions' share is filled to the byte: a commit's batch that takes exactly
    the share is kept whole, and so are the revisions before it when with them it takes
    exactly the share.  Each revision here costs 176 bytes (95 of state and the bytes
    header in a 128-byte block, a 48-byte key) and the share is 200 of them."""
    per = state_cost(bytes(95)) + allocated(sys.getsizeof(1 << 127))
    assert per == 176
    cache = polled_cache(limit=int(400 * per / (2 * REVISIONS_SHARE)))
    assert REVISIONS_SHARE * cache.limit == 200 * per
    cache.put_revisions(20, [(oid, bytes(95)) for oid in range(1, 201)])
    assert len(cache._revisions) == 200                # the whole batch, exactly
    cache = polled_cache(limit=int(400 * per / (2 * REVISIONS_SHARE)))
    cache.put_revisions(20, [(oid, bytes(95)) for oid in range(1, 121)])
    cache.put_revisions(30, [(oid, bytes(95)) for oid in range(121, 201)])
    assert len(cache._revisions) == 200                # both batches, exactly
    cache.put_revisions(40, [(201, bytes(95))])
    assert len(cache._revisions) == 200 and cache.get_revision(1, 20) is None
    assert_counts_add_up(cache)
    # A batch larger than the share keeps its newest that fill it exactly, no fewer.
    cache = polled_cache(limit=int(400 * per / (2 * REVISIONS_SHARE)))
    cache.put_revisions(50, [(oid, bytes(95)) for oid in range(1, 202)])
    assert len(cache._revisions) == 200
    assert cache.get_revision(1, 50) is None and cache.get_revision(2, 50) == bytes(95)
    assert_counts_add_up(cache)


def test_a_window_over_the_bound_gives_up_its_oldest_states() -> None:
    """The window is 1% of the cache, so with the index and the revisions within their
    shares it never holds the cache over its bound alone; if it did (here: a window
    as large as the cache), its oldest states go, counted."""
    cache = polled_cache(limit=4 << 20)
    cache._window_limit = cache.limit
    oid = 0
    while len(cache) == oid:
        oid += 1
        cache.put_loaded(oid, 5, b"w" * 5000, snapshot=10)
    assert not cache._probation and not cache._protected
    assert 1 not in cache._window and oid in cache._window
    assert cache.bytes_used <= cache.limit
    assert_counts_add_up(cache)


def test_a_pass_of_hits_moves_nothing_and_promotions_give_probations_log_back() -> None:
    """A second pass over states that all fit only marks them: no state moves, nothing
    is written.  Promoted later (by evictions), they leave probation's log from its
    head, and the chunks they leave go as they empty instead of staying beside
    protected's."""
    cache = polled_cache(limit=64 << 20)
    cache._window_limit = 0                        # every state straight to probation
    states = 20_000
    for oid in range(states):
        cache.put_loaded(oid, 5, STATE, snapshot=10)
    assert len(cache._probation) == states
    chunks = list(cache._probation._chunks)
    tables = cache._tables()
    for oid in range(states):
        assert cache.get(oid, 10) == (STATE, 5)
    assert len(cache._probation) == states and cache._tables() == tables
    assert all(a is b for a, b in zip(chunks, cache._probation._chunks))
    promote_asked(cache)
    assert not cache._probation and len(cache._protected) == states
    assert len(cache._probation._chunks) == 1 and not cache._probation._chunks[0]
    assert cache._tables() == (cache._protected.table_bytes + CHUNK_OBJECT_BYTES
                               + cache._window.table_bytes)
    assert_counts_add_up(cache)


@pytest.mark.parametrize("megabytes", [2, 8])
def test_a_batch_found_roomy_enters_as_it_would_state_by_state(megabytes: int) -> None:
    """``put_loaded_many`` skips admission for a batch that fits whatever the tables
    do; what it keeps, and in which segment and order, is what the full path keeps,
    and nothing is evicted while the cache fills.  With a window (8 MB) and without
    one (2 MB); batches that name an oid twice, or one kept already, keep the first."""
    rng = random.Random(11)
    roomy, checked = StateCache(megabytes << 20), StateCache(megabytes << 20)
    for cache in (roomy, checked):
        cache.after_poll(1, 1, [])
    checked._fits_without_eviction = lambda rows: False     # type: ignore[method-assign]
    taken = 0
    oid = 0
    while True:
        batch = []
        for _ in range(rng.randrange(1, 1200)):
            oid += 1
            batch.append((oid, 1, bytes(rng.randrange(1, 700))))
        repeated = rng.choice(batch)
        batch.append((repeated[0], 1, b"again"))            # named twice: kept once
        if oid > 2000:
            batch.append((rng.randrange(1, oid - 1500), 1, b"kept already"))
        fits = roomy._fits_without_eviction(batch)
        before = len(roomy)
        roomy.put_loaded_many(batch, 1)
        checked.put_loaded_many(batch, 1)
        assert list(roomy._window.items()) == list(checked._window.items())
        assert list(roomy._probation.items()) == list(checked._probation.items())
        # The same states, counted the same.  The roomy batch writes each table once
        # (``_enter_all``), so the tables' sizes, measured, may differ a little.
        assert roomy._current_bytes == checked._current_bytes
        assert roomy._window_bytes == checked._window_bytes
        assert roomy.bytes_used <= roomy.limit and checked.bytes_used <= roomy.limit
        assert_counts_add_up(roomy)
        assert roomy.peek_many([repeated[0]], 1) == [repeated[2]]
        if fits:
            taken += 1
            assert len(roomy) == before + len(batch) - 1 - (oid > 2000)   # nothing went
        else:
            break
    assert taken > 3


def test_a_batch_larger_than_the_window_leaves_its_newest_there() -> None:
    """A roomy batch that does not fit the window keeps its newest states there, up to
    the limit exactly, and sends the rest to probation behind the window's own, oldest
    first.  Here each state takes 256 bytes (``test_the_window_holds_exactly_its_limit``)
    and the window 1,024 of them."""
    cache = polled_cache(limit=4 << 20)
    state = bytes(215)
    first = list(range(500))
    second = list(range(1000, 2000))
    third = list(range(3000, 4025))
    cache.put_loaded_many([(oid, 9, state) for oid in first], snapshot=10)
    assert list(cache._window) == first and not cache._probation
    # The second batch fits whole: only the first's oldest 476 leave.
    cache.put_loaded_many([(oid, 9, state) for oid in second], snapshot=10)
    assert list(cache._window) == first[476:] + second
    assert list(cache._probation) == first[:476]
    # The third is one more than the window holds: its first goes, and all before it.
    cache.put_loaded_many([(oid, 9, state) for oid in third], snapshot=10)
    assert list(cache._window) == third[1:]
    assert list(cache._probation) == first + second + third[:1]
    assert cache._window_bytes == cache._window_limit == 1024 * 256
    assert_counts_add_up(cache)


def test_a_batch_one_byte_over_the_window_pushes_its_oldest_out() -> None:
    """A batch that would leave the window one byte over its limit pushes the oldest
    state out to probation (in one walk, ``take_oldest_until``): the window never ends
    over its limit, however little.  States of 256 bytes, a limit one byte short of
    1,024 of them."""
    cache = polled_cache(limit=4 << 20)
    cache._window_limit = 1024 * 256 - 1
    state = bytes(215)
    cache.put_loaded_many([(oid, 9, state) for oid in range(1023)], snapshot=10)
    assert len(cache._window) == 1023 and not cache._probation
    cache.put_loaded_many([(5000, 9, state)], snapshot=10)
    assert list(cache._probation) == [0]
    assert list(cache._window) == [*range(1, 1023), 5000]
    assert cache._window_bytes == 1023 * 256 <= cache._window_limit
    assert_counts_add_up(cache)


def test_a_batch_is_roomy_only_while_it_fits() -> None:
    cache = StateCache(8 << 20)
    cache.after_poll(1, 1, [])
    assert cache._fits_without_eviction([(1, 1, bytes(100))])
    assert not cache._fits_without_eviction([(1, 1, bytes(8 << 20))])
    # Filled to within a batch's room of the limit, the next one is not roomy.
    oid = 0
    while cache._fits_without_eviction([(0, 1, bytes(200))] * 1000):
        cache.put_loaded_many([(oid + i, 1, bytes(200)) for i in range(1000)], 1)
        oid += 1000
    assert cache.bytes_used > cache.limit - 1000 * (200 + 300) - 4 * len(cache) \
        - 2 * (cache._window.table_bytes + cache._probation.table_bytes) \
        - 2 * cache._probation.chunk_size
    assert cache._fits_without_eviction([(0, 1, bytes(200))])


def test_peek_many_answers_as_get_without_counting_or_marking() -> None:
    cache = polled_cache()
    cache.put_loaded(1, 10, STATE, snapshot=10)
    cache.after_poll(10, 12, [(2, 11), (3, 12)])
    cache.put_revision(2, 11, b"two")
    cache.put_revision(3, 12, b"three")
    cache.put_revision(5, 13, b"five")          # a commit's own, not yet polled
    assert cache.peek_many([5], 12) == [None]
    cache.after_poll(12, 13, [(5, 13)])         # named: an exact revision it serves
    assert 5 not in cache._window and cache.peek_many([5], 13) == [b"five"]
    hits, misses = cache.hits, cache.misses
    assert cache.peek_many([1, 2, 3, 4], 12) == [STATE, b"two", b"three", None]
    assert cache.peek_many([1, 2, 3], 11) == [STATE, b"two", None]   # 3 changed after 11
    assert cache.peek_many([2], 10) == [None]                        # 2 changed after 10
    assert cache.peek_many([1], 9) == [None]                         # before the base
    assert (cache.hits, cache.misses) == (hits, misses)
    assert not cache._sketch.take_mark(1)
    for oid in (1, 2, 3, 4, 5):
        assert cache.has(oid, 13) == (cache.get(oid, 13) is not None)
    disabled = StateCache(0)
    assert disabled.peek_many([1, 2], 12) == [None, None]


def test_missing_names_the_oids_get_would_not_answer_in_their_order() -> None:
    cache = polled_cache()
    cache.put_loaded(1, 10, STATE, snapshot=10)
    cache.put_loaded(6, 10, STATE, snapshot=10)
    cache.after_poll(10, 12, [(2, 11), (3, 12), (6, 12)])   # 6 changed while held
    cache.put_revision(2, 11, b"two")
    cache.put_revision(3, 12, b"three")
    cache.put_revision(5, 13, b"five")          # a commit's own, not yet polled
    hits, misses = cache.hits, cache.misses
    assert cache.missing([4, 3, 2, 1, 5, 6], 12) == [4, 5, 6]
    assert cache.missing([1, 2, 3, 6], 11) == [3, 6]      # 3 and 6 changed after 11
    assert cache.missing(iter([2, 1]), 10) == [2]         # 2 changed after 10
    assert cache.missing([1, 7], 9) == [1, 7]             # before the base
    assert cache.missing([], 12) == []
    cache.put_loaded(6, 12, b"six", snapshot=12)          # its new revision, read
    assert cache.missing([6, 1], 12) == []
    cache.after_poll(12, 13, [(1, 13)])                   # held, changed at 13
    assert cache.missing([1, 6], 13) == [1] == cache.missing([1, 6], 12)
    assert (cache.hits, cache.misses) == (hits, misses)
    for oid in range(1, 8):
        for snapshot in (12, 13):
            assert cache.missing([oid], snapshot) == (
                [] if cache.has(oid, snapshot) else [oid]), (oid, snapshot)
    assert StateCache(0).missing([1, 2], 12) == [1, 2]


def test_a_batch_is_roomy_up_to_exactly_its_counted_need() -> None:
    """The estimate as documented: each state's pickle and ``ROOM_PER_STATE``, the
    window's table doubled, a chunk object for each chunk's worth the batch and the
    window write to probation's log and two more, and nothing for the sketch while the
    states stay within its width (65,536 counters at first; its growth past them:
    test_a_batch_the_room_says_fits_evicts_nothing); a batch fits when the count plus
    that is at most the limit."""
    from zodbsql.cache.statecache import ROOM_PER_STATE
    cache = StateCache(8 << 20)
    cache.after_poll(1, 1, [])
    cache.put_loaded_many([(oid, 1, bytes(300)) for oid in range(1, 20_000)], 1)
    assert len(cache._window) and len(cache._probation)
    rows = [(oid, 1, bytes(50 + oid % 7)) for oid in range(30_000, 30_500)]
    entries = len(cache._probation) + len(cache._protected) + len(cache._window) + len(rows)
    assert entries < 1 << cache._sketch.bits
    written = sum(len(state) for _, _, state in rows) + len(rows) * ROOM_PER_STATE
    opened = (written + cache._window_bytes) // cache._probation.chunk_size + 2
    need = written + 2 * cache._window.table_bytes + opened * CHUNK_OBJECT_BYTES
    cache.limit = cache._bytes() + need
    assert cache._fits_without_eviction(rows)
    cache.limit -= 1
    assert not cache._fits_without_eviction(rows)


def test_a_state_that_becomes_current_meets_admission_as_a_loaded_one() -> None:
    """A revision a poll named becomes current through ``_insert`` (a get that finds
    it, a commit's states read back): it waits in the window and must win admission
    like a loaded state, so a full cache turns away a run of them asked for once."""
    cache = polled_cache(limit=4 << 20)
    for oid in range(1 << 30, (1 << 30) + 30_000):       # more than fit
        cache.get(oid, 10)
        cache.put_loaded(oid, 9, STATE, snapshot=10)
    kept = [oid for oid in range(1 << 30, (1 << 30) + 30_000)
            if oid in cache._probation or oid in cache._protected]
    run = range(30_000)
    with cache._lock:
        for oid in run:
            cache._sketch.add(oid)
            cache._insert(oid, (9).to_bytes(8, "big") + STATE)
    assert sum(oid in cache._probation for oid in run) < 0.03 * len(run)
    assert sum(cache.has(oid, 10) for oid in kept) > 0.97 * len(kept)
    assert cache.bytes_used <= cache.limit


def test_a_hit_in_the_window_moves_nothing() -> None:
    """The window is first in, first out: a prefetch's batch waits there for its loads,
    and a state a load took leaves before those still waiting (an LRU put it behind
    them); what leaves meets admission by its count, which the hit raised."""
    cache = polled_cache(limit=4 << 20)
    for oid in range(3):
        cache.put_loaded(oid, 9, STATE, snapshot=10)
    assert cache.get(0, 10) == (STATE, 9)
    assert list(cache._window) == [0, 1, 2]
    assert cache._sketch.count(0) > cache._sketch.count(1)
    assert_counts_add_up(cache)


def test_a_deleted_object_leaves_even_at_the_same_poll_tid() -> None:
    """A deletion changes no tid: a poll at the newest tid polled (another instance's,
    after a pack) still takes its states out, and from then on every snapshot misses."""
    cache = polled_cache()
    cache.put_loaded(7, 3, STATE, snapshot=10)
    cache.put_loaded(8, 4, STATE, snapshot=10)
    cache.after_poll(10, 10, [], gone=[7], gone_seq=1)
    assert cache.get(7, 10) is None and cache.get(7, 12) is None
    assert cache.get(8, 10) == (STATE, 4)
    assert cache.position() == (10, 1)
    cache.put_loaded(7, 3, STATE, snapshot=10)      # a load read before the deletion
    assert cache.get(7, 10) is None
    cache.after_poll(10, 20, [], gone=[], gone_seq=1)
    assert cache.get(8, 20) == (STATE, 4)           # nothing more went


def test_deletions_no_poll_could_list_empty_the_cache() -> None:
    """Records pruned before the cache saw them (its newest record below the floor):
    what went is unknown, so nothing kept as current stays."""
    cache = polled_cache()
    cache.after_poll(10, 10, [], gone_seq=2)
    cache.put_loaded(7, 3, STATE, snapshot=10)
    cache.after_poll(10, 20, [], gone=[], gone_seq=9, gone_floor=2)
    assert cache.get(7, 20) == (STATE, 3)           # the floor is the cache's own
    cache.after_poll(20, 30, [], gone=[], gone_seq=12, gone_floor=10)
    assert cache.get(7, 30) is None
    assert (cache.base, cache.polled, cache.gone_seen) == (30, 30, 12)


def test_a_restore_counts_deletions_as_changes_and_refuses_pruned_ones() -> None:
    cache = StateCache(100_000)
    assert not cache.cover(5, 10, [], complete=False)
    assert cache.cover(5, 10, [(1, 7)], gone=[2], gone_seq=4)
    assert cache.position() == (10, 4)
    cache.adopt([(2, 6, (6).to_bytes(8, "big") + STATE),
                 (3, 6, (6).to_bytes(8, "big") + STATE)], as_of=8)
    assert cache.get(2, 10) is None                 # deleted since: not adopted
    assert cache.get(3, 10) == (STATE, 6)


def test_a_poll_without_deletion_records_keeps_what_is_cached() -> None:
    """A poll that names no record and no floor (a database without deletions) keeps
    what a cache that has seen record 0 holds: nothing was pruned before it."""
    cache = polled_cache()
    cache.after_poll(10, 10, [], gone_seq=0)
    cache.put_loaded(7, 3, STATE, snapshot=10)
    cache.after_poll(10, 20, [(8, 15)])
    assert cache.get(7, 20) == (STATE, 3)


def test_a_restore_counts_its_deletions_against_the_index_bound() -> None:
    """A restore whose changes and deletions together pass the index's bound is refused
    (its deletions counted in, not out): taken, the bound would empty the index of
    what it had just recorded while ``base`` still reached back to ``since``."""
    cache = StateCache(100_000)
    bound = cache._max_index
    half = bound // 2 + 1
    assert not cache.cover(5, 10, [(oid, 7) for oid in range(half)],
                           gone=list(range(half, 2 * half)), gone_seq=4)
    assert cache.position() == (None, None)


def test_deletions_fill_the_index_up_to_its_bound_exactly() -> None:
    """The index keeps as many entries as its bound, and is emptied (``base`` moved to
    the poll) only past it."""
    cache = polled_cache()
    bound = cache._max_index
    cache.after_poll(10, 20, [], gone=list(range(bound)), gone_seq=1)
    assert len(cache._changed) == bound and cache.base == 10
    cache.after_poll(20, 30, [], gone=[bound], gone_seq=2)
    assert not cache._changed and cache.base == 30


def test_a_newcomer_whose_mark_slot_another_state_set_enters_probation() -> None:
    """Marks share slots (``FrequencySketch.mark``): a newcomer that wins admission
    into a cache whose states are all protected enters probation, even when a hit on
    a protected state just set the mark slot it shares; only its own hit promotes it."""
    cache = every_state_protected()
    sketch = cache._sketch
    held = cache._protected.oldest()
    assert held is not None
    newcomer = 5000
    while True:                                    # an oid sharing the held one's slot
        sketch.mark(held)
        if sketch.take_mark(newcomer):
            break
        newcomer += 1
    for _ in range(6):                             # asked for often: wins admission
        assert cache.get(newcomer, 2) is None
    assert cache.get(held, 2) is not None          # sets the slot they share
    cache.put_loaded(newcomer, 1, STATE, snapshot=2)
    assert cache.has(newcomer, 2)
    assert newcomer in cache._probation and newcomer not in cache._protected
    assert cache.bytes_used <= cache.limit
    assert_counts_add_up(cache)


def test_a_newcomer_meets_probations_oldest_not_protecteds() -> None:
    """Leaving the window for a full cache, a newcomer is compared with probation's
    oldest state not asked for since it came in (``_turned_away``), not with
    protected's: asked for three times, it wins against a state asked for once,
    though every protected state was asked for more often than it."""
    cache = StateCache(256 * 1024)
    cache.after_poll(1, 1, [])
    for oid in range(300):                         # asked for six times: protected
        for _ in range(6):
            if cache.get(oid, 1) is None:
                cache.put_loaded(oid, 1, STATE, snapshot=1)
    for oid in range(10_000, 13_000):              # asked for once: probation, full
        assert cache.get(oid, 1) is None
        cache.put_loaded(oid, 1, STATE, snapshot=1)
    assert cache._probation and cache._protected
    assert cache.bytes_used > cache.limit - 2 * ENTRY
    newcomer = 20_000
    for _ in range(3):
        assert cache.get(newcomer, 1) is None
    cache.put_loaded(newcomer, 1, STATE, snapshot=1)
    assert cache.has(newcomer, 1)
    assert all(cache.has(oid, 1) for oid in range(300))
    assert cache.bytes_used <= cache.limit
    assert_counts_add_up(cache)


def test_the_sketch_grows_with_the_states_and_is_counted() -> None:
    """The frequency sketch starts small and widens as the cache holds more states
    (``_shrink``); what it takes then is in the count, so the bound still holds."""
    cache = StateCache(64 << 20)                  # room for 524,288 counters
    cache.after_poll(1, 1, [])
    bits, fixed = cache._sketch.bits, cache._fixed_bytes
    for oid in range(70_000):                     # past the 65,536 it starts with
        cache.put_loaded(oid, 1, STATE, snapshot=1)
    assert cache._sketch.bits > bits and cache._fixed_bytes > fixed
    assert cache.bytes_used <= cache.limit
    assert_counts_add_up(cache)


@pytest.mark.parametrize("full", [False, True])
def test_a_prefetch_keeps_the_largest_oid_an_entry_can_hold(full: bool) -> None:
    """``put_loaded_many`` keeps a state of the largest oid the logs' index takes
    (2**63 - 1), and not one above it, whether the batch fits at once or the cache is
    full and it enters state by state."""
    cache = StateCache(1 << 20)
    cache.after_poll(1, 1, [])
    if full:
        for oid in range(8000):
            cache.put_loaded(oid, 1, STATE, snapshot=1)
        assert cache.bytes_used > cache.limit - 2 * ENTRY
    cache.put_loaded_many([(LARGEST_OID, 1, STATE), (LARGEST_OID + 1, 1, STATE)], 1)
    assert cache.get(LARGEST_OID, 1) == (STATE, 1)
    assert cache.get(LARGEST_OID + 1, 1) is None
    assert cache.bytes_used <= cache.limit
    assert_counts_add_up(cache)


@pytest.mark.parametrize("policy", ["tinylfu", "lru"])
def test_hits_noted_in_bulk_leave_the_cache_as_get_s_hits_do(policy: str) -> None:
    """``note_hits`` (loads a storage instance served from a batch it held) counts,
    marks and, as one LRU, moves, as ``get`` would have for the same hits: two caches
    filled alike, one hit with ``get``, the other told, keep the same states through
    the same scan afterwards."""
    caches = []
    for telling in (False, True):
        cache = StateCache(64 * 1024)
        if policy == "lru":
            cache._policy_for_comparison("lru")
        cache.after_poll(1, 1, [])
        for oid in range(400):                    # fills it: probation and protected
            cache.put_loaded(oid, 1, STATE, snapshot=1)
        hit = [oid for oid in range(400) if oid % 3 == 0 and cache.has(oid, 1)]
        assert len(hit) > 50
        if telling:
            cache.note_hits([(oid, 1, STATE) for oid in hit], 1, cache.epoch)
        else:
            for oid in hit:
                assert cache.get(oid, 1) is not None
        caches.append(cache)
    plain, told = caches
    assert told.hits == plain.hits == len(hit) and told.misses == plain.misses == 0
    assert plain._sketch.rows == told._sketch.rows and plain._sketch.marks == told._sketch.marks
    scan = 600 if policy == "tinylfu" else 150    # LRU: the moved hits outlive it
    for cache in caches:
        for oid in range(1000, 1000 + scan):      # a scan after the hits
            if cache.get(oid, 1) is None:
                cache.put_loaded(oid, 1, STATE, snapshot=1)
    assert ([oid for oid in range(400) if plain.has(oid, 1)]
            == [oid for oid in range(400) if told.has(oid, 1)])
    assert any(told.has(oid, 1) for oid in hit)


@pytest.mark.parametrize("with_one_let_go", [False, True])
def test_hits_noted_in_bulk_mark_protected_states_as_get_does(with_one_let_go: bool) -> None:
    """A hit on a state in protected marks it (its second chance), told or not: in
    bulk when all are held, state by state when one of them is not (it enters)."""
    plain, told = every_state_protected(), every_state_protected()
    hit = [oid for oid in range(2000) if told._protected.holds(oid)][::3]
    assert len(hit) > 50
    if with_one_let_go:
        hit.insert(len(hit) // 2, 5_000)          # never held: offered, as a miss's
    asked, hits = plain.hits + plain.misses, told.hits
    for oid in hit:
        if plain.get(oid, 2) is None:
            plain.put_loaded(oid, 1, STATE, snapshot=2)
    told.note_hits([(oid, 1, STATE) for oid in hit], 2, told.epoch)
    assert plain._sketch.rows == told._sketch.rows and plain._sketch.marks == told._sketch.marks
    assert plain.hits + plain.misses - asked == told.hits - hits == len(hit)
    assert ([oid for oid in range(6000) if plain.has(oid, 2)]
            == [oid for oid in range(6000) if told.has(oid, 2)])


def test_a_hit_is_counted_even_where_the_cache_is_too_small_to_keep_it() -> None:
    cache = StateCache(1)
    cache.after_poll(10, 10, [])
    cache.note_hits([(7, 3, STATE)], 10, cache.epoch)
    assert cache.hits == 1 and not cache.has(7, 10)


def test_a_hit_noted_for_a_state_the_cache_no_longer_holds_puts_it_back() -> None:
    """As the load it replaced would have (a miss, then ``put_loaded``), at the
    snapshot the cache is polled to only."""
    cache = polled_cache()
    cache.note_hits([(7, 3, STATE)], 10, cache.epoch)
    assert cache.get(7, 10) == (STATE, 3)
    cache.note_hits([(8, 3, STATE)], 9, cache.epoch)    # an older snapshot: not vouched for
    assert not cache.has(8, 10)
    assert cache.hits == 3 and cache.misses == 0
    epoch = cache.epoch
    cache.clear()
    cache.after_poll(10, 10, [])
    cache.note_hits([(9, 3, STATE)], 10, epoch)         # read before the clear: counted only
    assert not cache.has(9, 10) and cache.hits == 4


@pytest.mark.parametrize("saved_by,read_by", [("off", "zstd"), ("zstd", "off"), ("zstd", "zstd"),
                                             ("auto", "zstd"), ("zstd", "auto")])
def test_saved_states_read_back_with_either_compression(saved_by: str, read_by: str) -> None:
    """What the persistent cache saves (``current_states``) is tid + state as it came,
    and ``adopt`` takes it into a cache of either setting, which serves it whole."""
    states = {oid: b"%d" % oid + bytes(oid % 3 * 100) for oid in range(1, 400)}
    saving = StateCache(1 << 20, compress=saved_by)
    saving.after_poll(-1, 10, [])
    for oid, state in states.items():
        saving.put_loaded(oid, 5, state, 10)
    polled, kept = saving.current_states()
    assert polled == 10 and len(kept) == len(states)
    assert all(value == (5).to_bytes(8, "big") + states[oid] for oid, value in kept)
    reading = StateCache(1 << 20, compress=read_by)
    reading.after_poll(-1, 10, [])
    taken, more = reading.adopt([(oid, 5, value) for oid, value in kept], 10)
    assert taken == len(states) and more
    for oid, state in states.items():
        assert reading.get(oid, 10) == (state, 5)
    assert_counts_add_up(reading)


def test_a_compressed_cache_keeps_a_batch_larger_than_its_window() -> None:
    """What a batch sends on to probation is packed there, and all of it is kept and
    served whole (the window keeps the newest as they came)."""
    cache = StateCache(4 << 20, compress="zstd")
    cache.after_poll(-1, 10, [])
    states = {oid: b"%d" % oid + bytes(300) for oid in range(3000)}
    cache.put_loaded_many([(oid, 9, state) for oid, state in states.items()], snapshot=10)
    assert len(cache) == len(states) and len(cache._probation) > 0 and len(cache._window) > 0
    assert all(value[8] == 0 for value in cache._probation.values())    # packed (TAG_ZSTD)
    for oid, state in states.items():
        assert cache.get(oid, 10) == (state, 9)
    assert_counts_add_up(cache)


@pytest.mark.parametrize("segment", ["probation", "protected"])
@pytest.mark.parametrize("held", [1000, SKETCH_START])
def test_a_batch_the_room_says_fits_evicts_nothing(segment: str, held: int) -> None:
    """``_fits_without_eviction`` lets a batch skip admission because nothing will be
    evicted for it: with the bound set to exactly the room it counts, one more state
    enters and every state held stays, also when it takes the count past the sketch's
    width and the sketch doubles twice on the way (590 KB, which the room once counted
    as 4 bytes an entry), and whichever segment holds the states."""
    cache = StateCache(64 << 20)
    cache._window_limit = 0
    cache.after_poll(1, 1, [])
    cache.put_loaded_many([(oid, 1, b"s" * 20) for oid in range(held)], snapshot=1)
    if segment == "protected":
        for oid in range(held):
            protect(cache, oid)
    assert len(getattr(cache, f"_{segment}")) == held
    rows = [(held + 10, 1, b"t" * 20)]
    cache.limit = cache._bytes() + cache._room_for(rows)
    width = 1 << cache._sketch.bits
    cache.put_loaded_many(rows, snapshot=1)
    assert cache.has(held + 10, 1)
    assert all(cache.has(oid, 1) for oid in range(held))
    assert (1 << cache._sketch.bits) == (4 * width if held == SKETCH_START else width)
    assert cache.bytes_used <= cache.limit
    assert_counts_add_up(cache)


def test_what_the_sketch_says_it_grows_by_is_what_it_grows_by() -> None:
    """``growth_bytes`` (what the room of a batch counts for the sketch) against
    ``grow`` itself, at and around each power of two."""
    for entries in (1, 63, 64, 65, 127, 128, 129, 1000, 4095, 4096, 4097,
                    65535, 65536, 65537, 131072, 131073):
        sketch = FrequencySketch(64)
        before = sketch.size_bytes
        said = sketch.growth_bytes(entries)
        sketch.grow(entries)
        assert sketch.size_bytes - before == said, entries
        assert sketch.growth_bytes(entries) == 0        # grown: nothing more to add
        # A counter for each entry, in the narrowest power of two above 64 that has it.
        width = 1 << sketch.bits
        assert width >= entries and (width == 64 or width // 2 < entries), entries
