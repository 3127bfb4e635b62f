"""Schema version 1 -> 2: the references move from rows of ``object_ref`` into each
revision's ``refs`` column, when the database is first opened for writing.

Version 1 is made here from a version 2 database (the view's rows copied into a table
of that name, the column dropped, the version set back), which is the layout version 1
had; the migration must then give back exactly the references it started from.
"""
from __future__ import annotations

from typing import Any

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.POSException import POSKeyError

from tests.together import call_at_once
from zodbsql.errors import SchemaError


def _references(storage: Any, keep_history: bool) -> list[tuple[int, ...]]:
    columns = "zoid, tid, to_zoid" if keep_history else "zoid, to_zoid"
    conn = storage.shared.pool.acquire()
    try:
        rows = conn.fetchall(f"SELECT {columns} FROM object_ref ORDER BY {columns}")
        conn.rollback()
        return [tuple(int(value) for value in row) for row in rows]
    finally:
        storage.shared.pool.release(conn)


#: The columns of a relation, by backend (the migrated view's must be a new one's).
COLUMNS = {
    "sqlite": "SELECT name FROM pragma_table_info(%s) ORDER BY cid",
    "postgresql": "SELECT column_name FROM information_schema.columns WHERE table_schema"
                  " = current_schema() AND table_name = %s ORDER BY ordinal_position",
    "mysql": "SELECT column_name FROM information_schema.columns WHERE table_schema"
             " = DATABASE() AND table_name = %s ORDER BY ordinal_position",
}


def _columns(storage: Any, backend: str, relation: str) -> list[str]:
    conn = storage.shared.pool.acquire()
    try:
        rows = conn.fetchall(COLUMNS[backend], (relation,))
        conn.rollback()
        return [str(row[0]).lower() for row in rows]
    finally:
        storage.shared.pool.release(conn)


def _make_version_1(storage: Any) -> None:
    """Turn the storage's database back into schema version 1's layout."""
    columns = "zoid, tid, to_zoid" if storage.shared.backend.keep_history else "zoid, to_zoid"
    conn = storage.shared.pool.acquire()
    try:
        conn.begin_write()
        for statement in (
                f"CREATE TABLE object_ref_v1 AS SELECT {columns} FROM object_ref",
                "DROP VIEW object_ref",
                "ALTER TABLE object_ref_v1 RENAME TO object_ref",
                "ALTER TABLE object_state DROP COLUMN refs",
                "UPDATE zodbsql_meta SET value = '1' WHERE name = 'schema_version'"):
            conn.execute(statement)
        conn.commit()
    finally:
        storage.shared.pool.release(conn)


def test_a_version_1_database_is_migrated_when_opened_for_writing(storage_factory) -> None:
    keep_history = storage_factory.param.keep_history
    db = ZODB.DB(storage_factory.open())
    try:
        with db.transaction() as conn:
            root = conn.root()
            root["tree"] = PersistentMapping(
                {f"k{i}": PersistentMapping(v=i) for i in range(40)})
            root["leaf"] = PersistentMapping(v="no references")
        with db.transaction() as conn:  # a second revision of the container
            conn.root()["tree"]["k40"] = PersistentMapping(v=40)
            unlinked = conn.root()["tree"].pop("k0")._p_oid
        expected = _references(db.storage, keep_history)
        _make_version_1(db.storage)
    finally:
        db.close()
    assert len(expected) > 40

    # Read-only, it is refused with the way out named, and left as it was.
    with pytest.raises(SchemaError, match="version 1.*migrated in place"):
        storage_factory.open(read_only=True)

    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        assert _references(storage, keep_history) == expected
        backend = storage_factory.param.backend
        assert _columns(storage, backend, "object_ref") == (
            ["zoid", "tid", "to_zoid"] if keep_history else ["zoid", "to_zoid"])
        with db.transaction() as conn:
            tree = conn.root()["tree"]
            assert sorted(tree[k]["v"] for k in tree) == list(range(1, 41))
            tree["k41"] = PersistentMapping(v=41)
        assert storage.referrers(tree._p_oid) == [bytes(8)]
        # Pack follows the migrated references: the unlinked child goes, the rest stays.
        storage.load(unlinked)
        db.pack()
        with db.transaction() as conn:
            assert len(conn.root()["tree"]) == 41
            assert conn.root()["tree"]["k41"]["v"] == 41
        with pytest.raises(POSKeyError):
            storage.load(unlinked)
    finally:
        db.close()
    # Opened again, nothing is left to migrate.
    storage_factory.open(read_only=True).close()


def test_processes_opening_a_version_1_database_at_once_migrate_it_once(
        storage_factory) -> None:
    """Four storages open a version 1 database at the same moment: every one opens, and
    the references are those the database had (migrated once, not twice or half)."""
    keep_history = storage_factory.param.keep_history
    db = ZODB.DB(storage_factory.open())
    try:
        with db.transaction() as conn:
            conn.root()["tree"] = PersistentMapping(
                {f"k{i}": PersistentMapping(v=i) for i in range(20)})
        expected = _references(db.storage, keep_history)
        _make_version_1(db.storage)
    finally:
        db.close()
    outcomes = call_at_once(4, lambda _: storage_factory.open())
    assert _references(outcomes[0], keep_history) == expected
