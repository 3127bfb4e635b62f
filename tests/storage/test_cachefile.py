"""The persistent cache's file on its own (``zodbsql.cache.cachefile``): what reads back,
what is refused and with which reason (the reader logs it and starts empty), and what
a save keeps of the file it merges into.

A file that is read back wrongly serves states the database no longer holds, so each
refusal is checked on a file whose checksum matches what it holds: only the check
named refuses it, not the checksum before it.
"""
from __future__ import annotations

import json
import pathlib
import struct
import zlib

import pytest

from zodbsql.cache import cachefile
from zodbsql.cache.cachefile import MAGIC, CacheFileError, Identity, Segment

IDENTITY = Identity("d41d8cd9", True, "packed-at-0x03f1")
_LENGTH = struct.Struct(">I")
_RECORD = struct.Struct(">QQI")


def value(tid: int, state: bytes) -> bytes:
    """What the state cache keeps of a state: its tid's 8 bytes, then the state."""
    return tid.to_bytes(8, "big") + state


def segment(as_of: int, *oids: int, size: int = 12) -> Segment:
    return Segment(as_of, [(oid, as_of - oid, value(as_of - oid, bytes([oid % 251]) * size))
                           for oid in oids])


def sealed(body: bytes) -> bytes:
    """``body`` with the checksum a file ends with: it passes that check."""
    return body + _LENGTH.pack(zlib.crc32(body))


def header(segments: list[list[int]], identity: Identity = IDENTITY) -> bytes:
    text = json.dumps({"database": identity.database, "keep_history": identity.keep_history,
                       "packed": identity.packed, "segments": segments}).encode()
    return _LENGTH.pack(len(text)) + text


def record(oid: int, tid: int, data: bytes, length: int | None = None) -> bytes:
    return _RECORD.pack(oid, tid, len(data) if length is None else length) + data


def test_a_file_reads_back_the_segments_and_identity_it_was_written_with(tmp_path):
    """Every segment, in order, each record's oid, tid and value, and the identity with
    its pack marker: a save followed by a read at the same identity finds them."""
    segments = [segment(900, 5, 3, 8), segment(700, 1, 2), segment(650, 40)]
    found, back = cachefile.decode(cachefile.encode(IDENTITY, segments))
    assert found == IDENTITY
    assert back == segments
    assert cachefile.save(tmp_path, IDENTITY, segments[0], 1 << 20) == 3
    assert cachefile.read(tmp_path / IDENTITY.file_name, IDENTITY) == [segments[0]]
    # The same database after another pack, or in the other mode: nothing.
    for other in (Identity(IDENTITY.database, True, "packed-at-0x0400"),
                  Identity(IDENTITY.database, False, IDENTITY.packed), Identity("x", True, None)):
        assert cachefile.read(tmp_path / IDENTITY.file_name, other) == []
    assert cachefile.read(tmp_path / "absent.states", IDENTITY) == []


def test_an_empty_file_reads_back_as_no_segment():
    assert cachefile.decode(cachefile.encode(IDENTITY, [])) == (IDENTITY, [])


