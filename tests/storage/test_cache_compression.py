"""The state cache's packed values (cache/compression.py): what is compressed, what is
kept as it came, and that every value reads back whole."""
from __future__ import annotations

import os
import sys

import pytest

from zodbsql.cache.compression import SMALLEST, TAG_PLAIN, TAG_ZSTD, StateCompressor
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
                       match=r"cache-compress zstd needs the zstandard package \(pip install"
                             r" 'zodbsql\[atrest\]'\)"):
        StateCompressor()
