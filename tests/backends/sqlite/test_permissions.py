"""Permission problems of an SQLite database get the advice that fixes them.

The tools run in a process that file permissions bind: as root, without the
capabilities that override them (setpriv)."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
from typing import Iterator

import pytest

import zodbsql
from zodbsql.backends.sqlite.options import SQLiteOptions
from zodbsql.cli.main import main


def run_bound_by_permissions(*args: str) -> subprocess.CompletedProcess[str]:
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv to drop the override capabilities")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    # The zodbsql this test imported (under mutation testing, the mutated copy, whose
    # active mutant the environment names).
    source = str(pathlib.Path(zodbsql.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": source}
    return subprocess.run([*prefix, sys.executable, "-m", "zodbsql.cli.main", *args],
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture
def database(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    folder = tmp_path / "var"
    folder.mkdir()
    path = folder / "Data.sqlite"
    assert main(["demo", "--objects", "10", "--path", str(path)]) == 0
    assert not os.path.exists(f"{path}-wal")  # the last connection removed it
    # The checks the tools' subprocesses make, made here too: mutation testing runs a
    # test against a function's mutants only when the test calls it in its process.
    SQLiteOptions(path=str(path)).create_backend(True, 1.0, True)
    yield path
    folder.chmod(0o755)
    path.chmod(0o644)


def test_a_read_only_directory_is_named_not_the_file(database: pathlib.Path) -> None:
    database.parent.chmod(0o555)
    for tool in (["verify", str(database)], ["pack", str(database)]):
        done = run_bound_by_permissions(*tool)
        assert done.returncode == 2, done
        assert done.stderr == (
            f"zodbsql {tool[0]}: error: SQLite database {database} is in WAL mode, which"
            f" needs {database}-wal and {database}-shm; SQLite can't create them because"
            f" the directory {database.parent} is not writable for this process: make the"
            " directory writable for the user the storage runs as\n"), done.stderr
    # With the files there (another process has the database open), it opens.
    for suffix in ("-wal", "-shm"):
        database.parent.chmod(0o755)
        pathlib.Path(f"{database}{suffix}").touch()
        database.parent.chmod(0o555)
    done = run_bound_by_permissions("verify", str(database))
    assert "needs" not in done.stderr, done.stderr


def test_one_missing_file_of_a_wal_database_is_named(database: pathlib.Path) -> None:
    pathlib.Path(f"{database}-shm").touch()
    database.parent.chmod(0o555)
    done = run_bound_by_permissions("verify", str(database))
    assert done.returncode == 2 and f"which needs {database}-wal; SQLite" in done.stderr, done


def test_a_database_that_can_t_be_made_in_a_read_only_directory(
        database: pathlib.Path) -> None:
    new = database.parent / "new.sqlite"
    database.parent.chmod(0o555)
    done = run_bound_by_permissions("demo", "--objects", "1", "--path", str(new))
    assert done.returncode != 0 and (
        f"cannot create the SQLite database {new}: its directory is not writable"
        in done.stderr), done


def test_an_unreadable_file(database: pathlib.Path) -> None:
    database.chmod(0o000)
    done = run_bound_by_permissions("verify", str(database))
    assert done.returncode == 2 and done.stderr == (
        f"zodbsql verify: error: SQLite database {database} is not readable\n"), done


def test_a_read_only_file_in_a_writable_directory(database: pathlib.Path) -> None:
    database.chmod(0o444)
    done = run_bound_by_permissions("pack", str(database))
    assert done.returncode == 2 and done.stderr == (
        f"zodbsql pack: error: SQLite database {database} is read-only for this process;"
        " open the storage with read-only true or fix the file's permissions\n"), done
    done = run_bound_by_permissions("verify", str(database))
    assert done.returncode == 0 and ": clean" in done.stdout, done
