"""The persistent cache's file: states known current at a tid, for one database.

A file holds *segments*, each the states one process knew current at its ``as_of``
tid, hottest first; no oid is in two segments.  A process that saves puts its own
segment first and keeps, behind it, what the file held of oids it has not got (another
process's states, or its own from before a restart), until the byte bound is reached:
several processes on one host share one file per database, and their saves merge.

Layout: a magic line, a JSON header (the database identity, the history mode, the
pack marker, each segment's ``as_of`` and count), the records ``oid, tid, length,
value`` (the value is what the state cache keeps: the tid's 8 bytes and the state, so
that neither a save nor a read-back copies a state twice), and a CRC-32 of all that.  A file that does not parse, or whose checksum
differs (truncated, corrupt), is refused with :class:`CacheFileError`; the reader logs
it and starts empty.  Saves go to a temporary file renamed over the old one, under an
exclusive ``flock`` of a lock file beside it, so a reader sees a whole file, old or
new, and two savers do not lose each other's segments.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import struct
import zlib
from pathlib import Path
from typing import Callable

MAGIC = b"zodbsql state cache 1\n"
_LENGTH = struct.Struct(">I")
_RECORD = struct.Struct(">QQI")


class CacheFileError(Exception):
    """The file is not a whole cache file of this format."""


@dataclasses.dataclass(frozen=True)
class Identity:
    """What a file is valid for: one database (its ``database_id`` meta value) in one
    history mode, as it was after the pack that ``packed`` records."""

    database: str
    keep_history: bool
    packed: str | None

    @property
    def file_name(self) -> str:
        mode = "hp" if self.keep_history else "hf"
        return f"zodbsql-{self.database}-{mode}.states"


@dataclasses.dataclass
class Segment:
    as_of: int
    entries: list[tuple[int, int, bytes]]      # (oid, tid, tid + state), hottest first


def encode(identity: Identity, segments: list[Segment]) -> bytes:
    header = json.dumps({
        "database": identity.database, "keep_history": identity.keep_history,
        "packed": identity.packed,
        "segments": [[s.as_of, len(s.entries)] for s in segments]}).encode()
    parts = [MAGIC, _LENGTH.pack(len(header)), header]
    for segment in segments:
        for oid, tid, value in segment.entries:
            parts.append(_RECORD.pack(oid, tid, len(value)))
            parts.append(value)
    body = b"".join(parts)
    return body + _LENGTH.pack(zlib.crc32(body))


#: Records decoded between two calls of ``decode``'s ``breathe`` (few: see
#: ``persistent.BATCH``).
BREATHE_EVERY = 50


def decode(data: bytes, breathe: Callable[[], None] | None = None
           ) -> tuple[Identity, list[Segment]]:
    """The identity and segments ``data`` holds; ``breathe`` is called every
    ``BREATHE_EVERY`` records (a background reader lets other threads run)."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 2 * _LENGTH.size:
        raise CacheFileError("not a zodbsql state cache file (or truncated)")
    view = memoryview(data)[:-_LENGTH.size]
    (crc,) = _LENGTH.unpack(data[-_LENGTH.size:])
    if zlib.crc32(view) != crc:
        raise CacheFileError("its checksum does not match (truncated or corrupt)")
    at = len(MAGIC)
    (size,) = _LENGTH.unpack_from(view, at)
    at += _LENGTH.size
    try:
        header = json.loads(bytes(view[at:at + size]))
        identity = Identity(str(header["database"]), bool(header["keep_history"]),
                            header["packed"])
        shape = [(int(as_of), int(count)) for as_of, count in header["segments"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise CacheFileError(f"its header does not parse ({exc})") from None
    at += size
    segments = []
    try:
        for as_of, count in shape:
            entries = []
            for index in range(count):
                if breathe is not None and index % BREATHE_EVERY == BREATHE_EVERY - 1:
                    breathe()
                oid, tid, length = _RECORD.unpack_from(view, at)
                at += _RECORD.size
                if at + length > len(view):
                    raise CacheFileError("a record runs past the end")
                entries.append((oid, tid, bytes(view[at:at + length])))
                at += length
            segments.append(Segment(as_of, entries))
    except struct.error:
        raise CacheFileError("a record runs past the end") from None
    if at != len(view):
        raise CacheFileError("bytes after the last record")
    return identity, segments


def read(path: Path, identity: Identity, breathe: Callable[[], None] | None = None
         ) -> list[Segment]:
    """The segments of the file at ``path``; none when there is no file, or it was
    written for another database, history mode or pack."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    found, segments = decode(data, breathe)
    return segments if found == identity else []


def merged(own: Segment, others: list[Segment], max_bytes: int) -> list[Segment]:
    """``own`` first, then what ``others`` hold of other oids, up to ``max_bytes`` of
    values (the hottest of each segment first)."""
    seen = {oid for oid, _, _ in own.entries}
    budget = max_bytes
    result = []
    for segment in [own, *others]:
        kept = []
        for oid, tid, value in segment.entries:
            if segment is not own and oid in seen:
                continue
            if len(value) > budget:
                break
            budget -= len(value)
            seen.add(oid)
            kept.append((oid, tid, value))
        if kept:
            result.append(Segment(segment.as_of, kept))
        if budget <= 0:
            break
    return result


def save(directory: Path, identity: Identity, own: Segment, max_bytes: int) -> int:
    """Merge ``own`` into the file of ``identity`` in ``directory``; return the number
    of states written.  A file that does not read is replaced."""
    path = directory / identity.file_name
    with open(directory / (identity.file_name + ".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            others = read(path, identity)
        except CacheFileError:
            others = []
        segments = merged(own, others, max_bytes)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with open(temporary, "wb") as out:
            out.write(encode(identity, segments))
        os.replace(temporary, path)
    return sum(len(s.entries) for s in segments)
