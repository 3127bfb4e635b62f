"""The record codec on its own (``zodbsql.atrest.codec``): the stored format, rebuilt
here from its description so that records written by one release open in the next;
when a state is compressed; what each kind of damage or missing key is called.

``tests/storage/test_atrest.py`` runs the codec inside storages (keys, rekeying,
compression settings); these tests need no server.
"""
from __future__ import annotations

import random
import struct
import sys

import pytest
import zstandard
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from zodbsql.atrest import codec as codec_module
from zodbsql.atrest.codec import (BLOB_MAGIC, COMPRESSED, DICTIONARY, ENCRYPTED, MAGIC,
                                  NONCE_SIZE, RecordCodec)
from zodbsql.atrest.keys import KeyRing
from zodbsql.errors import ConfigurationError, CorruptRecordError, RecordKeyError

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
OID, TID = 0x2A, 0x03F1_0000_0000_0001
HASH = bytes.fromhex("ab" * 32)


def ring(**keys: bytes) -> KeyRing:
    """A key ring of ``keys`` (default: "k1"), the first current."""
    chosen = keys or {"k1": KEY}
    return KeyRing(chosen, next(iter(chosen)))


def trained(dict_id: int) -> bytes:
    """A zstd dictionary with the id given (trained on pickle-like records)."""
    rng = random.Random(dict_id)
    samples: list[bytes | bytearray | memoryview] = [b"\x80\x03cmyapp.content\nDocument\nq\x00.\x80\x03}q\x01(X\x05\x00\x00\x00title"
               + rng.randbytes(8).hex().encode() + b"X\x04\x00\x00\x00body" + b"lorem ipsum " * 8
               for _ in range(400)]
    return zstandard.train_dictionary(2048, samples, dict_id=dict_id).as_bytes()


def test_an_encrypted_record_written_as_documented_opens():
    """MAGIC, flags, key id (length byte, ASCII), 12-byte nonce, then AES-GCM of the
    payload with the oid (8 bytes, big-endian) and the header as associated data."""
    nonce = bytes(range(12))
    header = MAGIC + bytes([ENCRYPTED]) + b"\x02k1" + nonce
    stored = header + AESGCM(KEY).encrypt(nonce, b"the state", OID.to_bytes(8, "big") + header)
    codec = RecordCodec(keys=ring())
    assert codec.decode(OID, TID, stored) == b"the state"
    assert codec.key_id_of(stored) == "k1" and codec.is_current(stored)
    with pytest.raises(CorruptRecordError, match="does not decrypt"):
        codec.decode(OID + 1, TID, stored)          # another oid: not its record


def test_a_compressed_record_with_a_dictionary_written_as_documented_opens():
    """The dictionary's id follows the flags as 4 bytes, big-endian, unsigned: ids of
    2**31 and more (a trained dictionary's is random) are written and read as such."""
    for dict_id in (0x0000_1234, 0xF000_0001):
        dictionary = trained(dict_id)
        state = b"\x80\x03cmyapp.content\nDocument\nq\x00.\x80\x03}q\x01(X\x05\x00\x00\x00title" \
            + b"0123abcd" * 2 + b"X\x04\x00\x00\x00body" + b"lorem ipsum " * 30
        packed = zstandard.ZstdCompressor(
            level=3, dict_data=zstandard.ZstdCompressionDict(dictionary)).compress(state)
        stored = MAGIC + bytes([COMPRESSED | DICTIONARY]) + struct.pack(">I", dict_id) + packed
        codec = RecordCodec(compress=True, dictionary=dictionary)
        assert codec.decode(OID, TID, stored) == state
        written = codec.encode(OID, state)
        assert written[:7] == MAGIC + bytes([COMPRESSED | DICTIONARY]) + struct.pack(">I", dict_id)
        assert codec.decode(OID, TID, written) == state
        # The dictionary is what the compressor uses: a small record shrinks with it.
        plain = zstandard.ZstdCompressor(level=3).compress(state)
        assert len(written) < len(plain)


def test_a_blob_chunk_written_as_documented_opens():
    """BLOB_MAGIC, key id, nonce; associated data: the content hash, the chunk number
    (4 bytes, big-endian) and the header."""
    nonce = bytes(range(12, 24))
    header = BLOB_MAGIC + b"\x02k1" + nonce
    stored = header + AESGCM(KEY).encrypt(
        nonce, b"chunk data", HASH + (7).to_bytes(4, "big") + header)
    codec = RecordCodec(keys=ring())
    assert codec.open_chunk(HASH, 7, stored) == b"chunk data"
    assert codec.chunk_key_id(stored) == "k1"
    sealed = codec.seal_chunk(HASH, 7, b"chunk data")
    assert sealed.startswith(BLOB_MAGIC + b"\x02k1") and len(sealed) == len(stored)
    assert codec.open_chunk(HASH, 7, sealed) == b"chunk data"
    with pytest.raises(RecordKeyError, match="does not decrypt"):
        codec.open_chunk(HASH, 8, sealed)           # another chunk's place
    assert RecordCodec().seal_chunk(HASH, 7, b"data") == b"data"      # no key: as it is
    assert codec.open_chunk(HASH, 7, b"plain data") == b"plain data"
    assert codec.chunk_key_id(b"plain data") is None


