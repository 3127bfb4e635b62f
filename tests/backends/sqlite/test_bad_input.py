"""Bad input gives a clear error and leaves the database exactly as it was."""
from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

import pytest
import transaction
import transaction.interfaces
import ZODB
from persistent.mapping import PersistentMapping
from ZODB import POSException
from ZODB.utils import u64

import zodbsql
from zodbsql.backends.base.schema import SCHEMA_VERSION
from zodbsql.errors import (CommitLockTimeout, ConfigurationError, CorruptRecordError,
                            SchemaError)

MODE_NAMES = {True: "history-preserving", False: "history-free"}
storage_backends = ("sqlite",)
storage_backends_reason = "these cases edit SQLite files directly"


def sqlite_only(factory: Any) -> str:
    """The database file."""
    return str(factory.path)


def snapshot(path: str) -> tuple[bytes, list[str] | None, bool]:
    """The file's bytes, its SQL dump (None if SQLite can't read it), whether a WAL is left."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            dump: list[str] | None = list(raw.iterdump())
        finally:
            raw.close()
    except sqlite3.DatabaseError:
        dump = None
    return data, dump, os.path.exists(path + "-wal") and os.path.getsize(path + "-wal") > 0


def make_database(factory: Any, **options: Any) -> bytes:
    """A zodbsql database holding root['obj'], closed again; returns obj's oid."""
    db = ZODB.DB(factory.open(**options))
    try:
        with db.transaction() as conn:
            conn.root()["obj"] = PersistentMapping({"value": 1})
            conn.root()["obj"]["value"] = 1
        with db.transaction() as conn:
            return conn.root()["obj"]._p_oid
    finally:
        db.close()


def test_wrong_history_mode(storage_factory: Any) -> None:
    path = sqlite_only(storage_factory)
    keep_history = storage_factory.param.keep_history
    make_database(storage_factory)
    before = snapshot(path)
    with pytest.raises(SchemaError) as info:
        storage_factory.open(keep_history=not keep_history)
    message = str(info.value)
    assert MODE_NAMES[True] in message and MODE_NAMES[False] in message
    assert path in message
    assert snapshot(path) == before
    storage_factory.open().close()  # still opens in its own mode


def test_missing_directory(storage_factory: Any) -> None:
    sqlite_only(storage_factory)  # a missing directory for the database file
    path = str(storage_factory.tmp_path / "no-such-dir" / "Data.sqlite")
    with pytest.raises(ConfigurationError) as info:
        storage_factory.open(path)
    assert path in str(info.value)
    assert not os.path.exists(os.path.dirname(path))


def test_foreign_sqlite_database(storage_factory: Any) -> None:
    path = sqlite_only(storage_factory)
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    raw.execute("INSERT INTO customers (name) VALUES ('ada')")
    raw.commit()
    raw.close()
    before = snapshot(path)
    with pytest.raises(SchemaError) as info:
        storage_factory.open()
    assert "customers" in str(info.value)
    # Not even the journal mode may change: the file is someone else's.
    assert snapshot(path) == before


def test_not_an_sqlite_file(storage_factory: Any) -> None:
    path = sqlite_only(storage_factory)
    with open(path, "wb") as f:
        f.write(bytes(range(256)) * 64)  # fixed "random" bytes: deterministic
    before = snapshot(path)
    assert before[1] is None  # SQLite itself can't read it
    with pytest.raises(SchemaError) as info:
        storage_factory.open()
    assert "not an SQLite database" in str(info.value)
    assert path in str(info.value)
    assert snapshot(path) == before


def test_other_schema_version(storage_factory: Any) -> None:
    path = sqlite_only(storage_factory)
    make_database(storage_factory)
    raw = sqlite3.connect(path)
    raw.execute("UPDATE zodbsql_meta SET value = '99' WHERE name = 'schema_version'")
    raw.commit()
    raw.close()
    before = snapshot(path)
    with pytest.raises(SchemaError) as info:
        storage_factory.open()
    message = str(info.value)
    assert "version 99" in message and f"version {SCHEMA_VERSION}" in message
    assert snapshot(path) == before


def test_no_schema_and_create_schema_false(storage_factory: Any) -> None:
    path = sqlite_only(storage_factory)
    with pytest.raises(SchemaError) as info:
        storage_factory.open(create_schema=False)
    assert "create-schema is false" in str(info.value)
    # Nothing was created: no file, or an empty one with no tables.
    assert not os.path.exists(path) or os.path.getsize(path) == 0
    storage_factory.open().close()  # the path is still usable, and the new file is WAL
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()


