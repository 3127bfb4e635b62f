"""The state cache's packed values (cache/compression.py): what is compressed, what is
kept as it came, and that every value reads back whole; and ``auto``, which compresses
only once the cache is full."""
from __future__ import annotations

import os
import sys

import pytest

from zodbsql.cache.compression import SMALLEST, TAG_PLAIN, TAG_RAW, TAG_ZSTD, StateCompressor
from zodbsql.cache import statecache
from zodbsql.cache.statecache import StateCache
from zodbsql.errors import ConfigurationError


@pytest.fixture(autouse=True)
def room_for_states_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests compare what compressed and plain caches of one size keep: the
    compressor's own memory, which a compressing cache also counts (half of a 1 MB
    cache), is left out here and tested in ``test_statecache.py``."""
    monkeypatch.setattr(statecache, "LIBRARY_BYTES", 0)

TID = (5).to_bytes(8, "big")
#: A ZODB pickle of a small object with 128 bytes of data (scripts/cache_memory.py).
PICKLE = (b"\x80\x03ccache_memory\nItem\nq\x00)\x81q\x01}q\x02X\x04\x00\x00\x00dataq\x03C"
          b"\x80" + b"x" * 128 + b"q\x04s.")


@pytest.mark.parametrize("state", [b"", b"x" * (SMALLEST - 1), b"x" * SMALLEST, PICKLE,
                                   os.urandom(200)],
                         ids=["empty", "short", "smallest", "pickle", "random"])
def test_every_value_reads_back_whole(state: bytes) -> None:
    packer = StateCompressor()
    packed = packer.pack(TID + state)
    assert packed[:8] == TID
    assert packer.unpack(packed[8:]) == state
    assert packer.unpack_value(packed) == TID + state


def test_what_is_compressed_and_what_is_kept_as_it_came() -> None:
    packer = StateCompressor()
    # Shorter than SMALLEST: kept as it came, however well it would compress.
    assert packer.pack(TID + b"x" * (SMALLEST - 1))[8] == TAG_PLAIN
    assert packer.pack(TID + b"x" * SMALLEST)[8] == TAG_ZSTD
    # Not smaller compressed (random bytes): kept as it came.
    assert packer.pack(TID + os.urandom(300))[8] == TAG_PLAIN
    # A small pickle: 175 bytes to 65 (a zstd frame without a checksum), plus the tid
    # and the tag.
    packed = packer.pack(TID + PICKLE)
    assert packed[8] == TAG_ZSTD and len(packed) <= 8 + 1 + 66 < len(PICKLE)


def test_without_zstandard_the_error_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(ConfigurationError,
                       match=r"cache-compress zstd needs the zstandard package \(a dependency"
                             r" of zodbsql: pip install zstandard\)"):
        StateCompressor()


def test_auto_keeps_raw_until_started_then_squeezes_each_once() -> None:
    packer = StateCompressor(eager=False)
    raw = packer.pack(TID + PICKLE)
    assert raw == TID + bytes((TAG_RAW,)) + PICKLE
    assert packer.unpack_value(raw) == TID + PICKLE
    squeezed = packer.squeeze(raw)
    assert squeezed is not None and squeezed[8] == TAG_ZSTD
    assert packer.unpack_value(squeezed) == TID + PICKLE
    assert packer.squeeze(squeezed) is None                 # tried once: never again
    assert packer.squeeze(packer.pack(TID + b"x")) is not None
    packer.start()
    assert packer.pack(TID + PICKLE) == squeezed
    assert packer.squeeze(packer.pack(TID + b"x")) is None  # tried: kept plain


def test_without_zstandard_auto_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(ConfigurationError, match=r"cache-compress auto needs the zstandard"):
        StateCache(1 << 20, compress="auto")


def scan(cache: StateCache, oids: range) -> None:
    """Loads of ``oids`` in turn, one at a time, as a walk that misses does."""
    for oid in oids:
        if cache.get(oid, 10) is None:
            cache.put_loaded(oid, 9, b"%d" % oid + PICKLE, 10)


def kept_tags(cache: StateCache) -> list[int]:
    return [value[8] for value in [*cache._probation.values(), *cache._protected.values()]]


@pytest.mark.parametrize("compress", ["off", "zstd", "auto"])
def test_auto_compresses_only_a_cache_that_is_full(compress: str) -> None:
    """A scan that fits keeps its states as they came (a hit pays no decompression);
    one of three times what fits plain fills the cache, after which ``auto`` keeps
    as many states as ``zstd`` (1.74 times what ``off`` keeps)."""
    fitting = StateCache(1 << 20, compress=compress)
    fitting.after_poll(-1, 10, [])
    scan(fitting, range(1000))
    assert len(fitting) == 1000
    if compress != "off":
        assert set(kept_tags(fitting)) == {TAG_RAW if compress == "auto" else TAG_ZSTD}
    plain = StateCache(1 << 20)
    plain.after_poll(-1, 10, [])
    scan(plain, range(100_000))
    fits_plain = len(plain)
    cache = StateCache(1 << 20, compress=compress)
    cache.after_poll(-1, 10, [])
    scan(cache, range(3 * fits_plain))
    assert cache.bytes_used <= cache.limit
    if compress == "off":
        assert abs(len(cache) - fits_plain) <= fits_plain // 50
        return
    assert len(cache) > 1.6 * fits_plain               # 6,795 against 3,907 here
    tags = kept_tags(cache)
    assert tags.count(TAG_ZSTD) > 0.95 * len(tags)       # the raw ones were squeezed
    for oid in range(3 * fits_plain):
        found = cache.get(oid, 10)
        assert found is None or found == (b"%d" % oid + PICKLE, 9)


def test_a_newcomer_turned_away_is_not_compressed() -> None:
    """A full compressed cache that turns a scan's newcomers away (admission) spends no
    compression on them."""
    cache = StateCache(1 << 20, compress="zstd")
    cache.after_poll(-1, 10, [])
    scan(cache, range(100_000))
    held = len(cache)
    packer = cache._packer
    assert packer is not None
    calls = []
    compress = packer._compress
    packer._compress = lambda state: calls.append(1) or compress(state)  # type: ignore
    scan(cache, range(100_000, 120_000))
    assert len(cache) >= held - 100          # the newcomers lost admission
    assert len(calls) < 100


def test_a_full_auto_cache_squeezes_just_enough_for_a_newcomer() -> None:
    """Once the cache is full of raw states, the next state to leave the window gets
    in without evicting any: the oldest raw states are compressed until it fits, a
    few of them, not a run's worth."""
    cache = StateCache(1 << 20, compress="auto")
    cache.after_poll(-1, 10, [])
    oid = 0
    while cache._packer is not None and not cache._packer.compressing:
        scan(cache, range(oid, oid + 1))
        oid += 1
    # The first state to meet a full cache started compression and made its own room.
    held = len(cache)
    assert held == oid and 0 < kept_tags(cache).count(TAG_ZSTD) <= 3
    for more in range(oid, oid + 20):
        scan(cache, range(more, more + 1))
        assert len(cache) == more + 1                   # nothing turned away or evicted
        squeezed = kept_tags(cache).count(TAG_ZSTD)
        assert squeezed <= 3 * (more + 2 - oid)         # two or three each, not eight
    assert cache.bytes_used <= cache.limit


