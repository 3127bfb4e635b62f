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

from zodbsql.cli.main import main


def run_bound_by_permissions(*args: str) -> subprocess.CompletedProcess[str]:
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv to drop the override capabilities")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    return subprocess.run([*prefix, sys.executable, "-m", "zodbsql.cli.main", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def database(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    folder = tmp_path / "var"
    folder.mkdir()
    path = folder / "Data.sqlite"
    assert main(["demo", "--objects", "10", "--path", str(path)]) == 0
    assert not os.path.exists(f"{path}-wal")  # the last connection removed it
    yield path
    folder.chmod(0o755)
    path.chmod(0o644)


def test_a_read_only_directory_is_named_not_the_file(database: pathlib.Path) -> None:
    database.parent.chmod(0o555)
    for tool in (["verify", str(database)], ["pack", str(database)]):
        done = run_bound_by_permissions(*tool)
        assert done.returncode == 2, done
        assert f"the directory {database.parent} is not writable" in done.stderr, done.stderr
        assert "read-only true" not in done.stderr and "file's permissions" not in done.stderr


def test_a_read_only_file_in_a_writable_directory(database: pathlib.Path) -> None:
    database.chmod(0o444)
    done = run_bound_by_permissions("pack", str(database))
    assert done.returncode == 2 and "open the storage with read-only true" in done.stderr
    done = run_bound_by_permissions("verify", str(database))
    assert done.returncode == 0 and ": clean" in done.stdout, done
