"""The client's lookahead at a miss: the uncached oids after it, found through the cached
states of its parent (``zodbsql.cache.lookahead``), without a database.

A "cache" here is a dict of oid -> state, and a state is the tuple of the oids it refers
to, turned into bytes only so that its length stands for the size of a pickle."""
from __future__ import annotations

from typing import Sequence

from zodbsql.cache import lookahead
from zodbsql.cache.lookahead import MAX_LOOKED_INTO, ReferenceMemo, uncached_after
from zodbsql.cache.prefetch import Prefetcher
from zodbsql.backends.base.mover import NO_PARENT

GRAPH: dict[int, tuple[int, ...]] = {}


def state(*refs: int, size: int = 16) -> bytes:
    """A state that refers to ``refs`` (looked up in ``GRAPH`` by its first byte)."""
    key = len(GRAPH) + 1
    GRAPH[key] = refs
    return bytes([key % 256]) + key.to_bytes(4, "big") + b"." * max(0, size - 5)


def refs_of(oid: int, value: bytes) -> list[int]:
    return sorted(GRAPH[int.from_bytes(value[1:5], "big")])


def run(oid: int, parents: Sequence[int], count: int, cache: dict[int, bytes],
        references=refs_of) -> tuple[int | None, list[int]]:
    return uncached_after(oid, parents, count, states_in(cache), references)


def states_in(cache: dict[int, bytes]):  # type: ignore[no-untyped-def]
    return lambda oids: [cache.get(each) for each in oids]


def buckets(cached_items: set[int]) -> dict[int, bytes]:
    """Three buckets 100, 200, 300 chained (each refers to its items and the next one),
    items 101-105, 201-205, 301-305; the buckets are cached, and the items named."""
    cache = {100: state(101, 102, 103, 104, 105, 200),
             200: state(201, 202, 203, 204, 205, 300),
             300: state(301, 302, 303, 304, 305)}
    for item in cached_items:
        cache[item] = state()
    return cache


def test_the_uncached_after_the_miss_in_its_parent_then_in_the_next_buckets() -> None:
    cache = buckets({102, 104, 202, 203, 301})
    parent, found = run(101, [NO_PARENT, 100], 100, cache)
    assert parent == 100
    # 102 and 104 are cached; 200 is cached and looked into, then 300.
    assert found == [103, 105, 201, 204, 205, 302, 303, 304, 305]


def test_at_most_count_oids() -> None:
    cache = buckets(set())
    assert run(101, [100], 3, cache) == (100, [102, 103, 104])


def test_the_parent_is_the_newest_candidate_that_refers_to_the_miss() -> None:
    cache = buckets(set())
    cache[50] = state(101, 999)       # another cached state that refers to 101
    assert run(101, [50, 100], 10, cache)[0] == 100
    assert run(101, [100, 50], 10, cache) == (50, [999])


def test_no_parent_when_none_is_cached_or_refers_to_the_miss() -> None:
    cache = buckets(set())
    assert run(101, [200, 300, NO_PARENT], 10, cache) == (None, [])
    del cache[100]
    assert run(101, [100], 10, cache) == (None, [])


def test_nothing_wanted_brings_nothing() -> None:
    assert run(101, [100], 0, buckets(set()))[1] == []


def test_a_cycle_ends() -> None:
    cache = {1: state(2, 3), 3: state(1, 4)}
    assert run(2, [1], 10, cache) == (1, [4])


def test_a_state_too_large_for_what_is_wanted_is_not_read() -> None:
    wanted = 4
    big = wanted * lookahead.BYTES_READ_PER_OID + 1
    cache = {1: state(2, 3, 4, size=big)}
    assert run(2, [1], wanted, cache) == (None, [])
    cache = {1: state(2, 3, 4, size=big - 1)}
    assert run(2, [1], wanted, cache) == (1, [3, 4])
    # Nor a cached sibling that large.
    cache = {1: state(2, 3, 5), 3: state(6, size=big), 5: state(7)}
    assert run(2, [1], wanted, cache) == (1, [7])


def test_no_state_larger_than_largest_read_is_read() -> None:
    cache = {1: state(2, 3, 4, size=4097)}
    assert uncached_after(2, [1], 10_000, states_in(cache), refs_of, 4096) == (None, [])
    assert uncached_after(2, [1], 10_000, states_in(cache), refs_of) == (1, [3, 4])
    cache = {1: state(2, 3, 4, size=4096)}
    assert uncached_after(2, [1], 10_000, states_in(cache), refs_of, 4096) == (1, [3, 4])


def test_at_most_max_looked_into_states_with_references_are_read() -> None:
    # A chain of cached buckets, each with one uncached item, longer than the limit.
    cache: dict[int, bytes] = {}
    length = MAX_LOOKED_INTO + 5
    for index in range(length):
        bucket = 1000 + index
        cache[bucket] = state(10_000 + index, bucket + 1)
    cache[1] = state(2, 1000)
    parent, found = run(2, [1], 10_000, cache)
    assert parent == 1
    # Bucket 1000 and the next MAX_LOOKED_INTO - 1 are read; the next ones are cached
    # and not read: their items wait for a later miss.
    assert found == [10_000 + index for index in range(MAX_LOOKED_INTO)]


