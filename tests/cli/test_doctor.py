"""doctor reports on the real database and server and cleans up its scratch database."""
from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.utils import u64

from tests.storage.test_oids import remove_oid_counter
from tests.storage.test_verify import run_sql
from zodbsql.backends.base.inspector import ERROR, OK
from zodbsql.cli.doctor import diagnose_storage
from zodbsql.cli.main import main
from zodbsql.errors import SchemaError


def test_doctor_on_every_backend(storage_factory: Any) -> None:
    storage = storage_factory.open()
    findings = diagnose_storage(storage, clients=2, checks=True)
    by_name = {f.name: f for f in findings}
    mode = "history-preserving" if storage_factory.param.keep_history else "history-free"
    assert by_name["schema"].found.endswith(mode)
    for check in ("check: store and load", "check: conflicts", "check: pack"):
        assert by_name[check].level == OK, by_name[check]
    assert not [f for f in findings if f.level == ERROR]
    assert all(f.fix for f in findings if f.level != OK)  # every problem has a fix


def test_doctor_names_the_index_older_databases_keep_and_how_to_drop_it(
        storage_factory: Any) -> None:
    """Databases made before 2026-11-27 keep an index on current_object (tid) that the
    poll no longer reads and every commit updates: doctor says so, with the statement
    that drops it; a database made now has none."""
    if not storage_factory.param.keep_history:
        pytest.skip("history-free databases have no current_object table")
    storage = storage_factory.open()
    inspector = storage.backend.inspector

    def warned() -> list[str]:
        return [f.fix for f in diagnose_storage(storage, clients=1, checks=False)
                if f.name == "current_object_tid"]

    assert warned() == []
    conn = storage.backend.connect()
    try:
        conn.execute("CREATE INDEX current_object_tid ON current_object (tid)")
        conn.commit()
        assert warned() == ["drop it: " + inspector.DROP_OLD_POLL_INDEX]
        for statement in inspector.DROP_OLD_POLL_INDEX.split(";"):
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()
    assert warned() == []


def test_doctor_removes_its_scratch_database(storage_factory: Any) -> None:
    storage = storage_factory.open()
    backend = storage.backend
    with backend.inspector.scratch() as options:
        scratch = options
    if storage_factory.param.backend == "sqlite":
        assert not os.path.exists(os.path.dirname(scratch.path))
    else:
        name = scratch.schema if storage_factory.param.backend == "postgresql" else scratch.db
        conn = backend.connect()
        try:
            rows = conn.fetchall("SELECT 1 FROM information_schema.schemata"
                                 " WHERE schema_name = %s", (name,))
        finally:
            conn.close()
        assert rows == []


def test_doctor_command(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "Data.sqlite"
    assert main(["demo", "--objects", "10", "--path", str(path)]) == 0
    capsys.readouterr()
    assert main(["doctor", f"sqlite://{path}"]) == 0
    out = capsys.readouterr().out
    assert "ok      journal_mode: wal" in out and out.rstrip().endswith("healthy")
    assert main(["doctor", f"sqlite://{path}", "--json", "--no-checks"]) == 0
    assert '"healthy": true' in capsys.readouterr().out
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".zodbsql-doctor")]


def counter_finding(storage: Any) -> Any:
    [finding] = [f for f in diagnose_storage(storage, clients=1, checks=False)
                 if f.name == "oid counter"]
    return finding


def test_doctor_finds_an_oid_counter_below_the_oids_stored_and_says_how_to_raise_it(
        storage_factory: Any) -> None:
    """After a partial restore or a counter edited by hand, new objects would get oids
    in use: doctor names the counter and the highest oid, and its fix, run as given,
    makes the database whole again."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["items"] = items = PersistentMapping()
            for number in range(40):
                items[number] = PersistentMapping()
            conn.savepoint()
            highest = max(u64(each._p_oid) for each in items.values())
        healthy = counter_finding(storage)
        assert healthy.level == OK and f"the highest oid stored {highest}" in healthy.found
        lowered = ("SELECT setval('zoid_seq', 3)"
                   if storage_factory.param.backend == "postgresql"
                   else "UPDATE oid_counter SET last_oid = 3")
        run_sql(storage, lowered, ())
        behind = counter_finding(storage)
        assert behind.level == ERROR
        assert behind.found == (f"at 3, below the highest oid stored ({highest}): new"
                                " objects would be written over existing ones")
        run_sql(storage, behind.fix.removeprefix("raise it: "), ())
        assert counter_finding(storage).level == OK
    finally:
        db.close()


def test_doctor_finds_the_one_row_tables_empty(storage_factory: Any) -> None:
    storage = storage_factory.open()
    remove_oid_counter(storage_factory, storage)
    run_sql(storage, "DELETE FROM commit_row", ())
    findings = {f.name: f for f in diagnose_storage(storage, clients=1, checks=False)}
    assert findings["commit_row"].level == ERROR
    assert findings["commit_row"].found.startswith("no row: commits can't be numbered")
    assert findings["oid counter"].level == ERROR
    assert findings["oid counter"].found == "gone: no new oid can be handed out"
    run_sql(storage, findings["oid counter"].fix.removeprefix(
        "put it back above every oid stored: "), ())
    assert counter_finding(storage).level == OK


def test_a_lost_commit_row_stops_the_open_and_doctor_gives_the_row_back(
        storage_factory: Any) -> None:
    """Read as tid 0, a lost commit_row showed another process an empty database:
    ZODB failed creating a root that exists, with a ConflictError that reads as
    retryable.  Now the open names the table, and doctor's fix (with the newest tid
    stored) makes the database whole: its objects read, the next commit newer."""
    db = ZODB.DB(storage_factory.open())
    try:
        with db.transaction() as conn:
            conn.root()["kept"] = PersistentMapping(answer=42)
        newest = u64(db.storage.lastTransaction())
        run_sql(db.storage, "DELETE FROM commit_row", ())
        # What ZODB.DB's open does first (an instance that polls), closed after: a DB
        # whose constructor raised leaves its instance to the process's end.
        instance = storage_factory.open().new_instance()
        try:
            with pytest.raises(SchemaError, match="table commit_row has no row"):
                instance.poll_invalidations()
        finally:
            instance.release()
        findings = {f.name: f for f in diagnose_storage(db.storage, clients=1,
                                                          checks=False)}
        fix = findings["commit_row"].fix
        assert fix.endswith(f"VALUES (0, {newest})")
        run_sql(db.storage, fix.split(": ", 1)[1], ())
    finally:
        db.close()
    again = ZODB.DB(storage_factory.open())
    try:
        with again.transaction() as conn:
            assert conn.root()["kept"]["answer"] == 42
            conn.root()["after"] = 1
        assert u64(again.storage.lastTransaction()) > newest
    finally:
        again.close()