GOOD = cachefile.encode(IDENTITY, [segment(900, 5, 3)])
BODY = MAGIC + header([[900, 1]])
REFUSED = {
    "no file at all": (b"", "not a zodbsql state cache file (or truncated)"),
    "the magic line alone": (MAGIC, "not a zodbsql state cache file (or truncated)"),
    "shorter than a header's length and a checksum": (
        MAGIC + b"\x00" * 7, "not a zodbsql state cache file (or truncated)"),
    "another version's magic line": (
        sealed(b"zodbsql state cache 2\n" + header([[900, 1]]) + record(5, 895, b"x" * 20)),
        "not a zodbsql state cache file (or truncated)"),
    "a header of no bytes": (
        sealed(MAGIC + _LENGTH.pack(0)), "its header does not parse (Expecting value:"
                                         " line 1 column 1 (char 0))"),
    "a byte changed": (GOOD[:40] + bytes([GOOD[40] ^ 1]) + GOOD[41:],
                       "its checksum does not match (truncated or corrupt)"),
    "the last byte gone": (GOOD[:-1], "its checksum does not match (truncated or corrupt)"),
    "a header without the segments": (
        sealed(MAGIC + _LENGTH.pack(2) + b"{}"), "its header does not parse ('database')"),
    "a record longer than the file": (
        sealed(BODY + record(5, 895, b"x" * 20, length=21)), "a record runs past the end"),
    "a record cut in its oid, tid and length": (
        sealed(BODY + record(5, 895, b"")[:10]), "a record runs past the end"),
    "a segment with a record more than the file holds": (
        sealed(MAGIC + header([[900, 2]]) + record(5, 895, b"x" * 20)),
        "a record runs past the end"),
    "bytes after the last record": (
        sealed(BODY + record(5, 895, b"x" * 20) + b"\x00"), "bytes after the last record"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_file_that_is_not_whole_is_refused_with_its_reason(case):
    data, reason = REFUSED[case]
    with pytest.raises(CacheFileError) as refused:
        cachefile.decode(data)
    assert str(refused.value) == reason


def test_a_long_read_breathes_once_every_so_many_records(tmp_path):
    """``breathe`` (a background reader's pause) runs after every BREATHE_EVERY records
    of a segment, and ``read`` hands it to ``decode``."""
    every = cachefile.BREATHE_EVERY
    calls: list[int] = []
    one_short = [segment(10_000, *range(1, 2 * every))]          # 2 x EVERY - 1 records
    cachefile.decode(cachefile.encode(IDENTITY, one_short), lambda: calls.append(1))
    assert len(calls) == 1
    calls.clear()
    exactly = [segment(10_000, *range(1, 2 * every + 1)), segment(5_000, *range(3_000, 3_000 + every))]
    path = tmp_path / IDENTITY.file_name
    path.write_bytes(cachefile.encode(IDENTITY, exactly))
    assert cachefile.read(path, IDENTITY, lambda: calls.append(1)) == exactly
    assert len(calls) == 3


def test_a_merge_keeps_its_own_states_first_and_each_oid_once():
    """The saver's segment first, whole; then, segment by segment, the states of the
    file's other oids; an oid two of those hold is kept from the first of them."""
    own = segment(900, 7, 8)
    older = segment(800, 8, 9, 10)          # 8: the saver has it
    oldest = segment(700, 9, 11)            # 9: the segment before has it
    merged = cachefile.merged(own, [older, oldest], 1 << 20)
    assert [s.as_of for s in merged] == [900, 800, 700]
    assert [[oid for oid, _, _ in s.entries] for s in merged] == [[7, 8], [9, 10], [11]]
    assert merged[1].entries[0] == older.entries[1]
    assert merged[2].entries == [oldest.entries[1]]


def test_a_merge_stays_within_its_bytes():
    """Values up to exactly ``max_bytes``: one that fills what is left is kept, the
    first that does not fit ends its segment, and nothing comes after a full budget."""
    own = segment(900, 1, 2, size=12)       # two values of 20 bytes
    other = segment(800, 3, 4, size=12)
    assert cachefile.merged(own, [other], 40) == [own]
    assert cachefile.merged(own, [other], 60) == [own, Segment(800, other.entries[:1])]
    assert cachefile.merged(own, [other], 59) == [own]
    assert cachefile.merged(own, [other], 39) == [Segment(900, own.entries[:1])]
    assert cachefile.merged(own, [], 19) == []


def test_a_save_merges_into_what_the_file_holds(tmp_path):
    """A second process's save keeps the first one's states of other oids behind its
    own; a file that does not read is replaced by the saver's own segment."""
    first, second = segment(900, 1, 2), segment(950, 2, 3)
    assert cachefile.save(tmp_path, IDENTITY, first, 1 << 20) == 2
    assert cachefile.save(tmp_path, IDENTITY, second, 1 << 20) == 3
    path: pathlib.Path = tmp_path / IDENTITY.file_name
    assert cachefile.read(path, IDENTITY) == [second, Segment(900, first.entries[:1])]
    path.write_bytes(b"damaged")
    assert cachefile.save(tmp_path, IDENTITY, first, 1 << 20) == 2
    assert cachefile.read(path, IDENTITY) == [first]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        IDENTITY.file_name, IDENTITY.file_name + ".lock"]