def test_leaves_do_not_count_against_the_limit() -> None:
    cache = {1: state(*range(2, 2 + 2 * MAX_LOOKED_INTO), 500)}
    for leaf in range(3, 2 + 2 * MAX_LOOKED_INTO):
        cache[leaf] = state()
    cache[500] = state(501)
    assert run(2, [1], 10, cache) == (1, [501])


def test_the_memo_reads_a_state_once_and_again_when_it_changed() -> None:
    calls: list[int] = []

    def counted(oid: int, value: bytes) -> set[int]:
        calls.append(oid)
        return set(refs_of(oid, value))

    memo = ReferenceMemo(counted)
    first = state(3, 2)
    assert memo(1, first) == [2, 3]
    assert memo(1, bytes(first)) == [2, 3]
    assert calls == [1]
    assert memo(1, state(4)) == [4]
    assert calls == [1, 1]
    # A leaf is not remembered (its reading costs a byte search).
    leaf = state()
    memo(9, leaf)
    memo(9, leaf)
    assert calls == [1, 1, 9, 9]


def counting_memo() -> tuple[ReferenceMemo, list[int]]:
    """A memo of states that each refer to the next oid, and the oids it read."""
    calls: list[int] = []

    def counted(oid: int, value: bytes) -> set[int]:
        calls.append(oid)
        return {oid + 1}
    return ReferenceMemo(counted), calls


def test_the_memo_keeps_exactly_the_newest_memo_states() -> None:
    memo, calls = counting_memo()
    for oid in range(lookahead.MEMO_STATES):
        memo(oid, b"s")
    memo(0, b"s")                          # the oldest of exactly MEMO_STATES: kept
    assert calls.count(0) == 1
    memo(lookahead.MEMO_STATES, b"s")      # one more: the first read (0) goes
    memo(lookahead.MEMO_STATES, b"s")      # the newest: remembered
    assert calls.count(lookahead.MEMO_STATES) == 1
    memo(1, b"s")
    assert calls.count(1) == 1
    memo(0, b"s")
    assert calls.count(0) == 2


def test_the_parent_found_last_is_offered_after_recent_states_push_it_out() -> None:
    prefetcher = Prefetcher(1000, 1 << 20)
    prefetcher.note_hit(100)
    assert prefetcher.parents()[-1] == 100
    prefetcher.note_parent(100)
    for item in range(200, 240):
        prefetcher.note_hit(item)
    parents = prefetcher.parents()
    assert 100 == parents[-1]
    assert len(parents) == len(set(parents)) or NO_PARENT in parents
    assert parents[:-1] == list(range(240 - len(parents) + 1, 240))


def test_the_uncached_before_the_miss_come_after_those_after_it() -> None:
    """A BTree's next bucket may have an older oid than the items of this one."""
    cache = buckets({102})
    cache[90] = state(101, 102, 103, 104, 105, 80)      # next bucket 80, older
    assert run(103, [90], 4, cache) == (90, [104, 105, 80, 101])


def test_only_the_first_references_before_the_miss_are_looked_through() -> None:
    """Of the parent's references before the miss, only the first ``FIRST_BEFORE`` are
    asked about: the last miss of a forward walk over 1,000 children asked about the
    900 read before it, all cached."""
    from zodbsql.cache.lookahead import FIRST_BEFORE
    children = list(range(1000, 2000))
    cache = {child: state() for child in children[:900]}
    cache[1] = state(*children)
    asked: list[int] = []

    def counted(oids: Sequence[int]) -> list[bytes | None]:
        asked.extend(oids)
        return [cache.get(each) for each in oids]
    del cache[children[3]]                          # among the first: found
    del cache[children[FIRST_BEFORE + 5]]           # further on: not looked at
    parent, found = uncached_after(children[900], [1], 500, counted, refs_of)
    assert (parent, found) == (1, [*children[901:], children[3]])
    assert sorted(asked) == sorted([1, *children[901:], *children[:FIRST_BEFORE]])


def test_the_cache_is_asked_a_slice_at_a_time_until_the_batch_is_full() -> None:
    children = list(range(1000, 3000))
    cache = {1: state(*children)}
    asked: list[int] = []

    def states(oids: Sequence[int]) -> list[bytes | None]:
        asked.extend(oids)
        return [cache.get(each) for each in oids]
    assert uncached_after(1000, [1], 3, states, refs_of, None) == (1, [1001, 1002, 1003])
    assert len(asked) == 1 + lookahead.PEEKED_TOGETHER
    asked.clear()
    count = lookahead.PEEKED_TOGETHER + 5
    assert uncached_after(1000, [1], count, states, refs_of, None)[1] == children[1:count + 1]
    assert len(asked) == 1 + 2 * lookahead.PEEKED_TOGETHER


