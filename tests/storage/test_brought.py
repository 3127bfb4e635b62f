"""``Brought``: a storage instance's hold on what its prefetches brought, by snapshot,
bounded in bytes, its hits counted in the shared cache in bulk."""
from __future__ import annotations

from zodbsql.cache.brought import HELD_ENTRY_BYTES, NOTE_EVERY, Brought, held_cost

#: Room for two held states and 20 bytes of their pickles.
TWO_AND_20 = 2 * HELD_ENTRY_BYTES + 20


class Counting:
    """Stands in for the shared cache's ``note_hits``: what it was told, in order."""

    def __init__(self) -> None:
        self.epoch = 0
        self.epochs: list[int] = []
        self.noted: list[list[int]] = []
        self.rows: list[tuple[int, int, bytes]] = []
        self.snapshots: list[int] = []

    def note_hits(self, rows: list[tuple[int, int, bytes]], snapshot: int,
                  epoch: int) -> None:
        self.epochs.append(epoch)
        self.noted.append([oid for oid, _, _ in rows])
        self.rows += rows
        self.snapshots.append(snapshot)


def test_a_state_is_given_once_and_only_at_its_snapshot() -> None:
    cache = Counting()
    held = Brought(cache, 1000)
    held.add([(1, 5, b"one"), (2, 5, b"two")], snapshot=7)
    assert held.take(1, 7) == (b"one", 5)
    assert held.take(1, 7) is None                  # given once
    assert held.take(2, 8) is None                  # another snapshot: all forgotten
    assert held.states == {}
    assert held.take(2, 7) is None
    assert cache.noted == [[1]]                     # the hit, counted when dropped
    assert cache.rows == [(1, 5, b"one")] and cache.snapshots == [7]   # at its snapshot


def test_nothing_held_is_given_after_the_shared_cache_was_cleared() -> None:
    """A clear (a reset: the database went back in time) ends what was held; the hits
    served before it are told with the epoch they were served in."""
    cache = Counting()
    held = Brought(cache, 1000)
    held.add([(1, 5, b"one"), (2, 5, b"two")], snapshot=7)
    assert held.take(1, 7) == (b"one", 5)
    cache.epoch += 1                                # the cache is cleared
    held.add([(3, 5, b"three")], snapshot=7)        # a batch after it, same snapshot
    assert held.states == {3: (b"three", 5)}
    assert cache.noted == [[1]] and cache.epochs == [0]
    assert held.take(3, 7) == (b"three", 5)
    cache.epoch += 1
    assert held.take(2, 7) is None and held.states == {}
    assert cache.noted == [[1], [3]] and cache.epochs == [0, 1]


def test_a_new_snapshot_s_batch_replaces_the_old() -> None:
    cache = Counting()
    held = Brought(cache, 1000)
    held.add([(1, 5, b"one")], snapshot=7)
    held.add([(2, 9, b"two")], snapshot=9)
    assert held.states == {2: (b"two", 9)}
    assert held.take(2, 9) == (b"two", 9)


def test_hits_are_counted_every_note_every_and_when_asked() -> None:
    cache = Counting()
    held = Brought(cache, 1 << 20)
    held.add([(oid, 1, b"s") for oid in range(NOTE_EVERY + 3)], snapshot=1)
    for oid in range(NOTE_EVERY + 2):
        held.take(oid, 1)
    assert cache.noted == [list(range(NOTE_EVERY))]
    held.note()
    assert cache.noted[1:] == [[NOTE_EVERY, NOTE_EVERY + 1]]
    held.note()                                     # nothing new: nothing told
    assert len(cache.noted) == 2


def test_what_is_held_stays_within_the_prefetch_bytes() -> None:
    held = Brought(Counting(), TWO_AND_20)
    held.add([(1, 1, b"x" * 8), (2, 1, b"x" * 8)], snapshot=1)          # 16 of 20
    assert set(held.states) == {1, 2}
    held.add([(3, 1, b"x" * 8)], snapshot=1)                            # 24: replaces
    assert set(held.states) == {3}
    held.take(3, 1)                                                     # 0 held again
    held.add([(4, 1, b"x" * 12), (5, 1, b"x" * 8)], snapshot=1)         # 20 fits
    assert set(held.states) == {4, 5}
    held.add([(6, 1, b"x" * (TWO_AND_20 - HELD_ENTRY_BYTES + 1))], snapshot=1)
    assert held.states == {}                                            # alone too big


def test_a_held_state_costs_its_pickle_and_what_python_spends_around_it() -> None:
    """The pickles alone let a process hold 2.2 times the bound (states of 175 bytes):
    the bound counts each state's tuple, ints, header and dict slot too."""
    assert held_cost(b"x" * 175) == 175 + HELD_ENTRY_BYTES
    held = Brought(Counting(), 10 * held_cost(b"x" * 100))
    held.add([(oid, 1, b"x" * 100) for oid in range(10)], snapshot=1)
    assert len(held.states) == 10
    held.add([(10, 1, b"x")], snapshot=1)                               # one too many
    assert set(held.states) == {10}
    held = Brought(Counting(), 10 * held_cost(b"x" * 100))
    held.add([(oid, 1, b"x" * 100) for oid in range(11)], snapshot=1)  # 11 alone
    assert held.states == {}


def test_a_state_brought_again_is_counted_once() -> None:
    held = Brought(Counting(), TWO_AND_20)
    held.add([(1, 1, b"x" * 8)], snapshot=1)
    held.add([(1, 1, b"x" * 8)], snapshot=1)       # once held, not twice: the next fits
    held.add([(2, 1, b"x" * 12)], snapshot=1)
    assert set(held.states) == {1, 2}


def test_nothing_is_held_with_prefetch_bytes_zero() -> None:
    held = Brought(Counting(), 0)
    held.add([(1, 1, b"x")], snapshot=1)
    assert held.states == {}


def test_the_bound_counts_what_is_still_held() -> None:
    """Taken states give their bytes back, batches add theirs: what decides whether
    the next batch joins the rest or replaces it."""
    held = Brought(Counting(), TWO_AND_20)
    held.add([(1, 1, b"x" * 6), (2, 1, b"x" * 8)], snapshot=1)         # 14
    held.take(1, 1)                                                     # 8 left
    held.add([(3, 1, b"x" * 12)], snapshot=1)                           # 20: joins
    assert set(held.states) == {2, 3}
    held = Brought(Counting(), TWO_AND_20)
    held.add([(1, 1, b"x" * 6), (2, 1, b"x" * 8)], snapshot=1)
    held.take(1, 1)
    held.add([(3, 1, b"x" * 13)], snapshot=1)                           # 21: replaces
    assert set(held.states) == {3}
    held = Brought(Counting(), TWO_AND_20)
    for oid in (1, 2):
        held.add([(oid, 1, b"x" * 8)], snapshot=1)                      # 16 in two
    held.add([(3, 1, b"x" * 8)], snapshot=1)                            # 24: replaces
    assert set(held.states) == {3}
