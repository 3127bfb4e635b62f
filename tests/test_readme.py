"""The README's "How it is built" tree is checked against the files, not kept by hand:
everything it names exists, and every package, top-level module and test folder is
named."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).parent.parent
SRC = ROOT / "src" / "zodbsql"


def tree() -> dict[str, list[str]]:
    """The tree's entries by root folder: ``{"src/zodbsql/": ["api.py", ...]}``."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## How it is built", 1)[1]
    block = section.split("```", 2)[1]
    entries: dict[str, list[str]] = {}
    root = ""
    for line in block.splitlines():
        if re.match(r"\S", line):
            root = line.split()[0]
            entries[root] = []
        elif re.match(r"  \S", line):  # deeper lines continue a description
            entries[root].append(line.split()[0])
    return entries


def test_every_entry_exists() -> None:
    for root, names in tree().items():
        for name in names:
            assert (ROOT / root / name).exists(), f"{root}{name}"


def test_every_package_and_top_module_is_named() -> None:
    named = {name.rstrip("/") for name in tree()["src/zodbsql/"]}
    packages = {str(init.parent.relative_to(SRC)) for init in SRC.rglob("__init__.py")
                if init.parent != SRC}
    top = {path.name for path in SRC.iterdir()
           if path.suffix in (".py", ".xml") and path.is_file()}
    assert sorted((packages | top) - named) == []


def test_every_test_folder_is_named() -> None:
    named = {name.rstrip("/") for name in tree()["tests/"]}
    folders = {path.name for path in (ROOT / "tests").iterdir()
               if path.is_dir() and path.name != "__pycache__"}
    assert sorted(folders - named) == []