def test_the_root_can_be_the_parent_and_an_uncached_candidate_is_passed_over() -> None:
    cache = {0: state(5, 6, 7), 6: state()}
    assert run(5, [0, 42], 10, cache) == (0, [7])          # 42 is not cached
    cache[42] = state(5, 9, size=4096 * 100)               # too large for 10 wanted
    assert run(5, [0, 42], 10, cache) == (0, [7])


def test_a_single_state_wanted_is_found() -> None:
    assert run(101, [100], 1, buckets(set())) == (100, [102])


def test_a_cached_sibling_of_exactly_the_largest_size_is_looked_into() -> None:
    wanted = 4
    largest = wanted * lookahead.BYTES_READ_PER_OID
    cache = {1: state(2, 3, size=largest), 3: state(8, size=largest)}
    assert run(2, [1], wanted, cache) == (1, [8])


def test_it_stops_after_max_barren_slices_of_cached_references_in_a_row() -> None:
    # The miss's parent names five cached containers, each of cached leaves (one slice
    # of references each); the fifth also has an uncached child, which four barren
    # slices in a row never reach.
    from zodbsql.cache.lookahead import MAX_BARREN
    cache: dict[int, bytes] = {}
    containers = [100 * (index + 1) for index in range(MAX_BARREN + 1)]
    for container in containers:
        for leaf in range(container + 1, container + 11):
            cache[leaf] = state()
        cache[container] = state(*range(container + 1, container + 11))
    last = containers[-1]
    cache[last] = state(*range(last + 1, last + 11), last + 50)
    cache[1] = state(2, *containers)
    assert run(2, [1], 100, cache) == (1, [])
    # One uncached oid among them and the count starts again: the fifth is reached.
    del cache[containers[1] + 5]
    assert run(2, [1], 100, cache) == (1, [containers[1] + 5, last + 50])


def test_the_parents_own_references_are_never_barren() -> None:
    # A parent of more cached children than MAX_BARREN slices, then an uncached one.
    from zodbsql.cache.lookahead import MAX_BARREN, PEEKED_TOGETHER
    children = list(range(10, 10 + (MAX_BARREN + 2) * PEEKED_TOGETHER))
    cache = {child: state() for child in children}
    cache[1] = state(2, *children, 9_000)
    assert run(2, [1], 10, cache) == (1, [9_000])


def test_it_asks_about_max_examined_oids_at_most() -> None:
    from zodbsql.cache.lookahead import MAX_EXAMINED, PEEKED_TOGETHER
    children = list(range(10, 10 + 2 * MAX_EXAMINED))
    cache = {child: state() for child in children}
    cache[1] = state(2, *children)
    asked: list[int] = []

    def counted(oids: Sequence[int]) -> list[bytes | None]:
        asked.extend(oids)
        return [cache.get(each) for each in oids]
    far = children[MAX_EXAMINED + PEEKED_TOGETHER]
    del cache[far]
    assert uncached_after(2, [1], 10, counted, refs_of) == (1, [])
    # (and the parent itself, asked for first)
    assert MAX_EXAMINED - PEEKED_TOGETHER < len(asked) - 1 <= MAX_EXAMINED
    near = children[MAX_EXAMINED - 2 * PEEKED_TOGETHER - 3]
    del cache[near]
    assert uncached_after(2, [1], 10, states_in(cache), refs_of) == (1, [near])


def test_states_the_caller_calls_leaves_are_never_read() -> None:
    cache = buckets({102, 104})
    read: list[int] = []

    def counted(oid: int, value: bytes) -> list[int]:
        read.append(oid)
        return refs_of(oid, value)
    assert uncached_after(101, [100], 100, states_in(cache), counted) == (
        100, [103, 105, 201, 202, 203, 204, 205, 301, 302, 303, 304, 305])
    assert sorted(read) == [100, 102, 104, 200, 300]
    read.clear()
    leaves = {cache[102], cache[104]}
    assert uncached_after(101, [100], 100, states_in(cache), counted,
                          leaf=lambda value: value in leaves) == (
        100, [103, 105, 201, 202, 203, 204, 205, 301, 302, 303, 304, 305])
    assert sorted(read) == [100, 200, 300]


def barren_run(productive: list[bool]) -> list[int]:
    """A parent of cached containers, each of ten cached leaves, one more uncached leaf
    where ``productive`` says: what a miss of its first child finds."""
    cache: dict[int, bytes] = {}
    containers = [100 * (index + 1) for index in range(len(productive))]
    for container, uncached in zip(containers, productive):
        leaves = range(container + 1, container + 11)
        for leaf in leaves:
            cache[leaf] = state()
        cache[container] = state(*leaves, *([container + 50] if uncached else []))
    cache[1] = state(2, *containers)
    parent, found = run(2, [1], 100, cache)
    assert parent == 1
    return found


