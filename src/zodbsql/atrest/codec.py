"""The record codec: a state as it is stored, and back.

A sealed record is ``MAGIC``, a flags byte, then as the flags say: the zstd dictionary's
id (4 bytes), the key id (a length byte and ASCII) and AES-GCM's 12-byte nonce; then the
payload.  Anything else is a plain state, returned as it is: records written before,
below the threshold, or with the features off.  The oid and the header are AES-GCM's
associated data.
"""
from __future__ import annotations

import os
import struct
import threading
import types
from typing import TYPE_CHECKING, Sequence

from zodbsql.atrest.keys import KeyRing
from zodbsql.errors import ConfigurationError, CorruptRecordError, RecordKeyError

if TYPE_CHECKING:
    import zstandard
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: A pickle starts with PROTO (0x80) or an opcode, never with a zero byte.
MAGIC = b"\x00\x5a"
COMPRESSED = 0x01
ENCRYPTED = 0x02
DICTIONARY = 0x04
KNOWN_FLAGS = COMPRESSED | ENCRYPTED | DICTIONARY
NONCE_SIZE = 12
#: What an encrypted blob chunk starts with (then the key id and the nonce).  Blob data
#: can start with anything, so the mark is long enough not to be met by chance.
BLOB_MAGIC = b"\x00\x5a\xb1\x0bzsql"


