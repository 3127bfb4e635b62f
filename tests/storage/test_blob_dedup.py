"""Blob deduplication in the database layout, measured by what is sent.

Row counts can't show it (chunks are inserted if absent, so sending a content twice
leaves the same rows); the bytes handed to the upload can.
"""
from __future__ import annotations

import os
from typing import Any, Iterator

import transaction
import ZODB
from ZODB.blob import Blob

CHUNK = 4096


class UploadMeter:
    """Wraps the backend's ``upload``: the bytes of each content sent, in order."""

    def __init__(self, storage: Any) -> None:
        self.blobs = storage.backend.blobs
        self.real = self.blobs.upload
        self.sent: list[int] = []
        self.blobs.upload = self.upload

    def upload(self, conn: Any, content_hash: bytes, size: int, chunks: Iterator[bytes]) -> int:
        data = list(chunks)
        self.sent.append(sum(len(chunk) for chunk in data))
        return self.real(conn, content_hash, size, iter(data))

    def take(self) -> list[int]:
        sent, self.sent = self.sent, []
        return sent

    def close(self) -> None:
        self.blobs.upload = self.real


def test_known_content_is_never_sent_again(storage_factory: Any, tmp_path: Any) -> None:
    storage = storage_factory.open(blob_dir=str(tmp_path / "cache"), blob_chunk_size=CHUNK)
    meter = UploadMeter(storage)
    db = ZODB.DB(storage)
    try:
        tm = transaction.TransactionManager()
        root = db.open(tm).root()
        known, new = os.urandom(3 * CHUNK + 7), os.urandom(CHUNK + 1)
        root["a"] = Blob(known)
        tm.commit()
        assert meter.take() == [len(known)]
        root["b"] = Blob(known)            # a second blob, same content: nothing sent
        tm.commit()
        assert meter.take() == []
        root["c"], root["d"] = Blob(new), Blob(new)   # new content twice in one commit
        tm.commit()
        assert meter.take() == [len(new)]
        del root["a"], root["b"]
        tm.commit()
        db.pack()                          # frees the content no revision uses any more
        root["e"] = Blob(known)            # unknown again: sent again
        tm.commit()
        assert meter.take() == [len(known)]
        with root["e"].open() as f:
            assert f.read() == known
    finally:
        meter.close()
        db.close()