def test_max_barren_slices_exactly() -> None:
    from zodbsql.cache.lookahead import MAX_BARREN
    quiet = [False] * (MAX_BARREN - 1)
    # One barren slice fewer than the limit, from the start and after a productive one:
    # the next container is still looked into.
    assert barren_run([*quiet, True]) == [100 * MAX_BARREN + 50]
    assert barren_run([True, *quiet, True]) == [150, 100 * (MAX_BARREN + 1) + 50]
    assert barren_run([True, *quiet, False, True]) == [150]


def test_the_examined_oids_are_counted_to_the_limit_exactly() -> None:
    # The parent's own references bring the count of oids asked about to MAX_EXAMINED
    # exactly (with the miss and the parent): no cached state is looked into after.
    from zodbsql.cache.lookahead import MAX_EXAMINED
    children = list(range(10, 10 + MAX_EXAMINED - 2))
    cache = {child: state() for child in children}
    cache[children[0]] = state(99_999)
    cache[1] = state(2, *children)
    assert run(2, [1], 10, cache) == (1, [])
    cache[1] = state(2, *children[:-2])
    assert run(2, [1], 10, cache) == (1, [99_999])


def test_a_count_of_zero_reads_no_parent() -> None:
    # No state is read, and no large one asked about, for a batch of nothing.
    cache = buckets(set())
    assert run(101, [100], 0, cache) == (None, [])
    asked: list[int] = []
    assert uncached_after(101, [100], 0, states_in(cache), refs_of,
                          following=asked_of({100: [101, 102]}, asked)) == (None, [])
    assert asked == []


def asked_of(graph: dict[int, list[int]], asked: list[int]):  # type: ignore[no-untyped-def]
    """``following`` over ``graph`` (oid -> references), recording whom it was asked of."""
    def following(parent: int, oid: int) -> list[int] | None:
        asked.append(parent)
        held = graph.get(parent, [])
        return held[held.index(oid) + 1:] if oid in held else None
    return following


def test_a_parent_too_large_to_read_is_asked_about_instead() -> None:
    """A cached container too large to read (a sparse read of 10,000 children) gives
    the references after the miss through ``following``: the database cuts them from
    its revision's references."""
    wanted = 4
    big = wanted * lookahead.BYTES_READ_PER_OID + 1
    cache = {1: state(2, 3, 4, 5, 6, 7, size=big), 4: state()}
    asked: list[int] = []
    following = asked_of({1: [2, 3, 4, 5, 6, 7]}, asked)
    assert uncached_after(3, [1], wanted, states_in(cache), refs_of,
                          following=following) == (1, [5, 6, 7])     # 4 is cached
    assert asked == [1]
    # Not read as a state either way, and not the parent of what it does not hold.
    assert uncached_after(9, [1], wanted, states_in(cache), refs_of,
                          following=following) == (None, [])
    assert asked == [1, 1]


def test_a_large_candidate_is_asked_about_only_if_it_may_refer_to_something() -> None:
    big = 4 * lookahead.BYTES_READ_PER_OID + 1
    cache = {1: state(size=big)}
    asked: list[int] = []
    following = asked_of({1: [2, 3]}, asked)
    leaf = lambda value: True   # noqa: E731  (every state is a leaf)
    assert uncached_after(2, [1], 4, states_in(cache), refs_of, leaf=leaf,
                          following=following) == (None, [])
    assert asked == []


def test_at_most_large_asked_large_candidates_are_asked_about() -> None:
    big = 4 * lookahead.BYTES_READ_PER_OID + 1
    candidates = list(range(10, 10 + lookahead.LARGE_ASKED + 2))
    cache = {each: state(size=big) for each in candidates}
    asked: list[int] = []
    graph: dict[int, list[int]] = {each: [] for each in candidates}
    graph[candidates[0]] = [2, 3]          # the oldest candidate: asked about last
    following = asked_of(graph, asked)
    assert uncached_after(2, candidates, 4, states_in(cache), refs_of,
                          following=following) == (None, [])
    assert asked == candidates[::-1][:lookahead.LARGE_ASKED]
    # A smaller candidate is still read after the large ones were asked about.
    cache[5] = state(2, 8)
    assert uncached_after(2, [5, *candidates], 4, states_in(cache), refs_of,
                          following=following) == (5, [8])


# -- walking on past a pick that came short (``walked_on``) --------------------------------
class Loaded:
    """A loaded state, as a mover's ``LoadedState`` gives it (its oid and state)."""

    def __init__(self, oid: int, value: bytes | None) -> None:
        self.oid = oid
        self.state = value

    def __repr__(self) -> str:
        return f"Loaded({self.oid})"


def chain(count: int, items: int = 3, first: int = 1000) -> dict[int, bytes]:
    """The database: ``count`` buckets ``first``, ``first + 10``, ... each referring to
    ``items`` leaf items (the next oids) and to the next bucket (not the last)."""
    database: dict[int, bytes] = {}
    for number in range(count):
        bucket = first + 10 * number
        own = [bucket + 1 + i for i in range(items)]
        following = [bucket + 10] if number < count - 1 else []
        database[bucket] = state(*own, *following)
        for item in own:
            database[item] = state()
    return database


