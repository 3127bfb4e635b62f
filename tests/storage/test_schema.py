"""The schema on every backend: what a new database records, which databases a storage
refuses (with words that name the problem) and leaves exactly as they were, what is
added to an older database opened for writing, and what zap drops: zodbsql's tables
and views, never another application's.

Databases are looked at through a backend made from the factory's options, which
prepares no schema (a storage's open would create one).
"""
from __future__ import annotations

from typing import Any, Iterator

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.blob import Blob
from ZODB.utils import u64

from tests.together import call_at_once
from zodbsql.backends.base.schema import MIGRATABLE_VERSION, SCHEMA_VERSION, TABLES
from zodbsql.errors import SchemaError

MODE = {True: "history-preserving", False: "history-free"}
FOREIGN = ("t_f", "t_e", "t_d", "t_c", "t_b", "t_a")


def run(factory: Any, *statements: str, path: str | None = None) -> None:
    """``statements`` in one write transaction on the database (DDL included)."""
    conn = factory.backend(path).connect()
    try:
        conn.begin_write()
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def picture(factory: Any, path: str | None = None) -> dict[str, Any]:
    """What a refused open must leave as it was: the tables and views, the meta rows,
    and (where there is a schema) the stored revisions and the deletion record's row."""
    backend = factory.backend(path)
    conn = backend.connect()
    try:
        views = backend.schema.list_views(conn)
        tables = backend.schema.list_tables(conn) - views
        seen: dict[str, Any] = {"tables": tables, "views": views,
                                "meta": backend.schema.read_meta(conn)}
        if "object_state" in tables:
            seen["states"] = conn.fetchall("SELECT zoid, tid FROM object_state ORDER BY zoid, tid")
        if "gone_row" in tables:
            seen["gone_row"] = conn.fetchall(
                "SELECT id, last_seq, floor_seq, floor_tid, mark_seq FROM gone_row")
        conn.rollback()
        return seen
    finally:
        conn.close()


def describe(factory: Any, path: str | None = None) -> str:
    return factory.backend(path).describe()


def make_database(factory: Any, path: str | None = None) -> None:
    db = ZODB.DB(factory.open(path))
    try:
        with db.transaction() as conn:
            conn.root()["kept"] = PersistentMapping(value=1)
    finally:
        db.close()


def empty_database(factory: Any) -> str:
    """A new database (an SQLite file, a PostgreSQL schema, a MySQL database) with no
    table at all."""
    path = factory.new_path()
    conn = factory.backend(path).connect()   # SQLite: the file, empty
    conn.close()
    return path


def set_version(factory: Any, version: str) -> None:
    run(factory, f"UPDATE zodbsql_meta SET value = '{version}' WHERE name = 'schema_version'")


def the_meta(keep_history: bool, backend: str) -> dict[str, str]:
    meta = {"schema_version": str(SCHEMA_VERSION),
            "keep_history": "true" if keep_history else "false"}
    if backend == "mysql":
        meta["pack_gate"] = ""     # its pack gate is a row (backends/mysql/locker.py)
    return meta


def test_a_new_database_records_its_version_and_history_mode(storage_factory: Any) -> None:
    keep_history = storage_factory.param.keep_history
    make_database(storage_factory)
    seen = picture(storage_factory)
    assert seen["meta"] == the_meta(keep_history, storage_factory.param.backend)
    assert seen["views"] == {"object_ref", "gone_oids"}
    expected = {"object_state", "commit_row", "zodbsql_meta", "blob_ref",
                "blob_chunk", "blob_content", "object_gone", "gone_row"}
    if keep_history:
        expected |= {"transactions", "current_object"}
    if storage_factory.param.backend == "postgresql":
        expected.add("commit_log")      # its lost COMMITs' log; its oids a sequence
    else:
        expected.add("oid_counter")
    assert seen["tables"] == expected
    assert expected <= set(TABLES)      # what zap drops
    assert seen["gone_row"] == [(0, 0, 0, 0, 0)]
    assert len(seen["states"]) == (3 if keep_history else 2)   # the root twice, kept


@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
def test_the_other_history_mode_is_refused_in_words_and_nothing_changes(
        storage_factory: Any, read_only: bool) -> None:
    stored = storage_factory.param.keep_history
    make_database(storage_factory)
    before = picture(storage_factory)
    with pytest.raises(SchemaError) as info:
        storage_factory.open(keep_history=not stored, read_only=read_only)
    assert str(info.value) == (
        f"{describe(storage_factory)} is a {MODE[stored]} zodbsql database, but the"
        f" storage was configured {MODE[not stored]} (keep-history"
        f" {'false' if stored else 'true'}); set keep-history"
        f" {'true' if stored else 'false'} to open it. Nothing was changed")
    assert picture(storage_factory) == before
    storage_factory.open(read_only=read_only).close()   # its own mode opens


