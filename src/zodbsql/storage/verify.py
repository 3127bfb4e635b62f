"""Verify a database: every state against its checksum, every reference resolvable,
every blob reference's content present and intact.

Read-only.  Problems are collected, not raised, so one run reports all of them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Callable

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.storage.blobs import file_hash
from zodbsql.errors import CorruptRecordError
from zodbsql.storage.records import matches
from zodbsql.storage.shared import HasShared, Shared


@dataclasses.dataclass(frozen=True)
class Problem:
    kind: str          # "checksum", "dangling-reference", "blob-missing", "blob-corrupt"
    oid: int
    tid: int
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: oid 0x{self.oid:016x} tid 0x{self.tid:016x}: {self.detail}"


@dataclasses.dataclass
class Report:
    states: int = 0
    bytes: int = 0
    blobs: int = 0
    blob_bytes: int = 0
    problems: list[Problem] = dataclasses.field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems


def verify(storage: HasShared, progress: Callable[[int, int], None] | None = None,
           ) -> Report:
    """Check every stored state and reference; ``progress(done, total)`` per batch."""
    backend = storage.shared.backend
    key = storage.shared.codec.checksum_key
    checker = backend.checker
    report = Report()
    conn = backend.connect()
    try:
        total = checker.count_states(conn)
        for rows in checker.iter_states(conn):
            for oid, tid, stored, state in rows:
                report.states += 1
                if state is None:
                    continue
                report.bytes += len(state)
                try:
                    state = backend.codec.decode(oid, tid, state)
                except CorruptRecordError as exc:
                    report.problems.append(Problem("checksum", oid, tid, str(exc)))
                    continue
                if stored is not None and not matches(state, stored, key):
                    report.problems.append(Problem(
                        "checksum", oid, tid,
                        f"state of {len(state)} bytes does not match its checksum"))
            if progress is not None:
                progress(report.states, total)
        for oid, tid, missing in checker.dangling_references(conn):
            report.problems.append(Problem(
                "dangling-reference", oid, tid,
                f"refers to oid 0x{missing:016x}, which does not exist"))
        _verify_blobs(storage.shared, conn, report)
    finally:
        conn.close()
    return report


def _verify_blobs(shared: Shared, conn: ConnectionRole, report: Report) -> None:
    """Blob references against their contents: in the database (chunks hashed and
    measured) or, with a shared blob directory, the revision files."""
    blobs = shared.backend.blobs
    files = shared.blob_files
    if files is not None and files.shared:
        for oid, tid, content_hash in blobs.iter_refs(conn):
            report.blobs += 1
            path = files.revision_path(oid, tid)
            if not os.path.exists(path):
                report.problems.append(Problem("blob-missing", oid, tid,
                                               f"the blob file {path} does not exist"))
                continue
            digest, size = file_hash(path)
            report.blob_bytes += size
            if digest != content_hash:
                report.problems.append(Problem(
                    "blob-corrupt", oid, tid,
                    f"the blob file {path} ({size} bytes) does not have the recorded SHA-256"))
        return
    for oid, tid, content_hash in blobs.refs_without_content(conn):
        report.problems.append(Problem(
            "blob-missing", oid, tid,
            f"its blob content {content_hash.hex()} is not in the database"))
    for content_hash, size, chunks in blobs.iter_contents(conn):
        report.blobs += 1
        hasher = hashlib.sha256()
        got = 0

        def write(data: bytes) -> None:
            nonlocal got
            hasher.update(data)
            got += len(data)
        detail = None
        try:
            blobs.download(conn, content_hash, chunks, write)
        except KeyError as exc:
            detail = f"chunk {exc} of {chunks} is missing"
        else:
            report.blob_bytes += got
            if got != size:
                detail = f"its chunks hold {got} bytes, {size} recorded"
            elif hasher.digest() != content_hash:
                detail = "its chunks do not have the recorded SHA-256"
        if detail is not None:
            oid, tid = blobs.revision_with_content(conn, content_hash) or (0, 0)
            report.problems.append(Problem(
                "blob-corrupt", oid, tid, f"blob content {content_hash.hex()}: {detail}"))
