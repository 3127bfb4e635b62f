"""What every SQLite connection is set to, as SQLite itself reports it: a setting that
silently did not apply (synchronous above all: FULL is what survives a power cut) would
show in no other test."""
from __future__ import annotations

import os
import pathlib
import sqlite3
import threading
from typing import Any

import pytest

import zodbsql

from zodbsql.backends.sqlite.adapter import in_wal_mode
from zodbsql.backends.sqlite.options import SQLiteOptions
from zodbsql.errors import ConfigurationError, DatabaseError, SchemaError

storage_backends = ("sqlite",)
storage_backends_reason = "SQLite's own pragmas"

#: PRAGMA synchronous answers a number.
SYNCHRONOUS = {"off": 0, "normal": 1, "full": 2, "extra": 3}


def pragmas(conn: Any) -> dict[str, Any]:
    names = ("synchronous", "journal_mode", "wal_autocheckpoint", "foreign_keys",
             "temp_store")
    found = {}
    for name in names:
        row = conn.fetchone(f"PRAGMA {name}")
        found[name] = row[0]
    return found


def backend_of(path: pathlib.Path, read_only: bool = False, lock_timeout: float = 5.0,
               **options: Any) -> Any:
    return SQLiteOptions(path=str(path), **options).create_backend(True, lock_timeout,
                                                                   read_only)


def test_a_storage_s_connections_by_default(tmp_path: pathlib.Path) -> None:
    # (The tests' own storages sync normal: tests/databases.py.)
    storage = zodbsql.open_storage(f"sqlite://{tmp_path / 'db.sqlite'}")
    conn = storage.backend.connect()
    try:
        assert conn.statements == 0    # the set-up is not counted as the storage's work
        assert pragmas(conn) == {"synchronous": 2, "journal_mode": "wal",
                                 "wal_autocheckpoint": 4000, "foreign_keys": 0,
                                 "temp_store": 2}
    finally:
        conn.close()
        storage.close()


@pytest.mark.parametrize("mode", ["off", "normal", "FULL", "Extra"])
def test_each_synchronous_mode_applies(tmp_path: pathlib.Path, mode: str) -> None:
    conn = backend_of(tmp_path / "db.sqlite", synchronous=mode,
                      wal_autocheckpoint=250).connect()
    try:
        found = pragmas(conn)
        assert (found["synchronous"], found["wal_autocheckpoint"]) == (
            SYNCHRONOUS[mode.lower()], 250)
    finally:
        conn.close()


def test_a_file_becomes_wal_only_with_zodbsql_s_tables(tmp_path: pathlib.Path,
                                                       storage_factory: Any) -> None:
    path = tmp_path / "other.sqlite"
    conn = backend_of(path).connect()
    try:
        # Someone else's (or a new, empty) file: its journal is left as it is.
        conn.execute("CREATE TABLE theirs (x INTEGER)")
        assert pragmas(conn)["journal_mode"] == "delete"
    finally:
        conn.close()
    assert not in_wal_mode(str(path))
    storage = storage_factory.open()
    assert in_wal_mode(storage_factory.path)
    storage.close()


@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
def test_busy_waits_last_commit_lock_timeout(storage_factory: Any, read_only: bool) -> None:
    storage_factory.open().close()
    conn = backend_of(pathlib.Path(storage_factory.path), read_only=read_only,
                      lock_timeout=7.25).connect()
    try:
        assert conn.fetchone("PRAGMA busy_timeout") == (7250,)
        # Any thread of the process may use a connection (the pool hands them round).
        answers: list[Any] = []
        worker = threading.Thread(target=lambda: answers.append(conn.fetchone("SELECT 1")))
        worker.start()
        worker.join()
        assert answers == [(1,)]
    finally:
        conn.close()


def test_read_only_connections(tmp_path: pathlib.Path, storage_factory: Any) -> None:
    storage_factory.open().close()
    conn = backend_of(pathlib.Path(storage_factory.path), read_only=True,
                      synchronous="normal").connect()
    try:
        found = pragmas(conn)
        # Read-only: no checkpoint of its own (SQLite's default), synchronous as set.
        assert (found["synchronous"], found["journal_mode"], found["wal_autocheckpoint"],
                found["temp_store"]) == (1, "wal", 1000, 2)
        with pytest.raises(Exception, match="readonly"):
            conn.execute("CREATE TABLE t (x INTEGER)")
    finally:
        conn.close()


def test_a_zodbsql_file_out_of_wal_is_switched_back_at_connect(storage_factory: Any) -> None:
    storage_factory.open().close()
    path = pathlib.Path(storage_factory.path)
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
    raw.close()
    reader = backend_of(path, read_only=True).connect()
    try:
        assert pragmas(reader)["journal_mode"] == "delete"    # read-only: left as it is
    finally:
        reader.close()
    assert not in_wal_mode(str(path))
    conn = backend_of(path).connect()        # no schema check: the connection alone
    conn.close()
    assert in_wal_mode(str(path))


