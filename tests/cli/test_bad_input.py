"""Bad STORAGE arguments: every tool answers with one line naming the problem, never a
traceback; an SQLite file's path needs no scheme."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from zodbsql.cli.main import main


@pytest.fixture
def database(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "Data.sqlite"
    assert main(["demo", "--objects", "10", "--path", str(path)]) == 0
    return path


def test_an_sqlite_path_needs_no_scheme(database: pathlib.Path, tmp_path: pathlib.Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["verify", str(database), "--quiet"]) == 0
    assert ": clean" in capsys.readouterr().out
    renamed = tmp_path / "Data.db"   # any name: the file's header says SQLite
    database.rename(renamed)
    assert main(["pack", str(renamed), "--dry-run", "--quiet"]) == 0
    missing = tmp_path / "Typo.sqlite"
    assert main(["verify", str(missing)]) == 2
    assert f"SQLite database {missing} does not exist" in capsys.readouterr().err
    assert not missing.exists()


def bad_inputs(tmp_path: pathlib.Path) -> dict[str, str]:
    binary = tmp_path / "Data.fs"
    binary.write_bytes(b"FS21\xf8\x00\x01garbage")
    broken = tmp_path / "broken.conf"
    broken.write_text("<zodb main>\n  <filestorage>\n")
    return {
        "binary file": str(binary),
        "broken ZConfig": str(broken),
        "missing file": str(tmp_path / "nothing-here"),
        "directory": str(tmp_path),
        "unknown scheme": "oracle://scott:tiger@db/orcl",
        "bad option": f"sqlite://{tmp_path}/x.sqlite?keep_history=maybe",
        "missing directory": f"sqlite://{tmp_path}/no/such/dir/x.sqlite",
        "missing FileStorage": f"file://{tmp_path}/missing.fs",
        "missing zconfig": f"zconfig://{tmp_path}/missing.conf#main",
    }


@pytest.mark.parametrize("tool", ["verify", "pack", "doctor", "convert", "blobspeed"])
def test_bad_input_is_one_line_without_traceback(tool: str, tmp_path: pathlib.Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for what, spec in bad_inputs(tmp_path).items():
        argv = [tool, spec] + ([f"sqlite://{tmp_path}/dest.sqlite"] if tool == "convert" else [])
        code = main(argv)
        captured = capsys.readouterr()
        if tool == "doctor" and code == 1:  # doctor reports a storage that can't open
            assert "ERROR   open:" in captured.out, (what, captured.out)
            continue
        assert code == 2, (what, captured)
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"zodbsql {tool}: error: "), (what, lines)
        assert "Traceback" not in captured.err + captured.out
    assert not (tmp_path / "dest.sqlite").exists()
    assert not (tmp_path / "x.sqlite").exists()


def test_the_command_prints_no_traceback(tmp_path: pathlib.Path) -> None:
    binary = tmp_path / "Data.fs"
    binary.write_bytes(b"\xf8\xff not text")
    done = subprocess.run([sys.executable, "-m", "zodbsql.cli.main", "verify", str(binary)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
