"""The state cache's packed values (cache/compression.py): what is compressed, what is
kept as it came, and that every value reads back whole; and ``auto``, which compresses
only once the cache is full."""
from __future__ import annotations

import os
import sys

import pytest

from zodbsql.cache.compression import SMALLEST, TAG_PLAIN, TAG_RAW, TAG_ZSTD, StateCompressor
from zodbsql.cache.statecache import StateCache
from zodbsql.errors import ConfigurationError

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