def compressible_by(saving: int, n: int, k: int, seed: int) -> bytes:
    """A state zstd (level 3) compresses to ``len(state) - saving`` bytes (checked)."""
    state = random.Random(seed).randbytes(k) + b"a" * (n - k)
    packed = zstandard.ZstdCompressor(level=3).compress(state)
    assert len(state) - len(packed) == saving, "zstandard compresses differently here"
    return state


def test_a_state_is_compressed_from_the_threshold_on_when_that_saves_over_8_bytes():
    codec = RecordCodec(compress=True, threshold=256)
    text = b"abc" * 200
    assert codec.encode(OID, text[:255]) == text[:255]               # under the threshold
    at_threshold = codec.encode(OID, text[:256])
    assert at_threshold[:3] == MAGIC + bytes([COMPRESSED])          # no dictionary flag
    assert codec.decode(OID, TID, at_threshold) == text[:256]
    saves_9 = compressible_by(9, 363, 335, 14)
    saves_8 = compressible_by(8, 352, 325, 31)
    grows_1 = compressible_by(-1, 345, 327, 89)
    assert codec.encode(OID, saves_9)[:3] == MAGIC + bytes([COMPRESSED])
    assert codec.encode(OID, saves_8) == saves_8       # 8 bytes saved: not worth a header
    assert codec.encode(OID, grows_1) == grows_1
    # Compressed and encrypted: both flags, and it opens.
    both = RecordCodec(compress=True, threshold=256, keys=ring())
    sealed = both.encode(OID, text)
    assert sealed[:3] == MAGIC + bytes([COMPRESSED | ENCRYPTED])
    assert both.decode(OID, TID, sealed) == text
    assert both.encode(OID, b"short")[:3] == MAGIC + bytes([ENCRYPTED])


def test_the_level_is_the_compressor_s():
    text = bytes(random.Random(3).choice(b"abcdefgh ") for _ in range(20_000))
    for level in (1, 19):
        written = RecordCodec(compress=True, level=level).encode(OID, text)
        assert written[3:] == zstandard.ZstdCompressor(level=level).compress(text)


def test_defaults_and_what_repr_says():
    plain = RecordCodec()
    assert (plain.compress, plain.level, plain.threshold, plain.keys) == (False, 3, 256, None)
    assert plain.checksum_key is None and not plain.active
    assert repr(plain) == ("<RecordCodec compress=False level=3 threshold=256"
                           " dictionary=None keys=None>")
    assert plain.encode(OID, b"x" * 1000) == b"x" * 1000
    assert plain.is_current(b"x" * 10)              # no key: a plain record is current
    with_dictionary = RecordCodec(compress=True, dictionary=trained(0x1234))
    assert "dictionary=4660" in repr(with_dictionary)


def test_zstandard_is_needed_only_to_compress(monkeypatch):
    def missing() -> None:
        raise ConfigurationError("no zstandard here")
    monkeypatch.setattr(codec_module, "zstandard_module", missing)
    assert RecordCodec(keys=ring()).encode(OID, b"x" * 1000)[:3] == MAGIC + bytes([ENCRYPTED])
    with pytest.raises(ConfigurationError, match="no zstandard here"):
        RecordCodec(compress=True)                  # said at open, not at the first write
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "zstandard", None)     # import zstandard fails
    with pytest.raises(ConfigurationError) as missing_package:
        codec_module.zstandard_module()
    assert str(missing_package.value).startswith(
        "compress zstd needs the zstandard package (pip install 'zodbsql[atrest]'): ")


DAMAGED_RECORDS = {
    "unknown flags": (MAGIC + b"\x08payload", "(unknown flags 0x08)"),
    "a dictionary id cut short": (MAGIC + bytes([COMPRESSED | DICTIONARY]) + b"\x00\x00",
                                  "(unpack_from requires a buffer of at least 7 bytes"
                                  " for unpacking 4 bytes at offset 3 (actual buffer"
                                  " size is 5))"),
    "a key id cut short": (MAGIC + bytes([ENCRYPTED]) + b"\x05k1", "(truncated header)"),
    "no key id length": (MAGIC + bytes([ENCRYPTED]), "(index out of range)"),
    "a key id not ASCII": (MAGIC + bytes([ENCRYPTED]) + b"\x02\xff\xfe" + bytes(12),
                           "('ascii' codec can't decode byte 0xff in position 0:"
                           " ordinal not in range(128))"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED_RECORDS))