class RecordCodec:
    """Seals states for storage and opens stored ones, for one storage's settings.

    ``level``, ``threshold`` and ``dictionary`` matter only with ``compress``;
    ``keys`` None: nothing is encrypted (an encrypted record can't be read).
    """

    def __init__(self, compress: bool = False, level: int = 3, threshold: int = 256,
                 dictionary: bytes | None = None, keys: KeyRing | None = None,
                 older_dictionaries: Sequence[bytes] = ()) -> None:
        self.compress = compress
        self.level = level
        self.threshold = threshold
        self.keys = keys
        self._local = threading.local()
        self._dictionary: zstandard.ZstdCompressionDict | None = None
        self._dict_id = 0
        if compress or dictionary is not None:
            zstd = zstandard_module()
            if dictionary is not None:
                self._dictionary = zstd.ZstdCompressionDict(dictionary)
                self._dict_id = self._dictionary.dict_id()
        # Dictionaries by id, for reading: the current one and those records were
        # compressed with before a new one was trained.
        self._readable: dict[int, zstandard.ZstdCompressionDict] = {}
        if self._dictionary is not None:
            self._readable[self._dict_id] = self._dictionary
        for data in older_dictionaries:
            older = zstandard_module().ZstdCompressionDict(data)
            self._readable.setdefault(older.dict_id(), older)
        self._ciphers: dict[str, AESGCM] = {}
        #: The database's checksum key (``opening.checksum_key``) once the storage has
        #: opened it; None: checksums are plain BLAKE2b digests.
        self.checksum_key: bytes | None = None

    #: What every record the codec sealed starts with; any other is stored as it is.
    sealed_prefix = MAGIC

    def __repr__(self) -> str:
        return (f"<RecordCodec compress={self.compress} level={self.level}"
                f" threshold={self.threshold} dictionary={self._dict_id or None}"
                f" keys={self.keys!r}>")

    @property
    def active(self) -> bool:
        """Does this codec seal anything it writes?"""
        return self.compress or self.keys is not None

    # -- writing ---------------------------------------------------------------------------
    def encode(self, oid: int, state: bytes) -> bytes:
        """``state`` as it is stored: compressed when that makes it smaller, then
        encrypted when a key is configured."""
        flags = 0
        payload = state
        if self.compress and len(state) >= self.threshold:
            packed = self._compressor().compress(state)
            if len(packed) + 8 < len(state):
                flags |= COMPRESSED | (DICTIONARY if self._dictionary is not None else 0)
                payload = packed
        if self.keys is None:
            if not flags:
                return state
            return self._header(flags, None, b"") + payload
        key_id = self.keys.current
        nonce = os.urandom(NONCE_SIZE)
        header = self._header(flags | ENCRYPTED, key_id, nonce)
        return header + self._cipher(key_id).encrypt(nonce, payload, _aad(oid, header))

    def _header(self, flags: int, key_id: str | None, nonce: bytes) -> bytes:
        parts = [MAGIC, bytes([flags])]
        if flags & DICTIONARY:
            parts.append(struct.pack(">I", self._dict_id))
        if key_id is not None:
            encoded = key_id.encode("ascii")
            parts += [bytes([len(encoded)]), encoded, nonce]
        return b"".join(parts)

    # -- reading ---------------------------------------------------------------------------
    def decode(self, oid: int, tid: int, stored: bytes) -> bytes:
        """The state a stored record holds.  Raises :class:`RecordKeyError` when its key
        id is not configured, :class:`CorruptRecordError` when it does not open."""
        if not stored.startswith(MAGIC):
            return stored
        flags, dict_id, key_id, body_at = parse_header(oid, tid, stored)
        payload = stored[body_at:]
        if key_id is not None:
            if self.keys is None or self.keys.get(key_id) is None:
                raise RecordKeyError(
                    f"the record of oid 0x{oid:016x} tid 0x{tid:016x} is encrypted with key id"
                    f" {key_id!r}, which is not configured (key-file, key-env)", key_id)
            nonce = stored[body_at - NONCE_SIZE:body_at]
            try:
                payload = self._cipher(key_id).decrypt(
                    nonce, payload, _aad(oid, stored[:body_at - NONCE_SIZE] + nonce))
            except Exception:  # cryptography's InvalidTag
                raise CorruptRecordError(
                    oid, tid, f"it does not decrypt with the key configured as key id"
                              f" {key_id!r} (a wrong key for that id, or a damaged record)"
                ) from None
        if flags & COMPRESSED:
            payload = self._decompress(oid, tid, payload, dict_id)
        return payload

    def _decompress(self, oid: int, tid: int, payload: bytes, dict_id: int | None) -> bytes:
        if dict_id is not None and dict_id not in self._readable:
            known = ", ".join(str(i) for i in self._readable)
            raise ConfigurationError(
                f"the record of oid 0x{oid:016x} tid 0x{tid:016x} was compressed with the zstd"
                f" dictionary id {dict_id}, but compress-dict "
                + (f"has only id(s) {known}" if known else "is not set")
                + " (list the dictionaries records were compressed with after the current one)")
        try:
            return bytes(self._decompressor(dict_id).decompress(payload))
        except Exception as exc:  # zstandard.ZstdError
            raise CorruptRecordError(oid, tid, f"it does not decompress: {exc}") from None

    def key_id_of(self, stored: bytes) -> str | None:
        """The key id a stored record is encrypted with (None: not encrypted)."""
        if not stored.startswith(MAGIC):
            return None
        return parse_header(0, 0, stored)[2]

    def is_current(self, stored: bytes) -> bool:
        """Is ``stored`` encrypted as this codec writes now (no key: not encrypted)?"""
        return self.key_id_of(stored) == (self.keys.current if self.keys else None)

    # -- blob chunks (database layout): encrypted, never compressed -------------------------
    def seal_chunk(self, content_hash: bytes, num: int, data: bytes) -> bytes:
        """Chunk ``num`` of a blob content as it is stored."""
        if self.keys is None:
            return data
        key_id = self.keys.current
        encoded = key_id.encode("ascii")
        nonce = os.urandom(NONCE_SIZE)
        header = BLOB_MAGIC + bytes([len(encoded)]) + encoded + nonce
        return header + self._cipher(key_id).encrypt(
            nonce, data, _chunk_aad(content_hash, num, header))

    def open_chunk(self, content_hash: bytes, num: int, stored: bytes) -> bytes:
        """The data of a stored blob chunk; raises :class:`RecordKeyError` naming the
        key id when its key is missing or does not open it."""
        if not stored.startswith(BLOB_MAGIC):
            return stored
        key_id, body_at = self._chunk_header(content_hash, num, stored)
        what = f"chunk {num} of blob content {content_hash.hex()}"
        if self.keys is None or self.keys.get(key_id) is None:
            raise RecordKeyError(f"{what} is encrypted with key id {key_id!r}, which is not"
                                 " configured (key-file, key-env)", key_id)
        try:
            return bytes(self._cipher(key_id).decrypt(
                stored[body_at - NONCE_SIZE:body_at], stored[body_at:],
                _chunk_aad(content_hash, num, stored[:body_at])))
        except Exception:  # cryptography's InvalidTag
            raise RecordKeyError(f"{what} does not decrypt with the key configured as key id"
                                 f" {key_id!r} (a wrong key for that id, or damaged data)",
                                 key_id) from None

    def chunk_key_id(self, stored: bytes) -> str | None:
        """The key id a stored blob chunk is encrypted with (None: not encrypted)."""
        if not stored.startswith(BLOB_MAGIC):
            return None
        return self._chunk_header(b"", 0, stored)[0]

    @staticmethod
    def _chunk_header(content_hash: bytes, num: int, stored: bytes) -> tuple[str, int]:
        at = len(BLOB_MAGIC)
        length = stored[at] if len(stored) > at else 0
        key_id = stored[at + 1:at + 1 + length]
        body_at = at + 1 + length + NONCE_SIZE
        if not length or body_at > len(stored) or not key_id.isascii():
            raise RecordKeyError(f"chunk {num} of blob content {content_hash.hex()} has a"
                                 " damaged header", "?")
        return key_id.decode("ascii"), body_at

    # -- per-thread zstd objects, one AES-GCM object per key id -----------------------------
    def _compressor(self) -> zstandard.ZstdCompressor:
        found = getattr(self._local, "compressor", None)
        if found is None:
            zstd = zstandard_module()
            found = self._local.compressor = zstd.ZstdCompressor(
                level=self.level, dict_data=self._dictionary)
        return found

    def _decompressor(self, dict_id: int | None) -> zstandard.ZstdDecompressor:
        """This thread's decompressor for records with dictionary ``dict_id`` (None:
        without one)."""
        found_all = getattr(self._local, "decompressors", None)
        if found_all is None:
            found_all = self._local.decompressors = {}
        found = found_all.get(dict_id)
        if found is None:
            zstd = zstandard_module()
            data = self._readable[dict_id] if dict_id is not None else None
            found = found_all[dict_id] = zstd.ZstdDecompressor(dict_data=data)
        return found

    def _cipher(self, key_id: str) -> AESGCM:
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: F811
            assert self.keys is not None
            key = self.keys.get(key_id)
            assert key is not None
            cipher = self._ciphers[key_id] = AESGCM(key)
        return cipher


