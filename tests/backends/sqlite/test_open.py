"""Opening a storage on an SQLite file that holds a current zodbsql database writes
nothing, so it opens while another process holds the file's write lock (a long commit,
a pack's batch): a writable open that took the lock would wait for it, then fail."""
from __future__ import annotations

import pathlib
import sqlite3
import threading
import time
from typing import Any

import pytest
import ZODB
from persistent.mapping import PersistentMapping

from zodbsql.backends.sqlite.adapter import in_wal_mode
from zodbsql.backends.sqlite.options import SQLiteOptions
from zodbsql.backends.sqlite.schema import use_wal
from zodbsql.errors import CommitLockTimeout

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


def definitions(path: str, names: tuple[str, ...]) -> dict[str, str]:
    """The CREATE statements SQLite keeps for ``names`` (tables and their indexes)."""
    raw = sqlite3.connect(path)
    try:
        rows = raw.execute("SELECT name, sql FROM sqlite_master WHERE tbl_name IN"
                           f" ({', '.join('?' for _ in names)})", names).fetchall()
    finally:
        raw.close()
    return dict(rows)


def test_an_older_file_gets_the_tables_a_new_file_of_its_mode_has(
        storage_factory: Any) -> None:
    """The blob tables and the deletion record, added at the first writable open of a
    file made before them, are defined as a new file's: each history mode keys its
    blob references its own way (by revision, or one an object)."""
    added = ("blob_ref", "blob_chunk", "blob_content", "object_gone", "gone_row", "gone_oids")
    storage_factory.open().close()
    new = definitions(storage_factory.path, added)
    older = storage_factory.new_path()
    storage_factory.open(older).close()
    raw = sqlite3.connect(older, isolation_level=None)
    try:
        raw.execute("BEGIN")
        raw.execute("DROP VIEW gone_oids")
        for table in added[:-1]:
            raw.execute(f"DROP TABLE {table}")
        raw.execute("COMMIT")
    finally:
        raw.close()
    assert definitions(older, added) == {}
    storage_factory.open(older).close()
    assert definitions(older, added) == new
    assert set(added) | {"blob_ref_hash"} <= set(new)


def held_reader(path: pathlib.Path) -> sqlite3.Connection:
    """A connection inside a read transaction on ``path`` (a new file in rollback-journal
    mode, with one table): while it reads, SQLite refuses the switch to WAL at once."""
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("CREATE TABLE t (x INTEGER)")
    writer.close()
    reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM t").fetchall()
    return reader


def test_the_switch_to_wal_waits_for_a_reader_then_gives_up(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "waits.sqlite"
    reader = held_reader(path)
    # A file without zodbsql's tables: connect leaves its journal alone.  Each try of
    # the switch may wait out the busy timeout (0.2 s here) before it is refused.
    conn = SQLiteOptions(path=str(path)).create_backend(True, 0.2).connect()
    try:
        threading.Timer(0.3, reader.rollback).start()
        started = time.monotonic()
        use_wal(conn, 5.0)
        assert 0.3 <= time.monotonic() - started < 4.5
        assert in_wal_mode(str(path))
    finally:
        conn.close()
        reader.close()
    path = tmp_path / "gives-up.sqlite"
    reader = held_reader(path)
    conn = SQLiteOptions(path=str(path)).create_backend(True, 0.2).connect()
    try:
        started = time.monotonic()
        with pytest.raises(CommitLockTimeout):
            use_wal(conn, 0.3)
        assert time.monotonic() - started >= 0.3
        assert not in_wal_mode(str(path))
    finally:
        conn.close()
        reader.close()