def test_a_file_gone_before_the_read_only_connection(tmp_path: pathlib.Path,
                                                    storage_factory: Any) -> None:
    storage_factory.open().close()
    backend = backend_of(pathlib.Path(storage_factory.path), read_only=True)
    for suffix in ("", "-wal", "-shm"):
        pathlib.Path(storage_factory.path + suffix).unlink(missing_ok=True)
    with pytest.raises(DatabaseError) as info:
        backend.connect()
    assert str(info.value) == (
        f"cannot open SQLite database {storage_factory.path}: unable to open database file")


def test_the_database_size_is_its_pages(storage_factory: Any) -> None:
    storage = storage_factory.open()
    conn = storage.backend.connect()
    try:
        pages, size = conn.fetchone("PRAGMA page_count")[0], conn.fetchone("PRAGMA page_size")[0]
        assert pages > 1 and storage.backend.database_size(conn) == pages * size
    finally:
        conn.close()


def test_the_files_beside_a_wal_database(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "db.sqlite"
    assert not in_wal_mode(str(path))          # missing
    path.write_bytes(b"SQLite format 3\0" + b"\0" * 2 + b"\x02\x02" + b"\0" * 80)
    assert in_wal_mode(str(path))
    path.write_bytes(b"SQLite format 3\0" + b"\0" * 2 + b"\x01\x01" + b"\0" * 80)
    assert not in_wal_mode(str(path))          # rollback journal
    path.write_bytes(b"Not SQLite at all\0" + b"\x02\x02" + b"\0" * 80)
    assert not in_wal_mode(str(path))


def test_what_a_path_must_be(tmp_path: pathlib.Path) -> None:
    def refusal(path: pathlib.Path, read_only: bool = False) -> str:
        with pytest.raises(ConfigurationError) as info:
            backend_of(path, read_only)
        return str(info.value)

    missing_dir = tmp_path / "nowhere" / "db.sqlite"
    assert refusal(missing_dir) == (
        f"the directory of the SQLite database {missing_dir} does not exist; create it"
        " first (zodbsql creates the file, not its directory)")
    assert refusal(tmp_path) == f"SQLite path {tmp_path} is a directory, not a file"
    absent = tmp_path / "absent.sqlite"
    assert refusal(absent, read_only=True) == (
        f"SQLite database {absent} does not exist and the storage is read-only")
    with pytest.raises(SchemaError) as info:
        backend_of(absent).check_exists()
    assert str(info.value) == (
        f"SQLite database {absent} does not exist and create-schema is false, so it was"
        " not created")
    # A path with ~ is the user's: made absolute.
    home = pathlib.Path(os.path.expanduser("~"))
    assert backend_of(pathlib.Path("~") / "x.sqlite").path == str(home / "x.sqlite")
    relative = backend_of(pathlib.Path("rel.sqlite"))
    assert relative.path == os.path.abspath("rel.sqlite")
    assert relative.describe() == f"SQLite database {os.path.abspath('rel.sqlite')}"
    assert relative.sort_key() == f"zodbsql:sqlite3:{os.path.abspath('rel.sqlite')}"


@pytest.mark.parametrize("mode", ["full", "extra", "normal", "off"])
def test_the_oid_counter_advances_without_a_sync_of_its_own(tmp_path: pathlib.Path,
                                                            mode: str) -> None:
    """An oid block taken outside a commit commits unsynced (synchronous NORMAL;
    backends/sqlite/oidalloc.py says why that loses nothing), and the connection's own
    setting is back after, also when the allocation fails; one taken inside a commit's
    transaction commits with it, as set."""
    storage = zodbsql.open_storage(f"sqlite://{tmp_path / 'db.sqlite'}?synchronous={mode}")
    conn = storage.backend.connect()
    at_commit: list[int] = []
    commit = conn.commit

    def noting() -> None:
        at_commit.append(conn.raw.execute("PRAGMA synchronous").fetchone()[0])
        commit()
    setattr(conn, "commit", noting)       # this connection only
    oids = storage.backend.oids
    unsynced = min(SYNCHRONOUS[mode], SYNCHRONOUS["normal"])
    try:
        first = oids.allocate(conn, 16)
        assert at_commit == [unsynced]
        assert pragmas(conn)["synchronous"] == SYNCHRONOUS[mode]
        conn.begin_write()
        second = oids.allocate(conn, 32)         # inside a transaction: not committed
        assert at_commit == [unsynced] and pragmas(conn)["synchronous"] == SYNCHRONOUS[mode]
        conn.commit()
        assert at_commit == [unsynced, SYNCHRONOUS[mode]]
        assert second == list(range(first[-1] + 1, first[-1] + 33))
        conn.raw.execute("DROP TABLE oid_counter")
        with pytest.raises(DatabaseError, match="oid_counter"):
            oids.allocate(conn, 16)
        assert pragmas(conn)["synchronous"] == SYNCHRONOUS[mode]
    finally:
        conn.close()
        storage.close()
