"""Opening a storage on an SQLite file that holds a current zodbsql database writes
nothing, so it opens while another process holds the file's write lock (a long commit,
a pack's batch): a writable open that took the lock would wait for it, then fail."""
from __future__ import annotations

import sqlite3
from typing import Any

import pytest
import ZODB
from persistent.mapping import PersistentMapping

storage_backends = ("sqlite",)
storage_backends_reason = "the write lock of an SQLite file, held by sqlite3 itself"


@pytest.mark.parametrize("with_blobs", [False, True], ids=["plain", "blob-dir"])
def test_a_storage_opens_while_another_process_holds_the_write_lock(
        storage_factory: Any, tmp_path: Any, with_blobs: bool) -> None:
    options = {"blob_dir": str(tmp_path / "blobs")} if with_blobs else {}
    db = ZODB.DB(storage_factory.open(**options))
    try:
        with db.transaction() as conn:
            conn.root()["kept"] = PersistentMapping(value=1)
    finally:
        db.close()
    writer = sqlite3.connect(storage_factory.path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT INTO zodbsql_meta (name, value) VALUES ('held', 'by another')")
        # A write it tried would wait the second out and raise CommitLockTimeout.
        db = ZODB.DB(storage_factory.open(commit_lock_timeout=1, **options))
        try:
            with db.transaction() as conn:
                assert conn.root()["kept"]["value"] == 1
        finally:
            db.close()
    finally:
        writer.rollback()
        writer.close()