def test_read_only(storage_factory: Any) -> None:
    path = sqlite_only(storage_factory)
    with pytest.raises(ConfigurationError) as info:
        storage_factory.open(read_only=True)
    assert path in str(info.value) and "read-only" in str(info.value)
    assert not os.path.exists(path)

    oid = make_database(storage_factory)
    before = snapshot(path)
    storage = storage_factory.open(read_only=True)
    assert storage.isReadOnly()
    state, _ = storage.load(oid)
    assert state  # reading works
    with pytest.raises(POSException.ReadOnlyError):
        storage.new_oid()
    with pytest.raises(POSException.ReadOnlyError):
        storage.tpc_begin(transaction.Transaction())
    db = ZODB.DB(storage)
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    conn.root()["obj"]["value"] = 2
    with pytest.raises(POSException.ReadOnlyError):
        tm.commit()
    tm.abort()
    db.close()
    assert snapshot(path)[:2] == before[:2]


def test_corrupt_state(storage_factory: Any) -> None:
    path = sqlite_only(storage_factory)
    oid = make_database(storage_factory)
    raw = sqlite3.connect(path)
    (state,) = raw.execute("SELECT state FROM object_state WHERE zoid = ?",
                           (u64(oid),)).fetchone()
    bad = bytes(state[:-2]) + bytes([state[-2] ^ 0xFF]) + bytes(state[-1:])
    raw.execute("UPDATE object_state SET state = ? WHERE zoid = ?", (bad, u64(oid)))
    raw.commit()
    raw.close()

    storage = storage_factory.open()  # fresh: nothing cached
    with pytest.raises(CorruptRecordError) as info:
        storage.load(oid)
    assert f"0x{u64(oid):016x}" in str(info.value)
    assert info.value.oid == u64(oid)
    db = ZODB.DB(storage)  # and through ZODB: the error reaches the application
    try:
        with pytest.raises(CorruptRecordError):
            with db.transaction() as conn:
                conn.root()["obj"]["value"]
    finally:
        db.close()


def test_commit_lock_timeout(storage_factory: Any) -> None:
    path = sqlite_only(storage_factory)
    db = ZODB.DB(storage_factory.open(commit_lock_timeout=0.5))
    try:
        with db.transaction() as conn:
            conn.root()["n"] = 0
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another writer holds SQLite's write lock
        tm = transaction.TransactionManager()
        conn = db.open(tm)
        conn.root()["n"] = 1
        started = time.monotonic()
        with pytest.raises(CommitLockTimeout) as info:
            tm.commit()
        waited = time.monotonic() - started
        tm.abort()
        holder.execute("ROLLBACK")
        holder.close()
        assert isinstance(info.value, transaction.interfaces.TransientError)
        assert isinstance(info.value, POSException.StorageTransactionError)
        assert "commit-lock-timeout" in str(info.value)
        assert 0.4 <= waited < 5, waited
        conn.root()["n"] = 1  # the retry, once the lock is free, commits
        tm.commit()
        conn.close()
        with db.transaction() as check:
            assert check.root()["n"] == 1
    finally:
        db.close()


@pytest.mark.parametrize("query, words", [
    ("?bogus=1", ["bogus"]),
    ("?keep_history=maybe", ["keep_history", "maybe"]),
    ("?read-only=2", ["read_only", "'2'"]),
    ("?commit_lock_timeout=soon", ["commit_lock_timeout", "soon"]),
    ("?commit_lock_timeout=0", ["commit-lock-timeout"]),
    ("?synchronous=sometimes", ["synchronous", "sometimes"]),
    ("?wal_autocheckpoint=0", ["wal-autocheckpoint", "1 page or more", "got 0"]),
    ("?wal_autocheckpoint=lots", ["wal_autocheckpoint", "lots"]),
])
def test_bad_url_option(tmp_path: Any, query: str, words: list[str]) -> None:
    path = tmp_path / "Data.sqlite"
    with pytest.raises(ConfigurationError) as info:
        zodbsql.open_storage(f"sqlite://{path}{query}")
    assert all(word in str(info.value) for word in words), str(info.value)
    assert not path.exists()


def test_unknown_url_scheme(tmp_path: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        zodbsql.open_storage(f"oracle://{tmp_path}/Data")
    assert "oracle://" in str(info.value) and "sqlite://" in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("query, pages", [("", 4000), ("?wal_autocheckpoint=250", 250)])
def test_every_connection_checkpoints_at_the_configured_pages(
        tmp_path: Any, query: str, pages: int) -> None:
    """SQLite's wal_autocheckpoint is a connection's setting: each connection the backend
    opens (for loads and for commits alike) has the configured one."""
    db = zodbsql.open_db(f"sqlite://{tmp_path}/Data.sqlite{query}")
    try:
        with db.transaction() as conn:
            conn.root()["n"] = 1
        storage = db.storage
        opened = [storage.shared.backend.connect() for _ in range(2)]
        try:
            for each in opened:
                assert each.fetchone("PRAGMA wal_autocheckpoint") == (pages,)
        finally:
            for each in opened:
                each.close()
    finally:
        db.close()