@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
def test_another_schema_version_is_refused_in_words_and_nothing_changes(
        storage_factory: Any, read_only: bool) -> None:
    make_database(storage_factory)
    set_version(storage_factory, "3")
    before = picture(storage_factory)
    with pytest.raises(SchemaError) as info:
        storage_factory.open(read_only=read_only)
    assert str(info.value) == (
        f"{describe(storage_factory)} holds zodbsql schema version 3, this zodbsql needs"
        f" version {SCHEMA_VERSION}; nothing was changed")
    assert picture(storage_factory) == before


def test_a_version_1_database_read_only_is_refused_with_the_way_out(
        storage_factory: Any) -> None:
    make_database(storage_factory)
    set_version(storage_factory, str(MIGRATABLE_VERSION))
    before = picture(storage_factory)
    with pytest.raises(SchemaError) as info:
        storage_factory.open(read_only=True)
    assert str(info.value) == (
        f"{describe(storage_factory)} holds zodbsql schema version {MIGRATABLE_VERSION},"
        f" this zodbsql needs version {SCHEMA_VERSION}; open it once for writing (not"
        " read-only) and it is migrated in place; nothing was changed")
    assert picture(storage_factory) == before


def test_a_version_1_database_in_the_other_mode_is_refused_before_migrating(
        storage_factory: Any) -> None:
    """The history mode is checked before the migration changes anything: the database
    stays at version 1, for the storage configured in its own mode to migrate."""
    stored = storage_factory.param.keep_history
    make_database(storage_factory)
    set_version(storage_factory, str(MIGRATABLE_VERSION))
    before = picture(storage_factory)
    with pytest.raises(SchemaError, match=f"is a {MODE[stored]} zodbsql database"):
        storage_factory.open(keep_history=not stored)
    assert picture(storage_factory) == before
    assert before["meta"]["schema_version"] == str(MIGRATABLE_VERSION)


def test_a_migration_another_process_finished_does_nothing(storage_factory: Any) -> None:
    """``migrate`` looks at the version under the schema's lock: a database another
    process migrated meanwhile (already at the current version) is left alone."""
    make_database(storage_factory)
    before = picture(storage_factory)
    backend = storage_factory.backend()
    conn = backend.connect()
    try:
        backend.schema.migrate(conn, storage_factory.param.keep_history)
    finally:
        conn.close()
    assert picture(storage_factory) == before


@pytest.mark.parametrize("how", ["read-only", "create-schema false"])
def test_an_empty_database_gets_no_schema_where_none_may_be_made(
        storage_factory: Any, how: str) -> None:
    path = empty_database(storage_factory)
    options = {"read_only": True} if how == "read-only" else {"create_schema": False}
    with pytest.raises(SchemaError) as info:
        storage_factory.open(path, **options)
    why = "the storage is read-only" if how == "read-only" else "create-schema is false"
    assert str(info.value) == (f"{describe(storage_factory, path)} has no zodbsql schema"
                               f" and {why}, so none was created")
    assert picture(storage_factory, path) == {"tables": set(), "views": set(), "meta": None}
    make_database(storage_factory, path)       # then made by a storage that may
    assert picture(storage_factory, path)["meta"] == the_meta(
        storage_factory.param.keep_history, storage_factory.param.backend)


def test_foreign_tables_are_refused_by_name_and_nothing_is_added(
        storage_factory: Any) -> None:
    path = empty_database(storage_factory)
    run(storage_factory, *(f"CREATE TABLE {name} (id INTEGER)" for name in FOREIGN),
        path=path)
    with pytest.raises(SchemaError) as info:
        storage_factory.open(path)
    assert str(info.value) == (
        f"{describe(storage_factory, path)} holds tables that are not zodbsql's (t_a, t_b,"
        " t_c, t_d, t_e); refusing to add a zodbsql schema beside them. Use an empty"
        " database or schema")
    assert picture(storage_factory, path) == {"tables": set(FOREIGN), "views": set(),
                                              "meta": None}


def test_a_schema_made_by_many_processes_at_once_is_made_once(storage_factory: Any) -> None:
    """Storages opening one empty database together: one creates the schema under its
    lock, the others find it made; every one opens, and the meta rows are there once."""
    path = empty_database(storage_factory)
    call_at_once(8, lambda _: storage_factory.open(path))
    backend = storage_factory.backend(path)
    conn = backend.connect()
    try:
        names = [row[0] for row in conn.fetchall("SELECT name FROM zodbsql_meta")]
        conn.rollback()
    finally:
        conn.close()
    assert sorted(names) == sorted(the_meta(storage_factory.param.keep_history,
                                            storage_factory.param.backend))


@pytest.fixture
def beside(storage_factory: Any) -> Iterator[Any]:
    """A zodbsql database with an object, and another application's table beside it
    (made after the schema, as a shared database comes to hold one)."""
    make_database(storage_factory)
    run(storage_factory, "CREATE TABLE other_app (id INTEGER)",
        "INSERT INTO other_app (id) VALUES (7)")
    yield storage_factory


def other_app_rows(factory: Any) -> list[Any]:
    conn = factory.backend().connect()
    try:
        rows = conn.fetchall("SELECT id FROM other_app")
        conn.rollback()
        return [tuple(row) for row in rows]
    finally:
        conn.close()