def test_a_damaged_header_is_a_corrupt_record_named_so(case):
    stored, reason = DAMAGED_RECORDS[case]
    codec = RecordCodec(compress=True, keys=ring())
    with pytest.raises(CorruptRecordError) as damaged:
        codec.decode(OID, TID, stored)
    assert str(damaged.value).endswith(f"its zodbsql header is damaged {reason}")
    assert f"0x{OID:016x}" in str(damaged.value)
    with pytest.raises(CorruptRecordError) as unnamed:
        codec.key_id_of(stored)                     # no record to name: 0, 0
    assert str(unnamed.value) == (f"corrupt record for oid 0x{0:016x} tid 0x{0:016x}:"
                                  f" its zodbsql header is damaged {reason}")


def test_a_header_that_ends_where_its_payload_would_start_is_whole():
    """A compressed record whose payload is empty: its header is whole (the payload
    does not decompress), not truncated."""
    codec = RecordCodec(compress=True, dictionary=trained(0x1234))
    stored = MAGIC + bytes([COMPRESSED | DICTIONARY]) + struct.pack(">I", 0x1234)
    with pytest.raises(CorruptRecordError) as empty:
        codec.decode(OID, TID, stored)
    assert "it does not decompress: " in str(empty.value)


def test_records_of_dictionaries_not_configured_name_them():
    older = [trained(0x2001), trained(0x2002)]
    current = RecordCodec(compress=True, dictionary=trained(0x2000),
                          older_dictionaries=older)
    record = RecordCodec(compress=True, dictionary=trained(0x2003)).encode(OID, b"lorem ipsum " * 40)
    with pytest.raises(ConfigurationError) as unknown:
        current.decode(OID, TID, record)
    assert str(unknown.value) == (
        f"the record of oid 0x{OID:016x} tid 0x{TID:016x} was compressed with the zstd"
        f" dictionary id {0x2003}, but compress-dict has only id(s) {0x2000}, {0x2001},"
        f" {0x2002} (list the dictionaries records were compressed with after the current"
        " one)")
    for older_one in older:
        state = b"lorem ipsum " * 40
        sealed = RecordCodec(compress=True, dictionary=older_one).encode(OID, state)
        assert current.decode(OID, TID, sealed) == state


def test_blob_chunks_whose_key_is_missing_wrong_or_header_damaged_are_named():
    sealed = RecordCodec(keys=ring()).seal_chunk(HASH, 3, b"data")
    what = f"chunk 3 of blob content {HASH.hex()}"
    with pytest.raises(RecordKeyError) as missing:
        RecordCodec().open_chunk(HASH, 3, sealed)
    assert str(missing.value) == (f"{what} is encrypted with key id 'k1', which is not"
                                  " configured (key-file, key-env)")
    assert missing.value.key_id == "k1"
    with pytest.raises(RecordKeyError) as other_id:
        RecordCodec(keys=ring(k2=KEY)).open_chunk(HASH, 3, sealed)
    assert other_id.value.key_id == "k1"
    with pytest.raises(RecordKeyError) as wrong:
        RecordCodec(keys=ring(k1=OTHER_KEY)).open_chunk(HASH, 3, sealed)
    assert str(wrong.value) == (f"{what} does not decrypt with the key configured as key"
                                " id 'k1' (a wrong key for that id, or damaged data)")
    assert wrong.value.key_id == "k1"
    codec = RecordCodec(keys=ring())
    header_end = BLOB_MAGIC + b"\x02k1" + bytes(NONCE_SIZE)
    damaged = {
        "the mark alone": BLOB_MAGIC,
        "a key id of no bytes": BLOB_MAGIC + b"\x00" + bytes(40),
        "a nonce cut short": BLOB_MAGIC + b"\x02k1" + bytes(NONCE_SIZE - 1),
        "a key id not ASCII": BLOB_MAGIC + b"\x02\xff\xfe" + bytes(40),
    }
    for name, stored in damaged.items():
        for call in (lambda: codec.open_chunk(HASH, 3, stored),
                     lambda: codec.chunk_key_id(stored)):
            with pytest.raises(RecordKeyError) as bad:
                call()
            assert bad.value.key_id == "?", name
            assert str(bad.value).endswith("has a damaged header"), name
    with pytest.raises(RecordKeyError) as bad_header:
        codec.open_chunk(HASH, 3, BLOB_MAGIC)
    assert str(bad_header.value) == f"{what} has a damaged header"
    with pytest.raises(RecordKeyError) as no_place:
        codec.chunk_key_id(BLOB_MAGIC)
    assert str(no_place.value) == "chunk 0 of blob content  has a damaged header"
    # A header that ends where the data would start is whole: the data (none) does
    # not decrypt.
    with pytest.raises(RecordKeyError, match="does not decrypt"):
        codec.open_chunk(HASH, 3, header_end)
    assert codec.chunk_key_id(header_end) == "k1"
