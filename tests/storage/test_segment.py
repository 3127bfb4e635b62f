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


def test_push_behind_puts_entries_at_the_oldest_end_the_last_oldest() -> None:
    segment = Segment(batch=8)
    for key in (10, 11):
        segment.push(key, b"v")
    assert segment.oldest() == 10
    segment.push_behind([(5, b"a"), (6, b"b")])   # 6 is the oldest, then 5
    assert [segment.pop_oldest()[0] for _ in range(4)] == [6, 5, 10, 11]


def test_trim_gives_back_a_table_deletions_emptied_and_leaves_a_normal_one() -> None:
    segment = Segment(batch=8)
    for key in range(10_000):
        segment.push(key, b"v")
    for key in range(9_990):
        del segment[key]
    emptied = sys.getsizeof(segment.entries)
    segment.trim()
    assert sys.getsizeof(segment.entries) < emptied // 10
    assert segment.table_bytes == sys.getsizeof(segment.entries)   # the kept size follows
    assert list(segment) == list(range(9_990, 10_000))
    # A table at its normal size is left as it is, with the batch already read.
    assert segment.oldest() == 9_990
    segment.trim()
    assert segment._next                          # not written again


def test_the_size_counts_a_full_batch_of_oldest_keys() -> None:
    """A batch read never adds to the count: it is counted as full from the start."""
    segment = Segment(batch=256)
    for key in range(1000):
        segment.push(key, b"v")
    counted = segment.size_bytes
    assert segment.oldest() == 0                  # reads 256 oldest keys
    assert counted == segment.size_bytes
    assert counted >= sys.getsizeof(segment.entries) + sys.getsizeof(segment._next)


@pytest.mark.parametrize("seed", range(20))
def test_pop_oldest_until_removes_what_pop_oldest_would(seed: int) -> None:
    """The oldest entries until their cost reaches the excess, the same as popping
    them one at a time, with a batch of oldest keys read and partly stale (keys that
    left, keys that came back) and a cost that varies by entry."""
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
    freed = bulk.pop_oldest_until(excess, len)
    popped = 0
    while popped < excess and single:
        popped += len(single.pop_oldest()[1])
    assert freed == popped
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
    segment.push_behind([(-1, b"x"), (-2, b"y")])
    segment.touch(5)
    segment.pop_oldest_until(100, len)
    for key in range(500, 1500):
        del segment[key]
    segment.trim()
    gc.collect()
    assert segment.entries
    assert not [referent for referent in gc.get_referents(segment)
                if gc.is_tracked(referent) and referent is not Segment]