def test_auto_batches_stay_raw_until_full_then_enter_whole() -> None:
    """Prefetched batches (``put_loaded_many``) into an ``auto`` cache: kept as they
    came while they fit; the first that does not fit has its room squeezed out of the
    raw states and enters whole; the cache ends up holding about what ``zstd`` holds."""
    cache = StateCache(1 << 20, compress="auto")
    cache.after_poll(-1, 10, [])
    packer = cache._packer
    assert packer is not None

    def batch(start: int) -> None:
        cache.put_loaded_many([(oid, 9, b"%d" % oid + PICKLE)
                               for oid in range(start, start + 200)], 10)

    start = 0
    while cache._fits_without_eviction([(0, 9, b"%d" % 0 + PICKLE)] * 200):
        batch(start)
        start += 200
        assert not packer.compressing and set(kept_tags(cache)) <= {TAG_RAW}
    assert len(cache) == start
    # The first that does not fit enters in one step, not newcomer by newcomer.
    one_by_one = cache._enter_each
    cache._enter_each = lambda entering: pytest.fail("entered one by one")  # type: ignore
    batch(start)
    cache._enter_each = one_by_one                  # type: ignore[method-assign]
    assert packer.compressing and len(cache) == start + 200
    assert kept_tags(cache).count(TAG_ZSTD) > 200  # squeezed to make its room
    first = start + 200
    while start < 20_000:
        start += 200
        batch(start)
    assert 6_000 < len(cache) <= 7_000            # 6,795 kept by zstd one at a time
    assert cache.bytes_used <= cache.limit
    assert not cache._squeezing                     # every raw state came round once
    # Once nothing raw is left, admission guards the cache as before: the batches after
    # it filled were turned away, not let in over what it held.
    held = [oid for oid in range(start + 200) if cache.has(oid, 10)]
    assert sum(oid < first + 2_000 for oid in held) > 0.8 * len(held)
    for oid in range(start + 200):
        found = cache.get(oid, 10)
        assert found is None or found == (b"%d" % oid + PICKLE, 9)


