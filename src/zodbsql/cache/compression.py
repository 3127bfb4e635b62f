"""States kept compressed in the state cache's main segments (``cache-compress``).

A state of a few hundred bytes costs its pickle and ~60 bytes of bookkeeping in an
arena segment (``arena.py``), so a cache fills with pickles: at 32 MB about 58% of a
200,000-object scan's states (``scripts/cache_memory.py``: pickles of 175 bytes) fit,
and a second pass over them still reads most from the database.  zstd at level 1 makes
such a pickle 65 bytes in ~3.6 us and gives it back in ~1.1 us (this machine); zlib
took 75 us to compress the same state (``deflateInit`` sets up 256 KB per call), which
is why zlib is not offered.

What is compressed is what enters probation (the main segments); the window, where a
prefetched batch waits for its loads, keeps states as they came, so a prefetch's hits
pay nothing.  A kept value is the tid (8 bytes), a tag byte, then the state: ``TAG_ZSTD``
and a zstd frame, or ``TAG_PLAIN`` and the state as it came (small, or not smaller
compressed).  Only a cache made with compression holds tagged values: the tag is never
taken for the first byte of a pickle.
"""
from __future__ import annotations

from zodbsql.errors import ConfigurationError

TAG_ZSTD = 0
#: Kept as it came: small, or no smaller compressed.
TAG_PLAIN = 1
#: Kept as it came, not tried yet (``auto`` before the cache was first full).
TAG_RAW = 2
_RAW = bytes((TAG_RAW,))
#: States shorter than this are kept as they are: zstd's frame header (6 to 9 bytes)
#: would take most of what it saves.
SMALLEST = 48
LEVEL = 1
#: What a process's RSS grows by for compressing (the state cache counts it): importing
#: ``zstandard`` and first using a compressor and a decompressor, measured on this
#: machine: 704 KB of the library's pages and 240 KB of anonymous memory.
LIBRARY_BYTES = 944 << 10


class StateCompressor:
    """Packs the state cache's values (``tid + state``) and unpacks their states.
    Not thread-safe (zstd's contexts are not): the state cache calls it under its lock."""

    def __init__(self, eager: bool = True) -> None:
        try:
            import zstandard
        except ImportError as exc:
            raise ConfigurationError(
                f"cache-compress {'zstd' if eager else 'auto'} needs the zstandard package"
                f" (a dependency of zodbsql: pip install zstandard): {exc}") from None
        #: Does ``pack`` compress?  From the start (``zstd``) or from ``start`` (``auto``).
        self.compressing = eager
        self._compress = zstandard.ZstdCompressor(level=LEVEL, write_content_size=True,
                                                  write_checksum=False).compress
        self._decompress = zstandard.ZstdDecompressor().decompress

    def start(self) -> None:
        """The cache is full: from now on ``pack`` compresses."""
        self.compressing = True

    def pack(self, value: bytes) -> bytes:
        """``value`` (tid + state) as the main segments keep it."""
        if not self.compressing:
            return value[:8] + _RAW + value[8:]   # (the tag's bytes made once: 0.77 -> 0.48 us)
        return self._packed(value, memoryview(value)[8:])

    def pack_many(self, values: dict[int, bytes]) -> dict[int, bytes]:
        """``pack`` of each value of ``values`` (oid -> tid + state), the same keys in
        the same order; before compressing, tagged in one comprehension."""
        if not self.compressing:
            return {oid: value[:8] + _RAW + value[8:] for oid, value in values.items()}
        pack = self.pack
        return {oid: pack(value) for oid, value in values.items()}

    def squeeze(self, kept: bytes) -> bytes | None:
        """A kept value (tid + tag + ...) of a state not tried yet, compressed as ``pack``
        does once compressing; None for one already tried."""
        if kept[8] != TAG_RAW:
            return None
        return self._packed(kept, memoryview(kept)[9:])

    def _packed(self, value: bytes, state: memoryview) -> bytes:
        """``value``'s tid and ``state``, tagged, compressed where that saves bytes."""
        if len(state) >= SMALLEST:
            packed = self._compress(state)
            if len(packed) < len(state):
                return value[:8] + bytes((TAG_ZSTD,)) + packed
        return value[:8] + bytes((TAG_PLAIN,)) + state

    def unpack(self, kept: bytes) -> bytes:
        """The state of a packed value's rest (``kept``: the tag and what follows)."""
        if kept[0] == TAG_ZSTD:
            return self._decompress(memoryview(kept)[1:])
        return kept[1:]

    def unpack_value(self, value: bytes) -> bytes:
        """A packed value (tid + tag + ...) as ``tid + state`` again."""
        return value[:8] + self.unpack(value[8:])