def walk(came: list[int], count: int, database: dict[int, bytes], cache: dict[int, bytes],
         room: int | None = None, loaded_already: tuple[int, ...] = (),
         ) -> tuple[list[int], list[list[int]]]:
    """``walked_on`` from the loaded ``came``: the oids it brought, and each load's oids."""
    loads: list[list[int]] = []

    def load(oids: list[int]) -> list[Loaded]:
        loads.append(list(oids))
        return [Loaded(oid, database[oid]) for oid in oids if oid in database]

    brought = lookahead.walked_on(
        [Loaded(oid, database[oid]) for oid in came], count, room, states_in(cache),
        refs_of, 4096, lambda value: not GRAPH[int.from_bytes(value[1:5], "big")], load,
        loaded_already)
    return [each.oid for each in brought], loads


def test_a_walk_brings_the_next_buckets_and_their_items_a_load_a_bucket() -> None:
    database = chain(4)
    # A miss on 1002 brought 1003 and the next bucket, 1010: the walk goes on from them.
    brought, loads = walk([1002, 1003, 1010], 100, database, {})
    assert loads == [[1011, 1012, 1013, 1020], [1021, 1022, 1023, 1030],
                     [1031, 1032, 1033]]
    assert brought == [oid for step in loads for oid in step]


def test_a_walk_brings_nothing_the_cache_holds() -> None:
    database = chain(3)
    cache = {1012: database[1012], 1020: database[1020]}
    brought, loads = walk([1003, 1010], 100, database, cache)
    # 1020 is cached, not brought, but its items are (the next bucket's, read from the
    # cache), and the walk goes on from them.
    assert loads == [[1011, 1013, 1021, 1022, 1023]]
    assert 1012 not in brought and 1020 not in brought


def test_a_step_that_would_pass_the_count_is_not_taken() -> None:
    database = chain(4)
    # Room for 4 states: the first bucket's step (4) fits, the next step (4) does not:
    # never half a bucket, whose other items would be misses of their own.
    brought, loads = walk([1010], 6, database, {})
    assert loads == [[1011, 1012, 1013, 1020]]
    assert walk([1010], 3, database, {}) == ([], [])


def test_a_step_that_would_pass_the_bytes_left_is_not_taken() -> None:
    database = chain(4)
    size = len(database[1011])
    # The states seen are all of one size: room for 5 of them takes one step of 4.
    brought, loads = walk([1010], 100, database, {}, room=5 * size)
    assert loads == [[1011, 1012, 1013, 1020]]
    assert walk([1010], 100, database, {}, room=3 * size)[1] == []


def test_leaves_and_large_states_are_not_walked_from() -> None:
    database = chain(2)
    assert walk([1001, 1002], 100, database, {}) == ([], [])
    database[1000] = state(1001, 1002, 1003, 1010, size=5000)
    assert walk([1000], 100, database, {}) == ([], [])


def test_a_container_with_more_children_than_the_count_is_not_walked_into() -> None:
    database = chain(2, items=30)
    assert walk([1010], 20, database, {})[1] == []
    assert walk([1010], 40, database, {})[1] == [list(range(1011, 1041))]


def test_a_walk_takes_walk_steps_loads_at_most() -> None:
    database = chain(lookahead.WALK_STEPS + 5, items=1)
    brought, loads = walk([1000], 10_000, database, {})
    assert len(loads) == lookahead.WALK_STEPS


def test_only_the_first_cached_states_are_looked_into() -> None:
    # A loaded state referring to many cached containers, each with uncached children:
    # the walk reads CACHED_LOOKED_INTO of them, not a whole cached subtree.
    database: dict[int, bytes] = {}
    containers = [2000 + 10 * i for i in range(6)]
    cache: dict[int, bytes] = {}
    for container in containers:
        cache[container] = database[container] = state(container + 1, container + 2)
        database[container + 1] = database[container + 2] = state()
    database[1] = state(*containers)
    brought, loads = walk([1], 100, database, cache)
    assert loads == [[2001, 2002, 2011, 2012][:2 * lookahead.CACHED_LOOKED_INTO]]


def test_a_state_of_exactly_the_largest_read_is_read() -> None:
    database = chain(2)
    database[1010] = state(1011, 1012, 1013, size=4096)       # largest_read: read
    assert walk([1010], 100, database, {})[1] == [[1011, 1012, 1013]]
    database[1010] = state(1011, 1012, 1013, size=4097)
    assert walk([1010], 100, database, {}) == ([], [])
    # A cached one the same: read at 4,096 bytes, not above.
    database[1] = state(1010)
    for size, expected in ((4096, [[1011, 1012, 1013]]), (4097, [])):
        database[1010] = state(1011, 1012, 1013, size=size)
        assert walk([1], 100, database, {1010: database[1010]})[1] == expected