#: Reads and writes plain states: both features off.
PLAIN = RecordCodec()


def parse_header(oid: int, tid: int, stored: bytes) -> tuple[int, int | None, str | None, int]:
    """``(flags, dictionary id or None, key id or None, where the payload starts)``."""
    try:
        flags = stored[2]
        at = 3
        dict_id = None
        key_id = None
        if flags & ~KNOWN_FLAGS:
            raise ValueError(f"unknown flags 0x{flags:02x}")
        if flags & DICTIONARY:
            (dict_id,) = struct.unpack_from(">I", stored, at)
            at += 4
        if flags & ENCRYPTED:
            length = stored[at]
            key_id = stored[at + 1:at + 1 + length].decode("ascii")
            at += 1 + length + NONCE_SIZE
        if at > len(stored):
            raise ValueError("truncated header")
    except (IndexError, struct.error, UnicodeDecodeError, ValueError) as exc:
        raise CorruptRecordError(oid, tid, f"its zodbsql header is damaged ({exc})") from None
    return flags, dict_id, key_id, at


def _aad(oid: int, header: bytes) -> bytes:
    return oid.to_bytes(8, "big") + header


def _chunk_aad(content_hash: bytes, num: int, header: bytes) -> bytes:
    return content_hash + num.to_bytes(4, "big") + header


def zstandard_module() -> types.ModuleType:
    try:
        import zstandard
    except ImportError as exc:
        raise ConfigurationError(
            f"compress zstd needs the zstandard package (pip install 'zodbsql[atrest]'): {exc}"
        ) from None
    return zstandard

