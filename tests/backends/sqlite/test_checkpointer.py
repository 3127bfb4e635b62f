"""The write-ahead log checkpointed by a thread of the storage's own, off the commits
(backends/sqlite/checkpointer.py): it checkpoints as commits add pages, keeps the log
bounded, stops with the storage, and is not there when turned off or read-only."""
from __future__ import annotations

import contextlib
import os
import pathlib
import sqlite3
import threading
import time
from typing import Iterator

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
    # As long as before, not all of it copied then: nothing new.
    assert frames_written((100, 60), (100, 100)) == 0


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
    # A frame a commit: as many commits as the target, within twice the interval.
    assert commits_between(4, 1, 1, 2000) == 8
    # Whole commits, rounded down.
    between = commits_between(8, 1, 600, 2000)
    assert between == 3 and isinstance(between, int)


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


@contextlib.contextmanager
def written(path: str, threshold: int, journal: str = "WAL"
            ) -> Iterator[tuple[sqlite3.Connection, WalCheckpointer]]:
    """A database of one table, a connection that writes it (SQLite's own checkpoints
    off: what reaches the file, the thread copied) and a checkpointer of it for
    ``threshold`` pages; both closed at the end."""
    writer = sqlite3.connect(path, isolation_level=None)
    checkpointer = WalCheckpointer(path, threshold, "normal", 5.0)
    try:
        writer.execute(f"PRAGMA journal_mode = {journal}")
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("CREATE TABLE t (n INTEGER, data BLOB)")
        yield writer, checkpointer
    finally:
        checkpointer.close()
        writer.close()


def first_round(checkpointer: WalCheckpointer) -> None:
    """A commit, and the thread's round that follows."""
    checkpointer.committed()
    assert wait_for(lambda: checkpointer.rounds == 1)


def test_a_checkpoint_copies_the_log_into_the_database_file(tmp_path: pathlib.Path) -> None:
    """What the thread checkpointed is in the database file: a connection that reads
    the file without the log (immutable: SQLite then ignores the WAL) counts the rows
    committed through the log, which SQLite itself never checkpointed (its automatic
    checkpoints off)."""
    path = str(tmp_path / "db.sqlite")
    with written(path, 2) as (writer, checkpointer):
        for number in range(1, 6):
            writer.execute("INSERT INTO t VALUES (?, ?)", (number, os.urandom(5000)))
            checkpointer.committed()
            assert wait_for(lambda: checkpointer.checkpoints >= number - 1)
        assert wait_for(lambda: rows_in_file_alone(path) == 5)


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
    assert [record.getMessage() for record in caplog.records] == [
        f"SQLite database {tmp_path / 'not-a-db.sqlite'}: checkpoints go back to the"
        " commits (file is not a database)"]
    checkpointer.close()



def test_the_interval_is_learnt_from_each_checkpoint(tmp_path: pathlib.Path) -> None:
    """The thread wakes at the first commit, then after as many as should write half
    the threshold's frames at the rate seen, doubling at most each time."""
    path = str(tmp_path / "db.sqlite")
    assert WalCheckpointer(path, 3, "normal", 5.0).target == 1
    with written(path, 41) as (writer, checkpointer):
        assert checkpointer.target == 20
        writer.execute("INSERT INTO t VALUES (1, ?)", (os.urandom(2000),))
        first_round(checkpointer)            # the first commit wakes it
        thread = checkpointer._thread
        assert thread is not None and thread.daemon and path in thread.name
        # The table's creation and a row: a few frames for 1 commit, within 2 x 1.
        assert checkpointer.checkpoints == 1 and checkpointer._every == 2
        writer.execute("INSERT INTO t VALUES (2, ?)", (os.urandom(2000),))
        checkpointer.committed()             # one of the two: it sleeps on
        time.sleep(0.3)
        assert checkpointer.rounds == 1
        writer.execute("INSERT INTO t VALUES (3, ?)", (os.urandom(2000),))
        checkpointer.committed()
        assert wait_for(lambda: checkpointer.rounds == 2)
        # Two commits wrote a frame each (the log started over): 20 take 20 commits,
        # within twice 2.
        assert checkpointer.checkpoints == 2 and checkpointer._every == 4


def test_an_empty_log_is_checkpointed_all_the_same(tmp_path: pathlib.Path) -> None:
    with written(str(tmp_path / "db.sqlite"), 100) as (writer, checkpointer):
        writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        first_round(checkpointer)
        assert checkpointer.checkpoints == 1 and checkpointer._every == 1


def test_a_database_switched_to_wal_after_the_thread_opened_it(
        tmp_path: pathlib.Path) -> None:
    """A new database is switched to WAL once its schema exists, after its first
    commit woke the thread: the thread's next round checkpoints it."""
    path = str(tmp_path / "db.sqlite")
    with written(path, 100, journal="DELETE") as (writer, checkpointer):
        first_round(checkpointer)
        assert checkpointer.checkpoints == 0 and checkpointer._every == 1
        writer.execute("PRAGMA journal_mode = WAL")
        writer.execute("INSERT INTO t VALUES (1, ?)", (os.urandom(2000),))
        checkpointer.committed()             # one commit is enough again
        assert wait_for(lambda: checkpointer.rounds == 2)
        assert checkpointer.checkpoints == 1
        assert rows_in_file_alone(path) == 1


def test_a_file_the_thread_cannot_open_leaves_the_checkpoints_to_the_commits(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    path = str(tmp_path / "no such directory" / "db.sqlite")
    checkpointer = WalCheckpointer(path, 100, "normal", 1.0)
    checkpointer.committed()
    thread = checkpointer._thread
    assert thread is not None
    thread.join(10)
    assert not thread.is_alive() and checkpointer.rounds == 0
    assert (f"SQLite database {path}: no checkpoints off the commits, the commits make"
            " them (unable to open database file)") in caplog.text
    checkpointer.close()


def test_a_single_frame_counts_from_an_empty_log(tmp_path: pathlib.Path) -> None:
    with written(str(tmp_path / "db.sqlite"), 2001) as (writer, checkpointer):
        writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        writer.execute("INSERT INTO t VALUES (1, x'00')")      # one page: one frame
        first_round(checkpointer)
        # 1,000 frames at one a commit: 1,000 commits, within twice 1.
        assert checkpointer.checkpoints == 1 and checkpointer._every == 2


def test_frames_a_reader_keeps_from_the_file_still_count_as_written(
        tmp_path: pathlib.Path) -> None:
    """A reader whose snapshot is older than the log's frames keeps them out of the
    database file (nothing is copied), and they count as written all the same."""
    path = str(tmp_path / "db.sqlite")
    with written(path, 2001) as (writer, checkpointer):
        writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as reader:
            reader.execute("BEGIN")
            assert reader.execute("SELECT count(*) FROM t").fetchone()[0] == 0
            writer.execute("INSERT INTO t VALUES (1, ?)", (os.urandom(2000),))
            first_round(checkpointer)
            assert checkpointer.checkpoints == 1 and checkpointer._every == 2
            assert rows_in_file_alone(path) == 0