def test_destroy_drops_zodbsql_tables_and_views_and_nothing_else(beside: Any) -> None:
    beside.backend().destroy()
    assert picture(beside) == {"tables": {"other_app"}, "views": set(), "meta": None}
    assert other_app_rows(beside) == [(7,)]


def zap_and_use(factory: Any, **options: Any) -> None:
    """zap_all on a storage with ``options``, then a commit and a read on it: the
    database is empty and usable, with its schema recorded."""
    storage = factory.open(**options)
    storage.zap_all()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            assert "kept" not in conn.root()
            conn.root()["after"] = 1
        with db.transaction() as conn:
            assert conn.root()["after"] == 1
    finally:
        db.close()
    assert picture(factory)["meta"] == the_meta(factory.param.keep_history,
                                                factory.param.backend)


def test_zap_all_empties_the_database_beside_another_applications_table(
        beside: Any) -> None:
    """zap (convert --clear) makes the schema again although a table not zodbsql's is
    beside it: the database was zodbsql's, so it is not someone else's by mistake."""
    zap_and_use(beside)
    assert "other_app" in picture(beside)["tables"]
    assert other_app_rows(beside) == [(7,)]


BLOB_TABLES = ("blob_ref", "blob_chunk", "blob_content")


def made_before_blobs(factory: Any) -> None:
    """A database as zodbsql made it before blobs: no blob table."""
    make_database(factory)
    run(factory, *(f"DROP TABLE {table}" for table in BLOB_TABLES))


def test_blob_tables_added_to_an_older_database_keep_the_history_mode(
        storage_factory: Any, tmp_path: Any) -> None:
    """Added at the first open for writing, as a new database of the same history mode
    has them: history-preserving keeps each revision's blob, history-free one a blob."""
    keep_history = storage_factory.param.keep_history
    made_before_blobs(storage_factory)
    db = ZODB.DB(storage_factory.open(blob_dir=str(tmp_path / "blobs")))
    try:
        with db.transaction() as conn:
            conn.root()["blob"] = Blob(b"first")
        first_tid = db.lastTransaction()
        with db.transaction() as conn:
            blob = conn.root()["blob"]
            oid = blob._p_oid
            with blob.open("w") as f:
                f.write(b"second")
        with db.transaction() as conn:
            with conn.root()["blob"].open() as f:
                assert f.read() == b"second"
        conn = storage_factory.backend().connect()
        try:
            rows = conn.fetchall("SELECT tid FROM blob_ref WHERE zoid = %s", (u64(oid),))
            conn.rollback()
        finally:
            conn.close()
        assert len(rows) == (2 if keep_history else 1)
        if keep_history:
            with open(db.storage.loadBlob(oid, first_tid), "rb") as f:
                assert f.read() == b"first"
    finally:
        db.close()


def test_blob_tables_are_added_once_by_processes_opening_together(
        storage_factory: Any) -> None:
    made_before_blobs(storage_factory)
    call_at_once(8, lambda _: storage_factory.open())
    assert set(BLOB_TABLES) <= picture(storage_factory)["tables"]


def test_blob_tables_are_not_added_read_only(storage_factory: Any) -> None:
    made_before_blobs(storage_factory)
    before = picture(storage_factory)
    db = ZODB.DB(storage_factory.open(read_only=True))
    try:
        with db.transaction() as conn:
            assert conn.root()["kept"]["value"] == 1
    finally:
        db.close()
        transaction.abort()
    assert picture(storage_factory) == before
    storage_factory.open().close()
    assert set(BLOB_TABLES) <= picture(storage_factory)["tables"]


def test_zap_all_makes_the_schema_again_with_create_schema_false(
        storage_factory: Any) -> None:
    """create-schema false keeps a storage from making a schema where there was none;
    zap empties a database that has one, and must leave it with one."""
    make_database(storage_factory)
    zap_and_use(storage_factory, create_schema=False)


def test_zap_all_starts_the_instance_and_its_caches_afresh(storage_factory: Any,
                                                           tmp_path: Any) -> None:
    """After zap_all: the emptied database's old states are not saved to the persistent
    cache, which is opened again; the instance no longer counts as reading its old
    snapshot and polls afresh; and the oids a copy then restores (the root and oid 1)
    are never handed out again, however high the oids were before."""
    source_db = ZODB.DB(storage_factory.open_other())
    with source_db.transaction() as conn:
        conn.root()["one"] = PersistentMapping()
    cache_dir = tmp_path / "states"
    cache_dir.mkdir()
    storage = storage_factory.open(cache_persistent_dir=str(cache_dir))
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["many"] = [PersistentMapping() for _ in range(40)]
        storage.poll_invalidations()
        storage.zap_all()
        assert list(cache_dir.iterdir()) == []
        assert storage.shared.persistent is not None
        assert not storage.shared.others_read_before(-1, 2 ** 63)
        storage.copyTransactionsFrom(source_db.storage)
        assert storage.poll_invalidations() is not None
        assert u64(storage.new_oid()) > 1
        with db.transaction() as conn:
            assert list(conn.root()) == ["one"]
    finally:
        db.close()
        source_db.close()