def test_a_batch_of_large_states_squeezes_only_its_room() -> None:
    """Where each squeeze frees more than a newcomer takes (large states that compress
    well), a batch's room is squeezed out of fewer raw states than the cap of four a
    state allows."""
    cache = StateCache(4 << 20, compress="auto")
    cache.after_poll(-1, 10, [])
    big = bytes(2000)
    start = 0
    while cache._fits_without_eviction([(0, 9, b"0" + big)] * 100):
        cache.put_loaded_many([(oid, 9, b"%d" % oid + big)
                               for oid in range(start, start + 100)], 10)
        start += 100
    cache.put_loaded_many([(oid, 9, b"%d" % oid + big) for oid in range(start, start + 100)],
                          10)
    assert len(cache) == start + 100
    # ~100 newcomers' room (2,200 bytes each, counted high) from ~2,000 bytes a squeeze.
    assert kept_tags(cache).count(TAG_ZSTD) < 100 + 200


def test_a_batch_that_squeezing_made_no_room_for_meets_admission() -> None:
    """A batch that still does not fit once the raw states were squeezed (they do not
    compress) enters newcomer by newcomer, each meeting admission, not whole over
    what the cache held; the bound holds."""
    cache = StateCache(1 << 20, compress="auto")
    cache.after_poll(-1, 10, [])
    noise = os.urandom(300 * 20_000)

    def batch(start: int) -> None:
        cache.put_loaded_many([(oid, 9, noise[300 * oid:300 * oid + 300])
                               for oid in range(start, start + 200)], 10)

    start = 0
    while cache._fits_without_eviction([(0, 9, bytes(300))] * 200):
        batch(start)
        start += 200
    whole = cache._enter_all
    cache._enter_all = lambda entering: pytest.fail("entered whole")  # type: ignore
    batch(start)
    cache._enter_all = whole                        # type: ignore[method-assign]
    assert cache._packer is not None and cache._packer.compressing
    assert kept_tags(cache).count(TAG_ZSTD) == 0    # random bytes: nothing saved
    assert cache.bytes_used <= cache.limit
    for oid in range(start + 200):
        found = cache.get(oid, 10)
        assert found is None or found == (noise[300 * oid:300 * oid + 300], 9)


def test_a_newcomer_the_squeeze_made_no_room_for_meets_admission() -> None:
    """The first state to meet a full ``auto`` cache starts compression; when squeezing
    the raw states saves nothing (they do not compress), the newcomer still has to win
    admission: turned away, nothing evicted for it."""
    cache = StateCache(1 << 18, compress="auto")
    cache.after_poll(-1, 10, [])
    cache._window_limit = 0                         # each newcomer meets admission
    noise = os.urandom(300 * 5_000)
    oid = 0
    while oid < 5_000:
        held = len(cache)
        if cache.get(oid, 10) is None:
            cache.put_loaded(oid, 9, noise[300 * oid:300 * oid + 300], 10)
        if len(cache) == held:
            break
        oid += 1
    assert cache._packer is not None and cache._packer.compressing
    assert not cache.holds(oid)
    assert all(cache.holds(each) for each in range(oid))
    assert kept_tags(cache).count(TAG_ZSTD) == 0
    assert cache.bytes_used <= cache.limit


@pytest.mark.parametrize("compressing", [False, True])
def test_pack_many_packs_each_value_as_pack_does(compressing: bool) -> None:
    packer = StateCompressor(eager=compressing)
    values = {oid: TID + PICKLE * (oid % 4) + bytes(oid) for oid in (9, 3, 700, 1)}
    values[2] = TID + b"small"                       # below SMALLEST: kept plain
    packed = packer.pack_many(values)
    assert list(packed) == list(values)              # the same order
    assert packed == {oid: packer.pack(value) for oid, value in values.items()}
    tags = {value[8] for value in packed.values()}
    assert tags == ({TAG_ZSTD, TAG_PLAIN} if compressing else {TAG_RAW})
