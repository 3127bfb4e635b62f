"""Blobs: the SQL that stores blob data and maps revisions to it.

Each distinct content (the bytes of a blob file) is stored once, named by its SHA-256:
``blob_content`` (hash, size, number of chunks) and its ``blob_chunk`` rows.
``blob_ref`` says which content a revision's blob has.  A commit stages ``(oid, hash)``
in ``temp_blob`` during vote; the mover's ``move_staged`` (or the server-side finish
function) moves them into ``blob_ref`` with the states, and empties ``temp_blob`` with
its own staging tables.  Pack deletes references with the revisions they belong to (the
packer's statements); what is left here for pack is freeing contents nobody uses.

Chunks are inserted with insert-if-absent semantics (two commits may upload the same
content at once); backends override ``INSERT_CHUNK`` and ``INSERT_CONTENT`` with their
dialect.  With a shared blob directory the files hold the data and only ``blob_ref``
is used.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, Iterator, Sequence

from zodbsql.backends.base.contract import (BackendContract, BlobContent, BlobRef,
                                            ConnectionRole, Revision)
from zodbsql.backends.base.statements import in_list

STAGE_BLOB = "INSERT INTO temp_blob (zoid, content_hash) VALUES (%s, %s)"
# Undo and restore with a backpointer: the revision copied keeps its content.
STAGE_BLOB_COPY = (
    "INSERT INTO temp_blob (zoid, content_hash)"
    " SELECT zoid, content_hash FROM blob_ref WHERE zoid = %s AND tid = %s")
CONTENT_EXISTS = "SELECT 1 FROM blob_content WHERE content_hash = %s"
INSERT_CHUNK = ("INSERT INTO blob_chunk (content_hash, chunk_num, data) VALUES (%s, %s, %s)"
                " ON CONFLICT DO NOTHING")
INSERT_CONTENT = ("INSERT INTO blob_content (content_hash, size, chunks) VALUES (%s, %s, %s)"
                  " ON CONFLICT DO NOTHING")
FIND_REF = "SELECT content_hash FROM blob_ref WHERE zoid = %s AND tid = %s"
CONTENT = "SELECT size, chunks FROM blob_content WHERE content_hash = %s"
CHUNK = "SELECT data FROM blob_chunk WHERE content_hash = %s AND chunk_num = %s"
REVISION_WITH_CONTENT = "SELECT zoid, tid FROM blob_ref WHERE content_hash = %s LIMIT 1"
# Staged contents that are missing or incomplete (run under the commit lock, so no pack
# can free one of them between this check and the commit).
STAGED_MISSING = (
    "SELECT t.zoid FROM temp_blob t LEFT JOIN blob_content c"
    " ON c.content_hash = t.content_hash WHERE c.content_hash IS NULL"
    " OR c.chunks <> (SELECT COUNT(*) FROM blob_chunk k WHERE k.content_hash = t.content_hash)"
    " LIMIT 1")
# -- pack -------------------------------------------------------------------------------
UNUSED_CONTENTS = (
    "SELECT c.content_hash FROM blob_content c WHERE NOT EXISTS"
    " (SELECT 1 FROM blob_ref r WHERE r.content_hash = c.content_hash) LIMIT %s")
DELETE_CHUNKS = "DELETE FROM blob_chunk WHERE content_hash IN ({hashes})"
DELETE_CONTENTS = "DELETE FROM blob_content WHERE content_hash IN ({hashes})"
REFS_IN = "SELECT zoid, tid FROM blob_ref WHERE zoid IN ({oids})"
# -- verify -----------------------------------------------------------------------------
REFS_WITHOUT_CONTENT = (
    "SELECT r.zoid, r.tid, r.content_hash FROM blob_ref r WHERE NOT EXISTS"
    " (SELECT 1 FROM blob_content c WHERE c.content_hash = r.content_hash)"
    " ORDER BY r.zoid, r.tid")
CONTENTS_AFTER = ("SELECT content_hash, size, chunks FROM blob_content WHERE content_hash > %s"
                  " ORDER BY content_hash LIMIT %s")
REFS_AFTER = ("SELECT zoid, tid, content_hash FROM blob_ref"
              " WHERE zoid > %s OR (zoid = %s AND tid > %s) ORDER BY zoid, tid LIMIT %s")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlobStatements:
    """The blob role's statements (the same in both history modes)."""

    stage: str = STAGE_BLOB
    stage_copy: str = STAGE_BLOB_COPY
    content_exists: str = CONTENT_EXISTS
    #: Insert-if-absent, in the backend's dialect.
    insert_chunk: str = INSERT_CHUNK
    insert_content: str = INSERT_CONTENT
    find_ref: str = FIND_REF
    content: str = CONTENT
    chunk: str = CHUNK
    revision_with_content: str = REVISION_WITH_CONTENT
    staged_missing: str = STAGED_MISSING
    unused_contents: str = UNUSED_CONTENTS
    delete_chunks: str = DELETE_CHUNKS
    delete_contents: str = DELETE_CONTENTS
    refs_in: str = REFS_IN
    refs_without_content: str = REFS_WITHOUT_CONTENT
    contents_after: str = CONTENTS_AFTER
    refs_after: str = REFS_AFTER