def test_an_oid_two_states_refer_to_is_loaded_once() -> None:
    database = {1: state(3, 4), 2: state(4, 5), 3: state(), 4: state(), 5: state()}
    assert walk([1, 2], 100, database, {})[1] == [[3, 4, 5]]


def test_a_step_of_exactly_the_count_is_taken() -> None:
    database = {1: state(*range(10, 40)), 2: state(*range(40, 71))}
    for oid in range(10, 71):
        database[oid] = state()
    # 1 refers to 30 leaves: a step of 30 with a count of 30, none with 29.
    assert walk([1], 30, database, {})[1] == [list(range(10, 40))]
    assert walk([1], 29, database, {})[1] == []
    assert walk([2], 31, database, {})[1] == [list(range(40, 71))]


def test_cached_leaves_do_not_take_the_places_of_cached_containers() -> None:
    database = {1: state(2, 3, 4), 2: state(), 3: state(), 4: state(5, 6),
                5: state(), 6: state()}
    cache = {oid: database[oid] for oid in (2, 3, 4)}
    # 2 and 3 are cached leaves; 4, a cached container, is read for its items.
    assert walk([1], 100, database, cache)[1] == [[5, 6]]


def test_the_bytes_a_step_would_take_are_estimated_at_the_sizes_seen() -> None:
    # Two states came, of 16 and 17 bytes (33 in all): a step of 3 is estimated at
    # 3 * 33 // 2 = 49 bytes, taken with exactly that room, not with one byte less.
    database = {1: state(3, 4, 5, size=16), 2: state(size=17),
                3: state(), 4: state(), 5: state()}
    assert walk([1, 2], 100, database, {}, room=49)[1] == [[3, 4, 5]]
    assert walk([1, 2], 100, database, {}, room=48)[1] == []


def test_the_sizes_seen_include_every_state_that_came() -> None:
    # 1 came (16 bytes); the first step brings 2 to 9 (16 bytes each: estimated at
    # 8 * 16 = 128), 2 referring to 10; the second step, 10 alone, is estimated at the
    # running average of all nine states seen, 144 // 9 = 16 bytes.
    database = {1: state(*range(2, 10)), 2: state(10)}
    for oid in range(3, 11):
        database[oid] = state()
    assert walk([1], 100, database, {}, room=128 + 16)[1] == [list(range(2, 10)), [10]]
    assert walk([1], 100, database, {}, room=128 + 15)[1] == [list(range(2, 10))]


def test_what_was_loaded_with_the_states_that_came_is_not_loaded_again() -> None:
    # The miss (5) came in the same statement, not walked from; a state that came
    # refers to it: it is not loaded a second time.
    database = {1: state(5, 6), 5: state(), 6: state()}
    assert walk([1], 100, database, {}, loaded_already=(5,))[1] == [[6]]
    assert walk([1], 100, database, {})[1] == [[5, 6]]


def walk_at_once(came: list[int], count: int, database: dict[int, bytes],
                 cache: dict[int, bytes], room: int | None = None,
                 loaded_already: tuple[int, ...] = (), answers: bool = True,
                 ) -> tuple[list[int], list[tuple[list[int], int]], list[list[int]]]:
    """``walked_on`` with ``load_walked``: breadth first through ``database`` from the
    seeds, up to the limit (or None when not ``answers``).  The oids brought, each
    ``load_walked`` call's (seeds, limit), and each step's load."""
    calls: list[tuple[list[int], int]] = []
    loads: list[list[int]] = []

    def load(oids: list[int]) -> list[Loaded]:
        loads.append(list(oids))
        return [Loaded(oid, database[oid]) for oid in oids if oid in database]

    def load_walked(seeds: list[int], limit: int) -> list[Loaded] | None:
        calls.append((list(seeds), limit))
        if not answers:
            return None
        order: list[int] = []
        queue = list(seeds)
        while queue and len(order) < limit:
            oid = queue.pop(0)
            if oid in order or oid not in database:
                continue
            order.append(oid)
            queue += refs_of(oid, database[oid])
        return [Loaded(oid, database[oid]) for oid in order]

    brought = lookahead.walked_on(
        [Loaded(oid, database[oid]) for oid in came], count, room, states_in(cache),
        refs_of, 4096, lambda value: not GRAPH[int.from_bytes(value[1:5], "big")], load,
        loaded_already, load_walked)
    return [each.oid for each in brought], calls, loads


