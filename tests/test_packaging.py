"""What an install needs: the storage runs on its core dependencies alone; the tools'
packages (rich, matplotlib) come with the ``cli`` extra, and ``zodbsql`` without them
says so in one line."""
from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap
import tomllib

from zodbsql.cli.main import CLI_EXTRA

PYPROJECT = tomllib.loads((pathlib.Path(__file__).parent.parent / "pyproject.toml").read_text())


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)


def test_the_tools_packages_are_an_extra() -> None:
    project = PYPROJECT["project"]
    core = " ".join(project["dependencies"]).lower()
    assert not [name for name in CLI_EXTRA if name in core]
    assert sorted(project["optional-dependencies"]["cli"]) == sorted(CLI_EXTRA)
    # The tests run the tools, and the bench extra is for one of them.
    for extra in ("test", "bench"):
        assert set(CLI_EXTRA) <= set(project["optional-dependencies"][extra]), extra


def test_the_storage_imports_and_opens_without_the_cli_extra(tmp_path: pathlib.Path) -> None:
    done = run_python(f"""
        import sys
        import zodbsql, zodbsql.api, zodbsql.config, zodbsql.uri
        storage = zodbsql.open_storage("sqlite://{tmp_path}/Data.sqlite")
        storage.close()
        print(sorted(name for name in sys.modules
                     if name.partition(".")[0] in {CLI_EXTRA!r}))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_command_without_the_cli_extra_says_what_to_install() -> None:
    done = run_python(f"""
        import sys
        for name in {CLI_EXTRA!r}:
            sys.modules[name] = None  # what an install without the extra sees
        from zodbsql.cli.main import main
        sys.exit(main(["verify", "x.sqlite"]))
    """)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "pip install 'zodbsql[cli]'" in done.stderr
