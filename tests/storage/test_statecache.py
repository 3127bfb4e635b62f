"""StateCache on its own: what it remembers, for which snapshots, and how much.

The storage-level tests (test_snapshots.py, the model test) show no connection reads
outside its snapshot; these pin the cache's own rules: the index is reset by a poll
that leaves a gap or grows it past its bound, states larger than a quarter of the cache
are not kept, the memory bound holds (counted as CPython allocates, checked with
tracemalloc), a state asked for often survives a scan, a poll retires the states it
names, and the hit and miss counters count.
"""
from __future__ import annotations

import tracemalloc

from zodbsql.cache.statecache import StateCache

STATE = b"s" * 100
ENTRY = len(STATE) + 64


def polled_cache(limit: int = 100_000) -> StateCache:
    cache = StateCache(limit)
    cache.after_poll(10, 10, [])                 # the first poll: index starts at 10
    return cache


def test_first_poll_starts_the_index() -> None:
    cache = StateCache(100_000)
    cache.after_poll(0, 0, [])                   # an empty database: last tid 0
    assert (cache.base, cache.polled) == (0, 0)
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
    assert 0 < empty < 4096                       # the sketch and four empty dicts
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
    for oid in range(400):
        if cache.get(oid, 1) is None:
            cache.put_loaded(oid, 1, STATE, snapshot=1)
    assert 150 < len(cache) < 200                 # 400 is more than twice that
    kept = len(cache)
    for oid in range(400):
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


def test_large_states_are_not_kept() -> None:
    cache = StateCache(4 * 1000 + 3)
    cache.after_poll(1, 1, [])
    cache.put_loaded(1, 1, b"x" * 1000, snapshot=1)   # a quarter: kept
    cache.put_loaded(2, 1, b"x" * 1001, snapshot=1)   # more: not kept
    assert cache.get(1, 1) == (b"x" * 1000, 1)
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
