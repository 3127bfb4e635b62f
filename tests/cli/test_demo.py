"""The demo command runs end to end and reports what it did."""
from __future__ import annotations

import pathlib

import pytest

from zodbsql.cli.main import main


@pytest.mark.parametrize("extra", [[], ["--history-free"]])
def test_demo_reports_each_step(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
                                extra: list[str]) -> None:
    path = tmp_path / "demo.sqlite"
    assert main(["demo", "--objects", "200", "--path", str(path), *extra]) == 0
    out = capsys.readouterr().out
    for step in ("write", "read", "update", "pack"):
        assert f"  {step}" in out
    assert ("undo" in out) is (not extra)
    assert path.exists()


def test_errors_are_one_line(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--path", str(tmp_path / "missing" / "x.sqlite")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zodbsql demo: error:") and "does not exist" in err