def test_a_walk_in_one_statement_goes_on_from_the_first_step() -> None:
    database = chain(4)
    # The first step is found as before (the uncached references of what came); the
    # rest comes in one call from it, breadth first, the states that came left out.
    brought, calls, loads = walk_at_once([1002, 1003, 1010], 100, database, {})
    assert calls == [([1011, 1012, 1013, 1020], 100)]
    assert loads == []
    assert brought == [1011, 1012, 1013, 1020, 1021, 1022, 1023, 1030, 1031, 1032, 1033]
    # What came, or came with it, never comes again (a reference back to it).
    database[1031] = state(1002, 1010)
    brought, _, _ = walk_at_once([1002, 1003, 1010], 100, database, {},
                                 loaded_already=(1003,))
    assert brought == [1011, 1012, 1013, 1020, 1021, 1022, 1023, 1030, 1031, 1032, 1033]


def test_a_walk_in_one_statement_is_cut_to_the_bytes_left() -> None:
    database = chain(4)
    size = len(database[1011])
    # Room for 6 states of the size seen: the limit asked is 6, and so many come.
    brought, calls, _ = walk_at_once([1010], 100, database, {}, room=6 * size + 3)
    assert calls == [([1011, 1012, 1013, 1020], 6)]
    assert brought == [1011, 1012, 1013, 1020, 1021, 1022]
    # A state larger than those seen: the walk is cut where the room ends, at it or
    # after it.
    database[1021] = state(size=3 * size)
    brought, _, _ = walk_at_once([1010], 100, database, {}, room=6 * size + 3)
    assert brought == [1011, 1012, 1013, 1020]
    brought, _, _ = walk_at_once([1010], 100, database, {}, room=7 * size)
    assert brought == [1011, 1012, 1013, 1020, 1021]
    brought, _, _ = walk_at_once([1010], 100, database, {}, room=7 * size - 1)
    assert brought == [1011, 1012, 1013, 1020]


def test_a_walk_in_one_statement_is_not_asked_where_no_step_is_taken() -> None:
    database = chain(2, items=30)
    # A first step past the count, or none at all: nothing asked, nothing brought.
    assert walk_at_once([1010], 20, database, {}) == ([], [], [])
    assert walk_at_once([1001, 1002], 100, database, {}) == ([], [], [])


def test_a_mover_without_the_statement_walks_a_step_a_load() -> None:
    database = chain(4)
    brought, calls, loads = walk_at_once([1002, 1003, 1010], 100, database, {},
                                         answers=False)
    assert calls == [([1011, 1012, 1013, 1020], 100)]
    assert loads == [[1011, 1012, 1013, 1020], [1021, 1022, 1023, 1030],
                     [1031, 1032, 1033]]
    assert brought == [oid for step in loads for oid in step]


def objects_with_one_each(count: int) -> dict[int, bytes]:
    """A container 1 of cached objects 1000, 1001, ... each holding one uncached
    sub-object 100, 101, ... (an item and its annotations)."""
    cache = {1: state(*range(1000, 1000 + count))}
    for index in range(count):
        cache[1000 + index] = state(100 + index)
    return cache


def test_a_parents_last_sub_object_brings_its_siblings_sub_objects() -> None:
    """The miss of an object's only sub-object (nothing left to bring in its parent)
    brings the sub-objects of the parent's next siblings, which a walk of the container
    reads next; the container is given as the parent to note, for the next miss."""
    cache = objects_with_one_each(5)
    assert run(100, [1, 1000], 100, cache) == (1, [101, 102, 103, 104])
    # The container's cached siblings before the parent are not looked into.
    assert run(102, [1, 1002], 100, cache) == (1, [103, 104])
    # At most count, and CLIMB_LOOKED_INTO siblings.
    assert run(100, [1, 1000], 2, cache) == (1, [101, 102])
    climbing = lookahead.CLIMB_LOOKED_INTO
    many = objects_with_one_each(climbing + 10)
    assert run(100, [1, 1000], 10_000, many) == (1, [101 + index for index
                                                   in range(climbing)])


def test_no_climb_from_a_parent_with_more_than_a_few_references() -> None:
    """A container's last child (its parent has many references) brings nothing of the
    container's own siblings: that is another container, which a walk may never read."""
    few = lookahead.CLIMB_FROM_AT_MOST
    for held, expected in ((few, (1, [101])), (few + 1, (10, []))):
        cache = {1: state(10, 11), 10: state(*range(100 - held + 1, 101)), 11: state(101)}
        cache.update((each, state()) for each in range(100 - held + 1, 100))   # read
        assert run(100, [1, 10], 100, cache) == expected


def test_no_climb_when_the_parent_still_had_something_to_bring() -> None:
    cache = objects_with_one_each(3)
    cache[1000] = state(100, 105)             # 105 is uncached: it alone comes
    assert run(100, [1, 1000], 100, cache) == (1000, [105])


def test_no_climb_without_a_cached_grandparent_among_the_candidates() -> None:
    cache = objects_with_one_each(3)
    assert run(100, [1000], 100, cache) == (1000, [])
    del cache[1]
    assert run(100, [1, 1000], 100, cache) == (1000, [])


def test_no_climb_where_nothing_past_the_parent_may_be_looked_into() -> None:
    """PostgreSQL's pick among a parent's own references (``looked_into_at_most=0``)."""
    cache = objects_with_one_each(3)
    assert uncached_after(100, [1, 1000], 100, states_in(cache), refs_of,
                          looked_into_at_most=0) == (1000, [])


