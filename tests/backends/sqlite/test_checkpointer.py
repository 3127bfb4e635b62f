"""The write-ahead log checkpointed by a thread of the storage's own, off the commits
(backends/sqlite/checkpointer.py): it checkpoints as commits add pages, keeps the log
bounded, stops with the storage, and is not there when turned off or read-only."""
from __future__ import annotations

import os
import pathlib
import sqlite3
import threading
import time

import pytest
import transaction
from persistent.mapping import PersistentMapping

import zodbsql
from zodbsql.backends.sqlite.adapter import SQLiteBackend
from zodbsql.backends.sqlite.checkpointer import (WalCheckpointer, commits_between,
                                                  frames_written)

storage_backends = ("sqlite",)
storage_backends_reason = "SQLite's write-ahead log"

PAGE = 4096


def test_frames_written_since_the_checkpoint_before() -> None:
    # The log grew from 100 frames (60 of them copied): 50 more were written.
    assert frames_written((100, 60), (150, 150)) == 50
    # All of it was copied before: the next commit started the log over.
    assert frames_written((100, 100), (40, 40)) == 40
    assert frames_written((100, 100), (130, 0)) == 130
    # Shorter than before: it started over.
    assert frames_written((100, 60), (30, 30)) == 30
    assert frames_written((0, 0), (7, 7)) == 7


def test_commits_between_checkpoints_write_about_the_target() -> None:
    # 3 commits wrote 600 frames: 2,000 frames take 10 commits, within twice 8.
    assert commits_between(8, 3, 600, 2000) == 10
    # At most twice the interval before: a first small commit does not space them out.
    assert commits_between(1, 1, 6, 2000) == 2
    assert commits_between(4, 1, 6, 2000) == 8
    # At least one commit; and one when nothing was learnt.
    assert commits_between(5, 1, 9000, 2000) == 1
    assert commits_between(5, 0, 100, 2000) == 1
    assert commits_between(5, 3, 0, 2000) == 1


def open_db(path: pathlib.Path, **query: str) -> object:
    extra = "&".join(f"{key}={value}" for key, value in query.items())
    import ZODB
    storage = zodbsql.open_storage(f"sqlite://{path}" + (f"?{extra}" if extra else ""))
    return ZODB.DB(storage)


def commit_some(db: object, count: int, size: int = 2000) -> None:
    tm = transaction.TransactionManager()
    conn = db.open(transaction_manager=tm)    # type: ignore[attr-defined]
    for number in range(count):
        tm.begin()
        conn.root()[number % 7] = PersistentMapping(data=os.urandom(size) * 1)
        conn.root()[f"more-{number}"] = PersistentMapping(data=os.urandom(size))
        tm.commit()
    conn.close()


def wait_for(predicate: object, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():      # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_storage_s_thread_checkpoints_as_it_commits_and_stops_with_it(
        tmp_path: pathlib.Path) -> None:
    db = open_db(tmp_path / "db.sqlite", wal_autocheckpoint="16")
    checkpointer = db.storage.shared.backend.checkpointer   # type: ignore[attr-defined]
    assert isinstance(checkpointer, WalCheckpointer) and checkpointer.target == 8
    commit_some(db, 60)
    assert wait_for(lambda: checkpointer.checkpoints >= 5), checkpointer.checkpoints
    thread = checkpointer._thread
    assert thread is not None and thread.is_alive()
    db.close()                  # type: ignore[attr-defined]
    assert not thread.is_alive()
    checkpointer.committed()    # after close: nothing starts again
    assert checkpointer._thread is thread and not thread.is_alive()
    # Everything committed is there after a reopen.
    db = open_db(tmp_path / "db.sqlite")
    with db.transaction() as conn:    # type: ignore[attr-defined]
        assert len([key for key in conn.root() if str(key).startswith("more-")]) == 60
    db.close()                  # type: ignore[attr-defined]


def test_a_checkpoint_copies_the_log_into_the_database_file(tmp_path: pathlib.Path) -> None:
    """What the thread checkpointed is in the database file: a connection that reads
    the file without the log (immutable: SQLite then ignores the WAL) counts the rows
    committed through the log, which SQLite itself never checkpointed (its automatic
    checkpoints off)."""
    path = str(tmp_path / "db.sqlite")
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("CREATE TABLE t (n INTEGER, data BLOB)")
    checkpointer = WalCheckpointer(path, 2, "normal", 5.0)
    try:
        for number in range(1, 6):
            writer.execute("INSERT INTO t VALUES (?, ?)", (number, os.urandom(5000)))
            checkpointer.committed()
            assert wait_for(lambda: checkpointer.checkpoints >= number - 1)
        assert wait_for(lambda: rows_in_file_alone(path) == 5)
    finally:
        checkpointer.close()
        writer.close()


def rows_in_file_alone(path: str) -> int:
    reader = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return int(reader.execute("SELECT count(*) FROM t").fetchone()[0])
    except sqlite3.DatabaseError:
        return -1               # caught between two pages of a copy
    finally:
        reader.close()


def test_no_thread_when_turned_off_or_read_only(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "db.sqlite"
    before = threading.active_count()
    db = open_db(path, checkpoint_in_background="false")
    assert db.storage.shared.backend.checkpointer is None   # type: ignore[attr-defined]
    commit_some(db, 3)
    assert threading.active_count() == before
    db.close()                  # type: ignore[attr-defined]
    storage = zodbsql.open_storage(f"sqlite://{path}?read_only=true")
    try:
        backend = storage.shared.backend
        assert isinstance(backend, SQLiteBackend) and backend.checkpointer is None
    finally:
        storage.close()


def test_a_checkpointer_never_started_closes(tmp_path: pathlib.Path) -> None:
    checkpointer = WalCheckpointer(str(tmp_path / "none.sqlite"), 100, "normal", 1.0)
    checkpointer.close()
    checkpointer.committed()
    assert checkpointer._thread is None and checkpointer.checkpoints == 0


def test_an_unreadable_file_leaves_the_checkpoints_to_the_commits(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    """The thread's own connection fails: it says so and ends; commits go on."""
    (tmp_path / "not-a-db.sqlite").write_bytes(b"this is not a database" * 100)
    checkpointer = WalCheckpointer(str(tmp_path / "not-a-db.sqlite"), 100, "normal", 1.0)
    checkpointer.committed()
    thread = checkpointer._thread
    assert thread is not None
    thread.join(10)
    assert not thread.is_alive()
    assert "checkpoints go back to the commits" in caplog.text
    checkpointer.close()
