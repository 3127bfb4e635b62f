"""The state cache's segments: insertion-ordered dicts that hand out their oldest keys
in batches (``cache/segment.py``)."""
from __future__ import annotations

import gc
import random
import sys

import pytest

from zodbsql.cache.segment import Segment


def test_a_key_that_leaves_and_comes_back_is_newest_though_its_batch_was_read() -> None:
    segment = Segment(batch=256)
    for key in range(1, 301):
        segment.push(key, b"v")
    assert segment.oldest() == 1                  # reads the batch: 1 .. 256
    segment.touch(2)                              # 2 moves to the newest end
    value = segment.pop(3)
    segment.push(3, value)                        # 3 leaves and comes back
    order = [segment.pop_oldest()[0] for _ in range(len(segment))]
    assert order == [1, *range(4, 301), 2, 3]
    assert segment.oldest() is None


def test_a_key_that_comes_back_in_a_batch_is_newest_though_its_batch_was_read() -> None:
    """``push_many`` strikes its keys from the batch of oldest keys, as ``push`` does."""
    segment = Segment(batch=8)
    segment.push_many({key: b"v" for key in range(1, 6)})
    assert segment.oldest() == 1                  # reads the batch: 1 .. 5
    value = segment.pop(2)
    segment.push_many({2: value, 6: b"w"})        # 2 comes back with a new key
    assert segment.table_bytes == sys.getsizeof(segment.entries)
    assert [segment.pop_oldest()[0] for _ in range(len(segment))] == [1, 3, 4, 5, 2, 6]


def test_the_size_counts_a_full_batch_of_oldest_keys() -> None:
    """A batch read never adds to the count: it is counted as full from the start."""
    segment = Segment(batch=256)
    for key in range(1000):
        segment.push(key, b"v")
    counted = segment.size_bytes
    assert segment.oldest() == 0                  # reads 256 oldest keys
    assert counted == segment.size_bytes
    assert counted >= sys.getsizeof(segment.entries) + sys.getsizeof(segment._next)


@pytest.mark.parametrize("taking", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_pop_oldest_until_removes_what_pop_oldest_would(seed: int, taking: bool) -> None:
    """The oldest entries until their cost reaches the excess, the same as popping
    them one at a time, with a batch of oldest keys read and partly stale (keys that
    left, keys that came back) and a cost that varies by entry; ``take_oldest_until``
    returns those entries, oldest first."""
    rng = random.Random(seed)
    made = [Segment(batch=4), Segment(batch=4)]
    for step in range(rng.randint(0, 60)):
        key = rng.randrange(40)
        touch = rng.random() < 0.5
        for segment in made:
            if key in segment:
                if touch:
                    segment.touch(key)
                else:
                    del segment[key]
            else:
                segment.push(key, bytes(key % 7 + 1))
        if rng.random() < 0.3:
            for segment in made:
                segment.oldest()          # reads a batch, which later steps make stale
    bulk, single = made
    excess = rng.randint(-2, 60)
    if taking:
        taken, freed = bulk.take_oldest_until(excess, len)
    else:
        freed = bulk.pop_oldest_until(excess, len)
    popped = 0
    singles: list[tuple[int, bytes]] = []
    while popped < excess and single:
        singles.append(single.pop_oldest())
        popped += len(singles[-1][1])
    assert freed == popped
    if taking:
        assert list(taken.items()) == singles
    assert list(bulk.items()) == list(single.items())
    # The batch is still right: what comes out next, and after new keys, agrees.
    for segment in made:
        segment.push(100, b"new")
    while single:
        assert bulk.pop_oldest() == single.pop_oldest()
    assert not bulk


def test_the_collector_never_walks_a_segments_entries() -> None:
    """A segment's entries are ints and bytes in a plain dict, which CPython's collector
    leaves untracked: a full collection never visits the cache's states (a dict
    subclass is walked entry by entry, 7 ms a collection for 200,000 states)."""
    segment = Segment(batch=8)
    for key in range(1000):
        segment.push(key, b"v")
    segment.push_many({key: b"w" for key in range(1000, 2000)})
    segment.touch(5)
    segment.pop_oldest_until(100, len)
    for key in range(500, 1500):
        del segment[key]
    gc.collect()
    assert segment.entries
    assert not [referent for referent in gc.get_referents(segment)
                if gc.is_tracked(referent) and referent is not Segment]