def test_a_grandparent_too_large_to_read_is_asked_once_for_the_siblings() -> None:
    wanted = 4
    big = wanted * lookahead.BYTES_READ_PER_OID + 1
    cache = objects_with_one_each(4)
    cache[1] = state(1000, 1001, 1002, 1003, size=big)
    cache[2] = state(1000, size=big)          # a second large candidate: not asked
    asked: list[int] = []
    following = asked_of({1: [1000, 1001, 1002, 1003], 2: [1000]}, asked)
    assert uncached_after(100, [1, 2, 1000], wanted, states_in(cache), refs_of,
                          following=following) == (2, [])
    assert asked == [2]
    asked.clear()
    assert uncached_after(100, [2, 1, 1000], wanted, states_in(cache), refs_of,
                          following=following) == (1, [101, 102, 103])
    assert asked == [1]


def test_a_climb_passes_over_candidates_that_are_not_the_grandparent() -> None:
    """Among the candidates: one not cached, one cached that does not refer to the
    parent; the grandparent after them is found.  The root (oid 0) may be it."""
    cache = objects_with_one_each(3)
    cache[7] = state(5)                     # cached, not the parent's parent
    assert run(100, [1, 7, 5, 1000], 100, cache) == (1, [101, 102])     # 5: not cached
    cache[0] = cache.pop(1)
    assert run(100, [0, 1000], 100, cache) == (0, [101, 102])


def test_a_large_parent_is_not_asked_about_in_the_grandparents_place() -> None:
    """The miss's parent (too large to read, a few references) and the miss are not
    candidates for its parent: the one question goes to the grandparent."""
    wanted = 4
    big = wanted * lookahead.BYTES_READ_PER_OID + 1
    cache = objects_with_one_each(3)
    cache[1] = state(1000, 1001, 1002, size=big)
    cache[1000] = state(100, size=big)
    asked: list[int] = []
    following = asked_of({1: [1000, 1001, 1002], 1000: [100]}, asked)
    assert uncached_after(100, [1, 1000], wanted, states_in(cache), refs_of,
                          following=following) == (1, [101, 102])
    assert asked == [1000, 1]


def test_a_grandparent_of_exactly_the_largest_size_is_read() -> None:
    wanted = 4
    largest = wanted * lookahead.BYTES_READ_PER_OID
    cache = objects_with_one_each(3)
    cache[1] = state(1000, 1001, 1002, size=largest)
    asked: list[int] = []
    assert uncached_after(100, [1, 1000], wanted, states_in(cache), refs_of,
                          following=asked_of({}, asked)) == (1, [101, 102])
    assert asked == []
    cache[1] = state(1000, 1001, 1002, size=largest + 1)    # too large, nothing to ask
    assert run(100, [1, 1000], wanted, cache) == (1000, [])


def test_a_second_large_candidate_is_not_asked_about() -> None:
    wanted = 4
    big = wanted * lookahead.BYTES_READ_PER_OID + 1
    cache = objects_with_one_each(3)
    cache[1] = state(1000, 1001, 1002, size=big)
    cache[2] = state(9, size=big)           # large, does not refer to the parent
    asked: list[int] = []
    following = asked_of({1: [1000, 1001, 1002], 2: [9]}, asked)
    assert uncached_after(100, [1, 2, 1000], wanted, states_in(cache), refs_of,
                          following=following) == (1000, [])
    assert asked == [2]


def test_a_climb_looks_at_most_climb_looked_into_siblings_ahead() -> None:
    """The sibling just past the climb's reach is not brought, even uncached."""
    climbing = lookahead.CLIMB_LOOKED_INTO
    cache = objects_with_one_each(climbing + 2)
    del cache[1000 + climbing + 1]          # the first sibling out of reach: uncached
    found = run(100, [1, 1000], 10_000, cache)[1]
    assert 1000 + climbing + 1 not in found
    assert found == [101 + index for index in range(climbing)]
    # The same where the container is too large to read: the database's answer is cut.
    children = list(range(1000, 1000 + climbing + 2))
    cache[1] = state(*children, size=10_000 * lookahead.BYTES_READ_PER_OID + 1)
    assert uncached_after(100, [1, 1000], 10_000, states_in(cache), refs_of,
                          following=asked_of({1: children}, [])) == (1, found)


def test_objects_that_refer_back_to_their_container_bring_their_siblings_too() -> None:
    """Zope's content refers back to its container (``__parent__``): the parent's own
    references lead to the container, looked into as any cached reference (no climb:
    the parent is still the miss's), and each is looked into once."""
    cache = {1: state(*range(1000, 1020), size=64)}
    for index in range(20):
        cache[1000 + index] = state(1, 100 + index)
    assert run(100, [1, 1000], 1000, cache) == (1000, [101 + index for index in range(19)])
