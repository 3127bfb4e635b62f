"""Tools that only read open read-only and pack creates nothing: on a mistyped path or
an empty schema or database each fails naming it, and nothing is created (every
backend, by plain URL and by ZConfig file)."""
from __future__ import annotations

import os
import pathlib
import secrets
from typing import Any

import pytest
import ZODB
from persistent.mapping import PersistentMapping

from tests.cli.urls import url_for, zconfig_for
from zodbsql.cli.main import main


def tables_in(factory: Any, path: str) -> int | None:
    """Tables in the factory's database ``path``; None for an SQLite file that is not there."""
    backend = factory.param.backend
    if backend == "sqlite":
        return None if not os.path.exists(path) else -1
    if backend == "postgresql":
        return factory.admin.execute("SELECT count(*) FROM information_schema.tables"
                                     " WHERE table_schema = %s", (path,)).fetchone()[0]
    cursor = factory.admin.cursor()
    cursor.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
                   (path,))
    return int(cursor.fetchone()[0])


def nothing_created(factory: Any, path: str) -> bool:
    found = tables_in(factory, path)
    return found is None if factory.param.backend == "sqlite" else found == 0


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize("how", ["url", "zconfig"])
def test_reading_tools_and_pack_create_nothing(storage_factory: Any, tmp_path: pathlib.Path,
                                               capsys: pytest.CaptureFixture[str],
                                               how: str) -> None:
    backend, path = storage_factory.param.backend, storage_factory.path
    spec = (url_for(backend, path) if how == "url"
            else zconfig_for(backend, path, tmp_path))
    dest = tmp_path / "dest.sqlite"
    for argv in (["verify", spec, "--quiet"], ["pack", spec, "--dry-run", "--quiet"],
                 ["pack", spec, "--quiet"], ["convert", spec, f"sqlite://{dest}", "--quiet"]):
        code, output = run(argv, capsys)
        assert code == 2, output
        assert path in output, output
        assert "does not exist" in output or "has no zodbsql schema" in output, output
        assert nothing_created(storage_factory, path), argv
    assert not dest.exists()


def test_a_missing_postgresql_schema_is_named(tmp_path: pathlib.Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from tests.databases import BACKENDS
    if "postgresql" not in BACKENDS:
        pytest.skip("postgresql is not in ZODBSQL_TEST_BACKENDS")
    schema = f"zodbsql_test_missing_{secrets.token_hex(4)}"
    for argv in (["verify", url_for("postgresql", schema)],
                 ["pack", url_for("postgresql", schema).replace("postgresql:", "postgres:")]):
        code, output = run(argv, capsys)
        assert code == 2 and f"schema '{schema}' does not exist" in output, output


def test_reading_tools_work_on_a_database(storage_factory: Any, tmp_path: pathlib.Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    db = ZODB.DB(storage_factory.open())
    with db.transaction() as conn:
        conn.root()["kept"] = PersistentMapping(v=1)
        conn.root()["dropped"] = PersistentMapping(v=2)
    with db.transaction() as conn:
        del conn.root()["dropped"]
    db.close()
    param = storage_factory.param
    url = url_for(param.backend, storage_factory.path, keep_history=param.keep_history)
    assert run(["verify", url, "--quiet"], capsys)[0] == 0
    code, output = run(["pack", url, "--dry-run", "--quiet"], capsys)
    assert code == 0 and "would remove 1 unreachable objects" in output, output
    code, output = run(["convert", url, f"sqlite://{tmp_path}/copy.sqlite", "--quiet"], capsys)
    assert code == 0 and "copied" in output, output
    assert run(["verify", f"{tmp_path}/copy.sqlite", "--quiet"], capsys)[0] == 0