class Blobs:
    """Blob rows in and out of the database (a ``BlobsRole``)."""

    STATEMENTS: ClassVar[BlobStatements] = BlobStatements()

    def __init__(self, backend: BackendContract) -> None:
        self.backend = backend
        self.sql = self.STATEMENTS

    # -- committing ---------------------------------------------------------------------
    def stage(self, conn: ConnectionRole, rows: Sequence[tuple[int, bytes]]) -> None:
        if rows:
            conn.executemany(self.sql.stage, rows)

    def stage_copy(self, conn: ConnectionRole, oid: int, from_tid: int) -> None:
        conn.execute(self.sql.stage_copy, (oid, from_tid))

    def has_content(self, conn: ConnectionRole, content_hash: bytes) -> bool:
        return conn.fetchone(self.sql.content_exists, (content_hash,)) is not None

    def upload(self, conn: ConnectionRole, content_hash: bytes, size: int,
               chunks: Iterator[bytes]) -> int:
        """Insert the chunks, then the content row; return the number of chunks."""
        count = 0
        seal = self.backend.codec.seal_chunk
        for data in chunks:
            conn.execute(self.sql.insert_chunk,
                         (content_hash, count, seal(content_hash, count, data)))
            count += 1
        conn.execute(self.sql.insert_content, (content_hash, size, count))
        return count

    def staged_missing(self, conn: ConnectionRole) -> int | None:
        """An oid whose staged content is gone or incomplete, or None (commit lock held)."""
        row = conn.fetchone(self.sql.staged_missing)
        return int(row[0]) if row else None

    def revision_with_content(self, conn: ConnectionRole,
                              content_hash: bytes) -> Revision | None:
        row = conn.fetchone(self.sql.revision_with_content, (content_hash,))
        return (int(row[0]), int(row[1])) if row else None

    # -- loading ------------------------------------------------------------------------
    def content_hash(self, conn: ConnectionRole, oid: int, tid: int) -> bytes | None:
        row = conn.fetchone(self.sql.find_ref, (oid, tid))
        return bytes(row[0]) if row else None

    def content(self, conn: ConnectionRole, content_hash: bytes) -> tuple[int, int] | None:
        row = conn.fetchone(self.sql.content, (content_hash,))
        return (int(row[0]), int(row[1])) if row else None

    def download(self, conn: ConnectionRole, content_hash: bytes, chunks: int,
                 write: Callable[[bytes], object]) -> None:
        """Pass each chunk's data to ``write`` in order, one query per chunk."""
        open_chunk = self.backend.codec.open_chunk
        for num in range(chunks):
            row = conn.fetchone(self.sql.chunk, (content_hash, num))
            if row is None:
                raise KeyError(num)
            write(open_chunk(content_hash, num, bytes(row[0])))

    # -- pack ---------------------------------------------------------------------------
    def unused_contents(self, conn: ConnectionRole, limit: int) -> list[bytes]:
        return [bytes(row[0]) for row in conn.fetchall(self.sql.unused_contents, (limit,))]

    def delete_contents(self, conn: ConnectionRole, hashes: Sequence[bytes]) -> None:
        marks = in_list(len(hashes))
        conn.execute(self.sql.delete_chunks.format(hashes=marks), list(hashes))
        conn.execute(self.sql.delete_contents.format(hashes=marks), list(hashes))

    def revisions_of(self, conn: ConnectionRole, oids: Sequence[int]) -> set[Revision]:
        rows = conn.fetchall(self.sql.refs_in.format(oids=in_list(len(oids))), list(oids))
        return {(int(o), int(t)) for o, t in rows}

    # -- verify -------------------------------------------------------------------------
    def refs_without_content(self, conn: ConnectionRole) -> list[BlobRef]:
        return [BlobRef(int(o), int(t), bytes(h))
                for o, t, h in conn.fetchall(self.sql.refs_without_content)]

    def iter_contents(self, conn: ConnectionRole, batch: int = 500) -> Iterator[BlobContent]:
        after = b""
        while True:
            rows = conn.fetchall(self.sql.contents_after, (after, batch))
            if not rows:
                return
            for content_hash, size, chunks in rows:
                yield BlobContent(bytes(content_hash), int(size), int(chunks))
            after = bytes(rows[-1][0])

    def iter_refs(self, conn: ConnectionRole, batch: int = 500) -> Iterator[BlobRef]:
        oid, tid = -1, -1
        while True:
            rows = conn.fetchall(self.sql.refs_after, (oid, oid, tid, batch))
            if not rows:
                return
            for o, t, h in rows:
                yield BlobRef(int(o), int(t), bytes(h))
            oid, tid = int(rows[-1][0]), int(rows[-1][1])
