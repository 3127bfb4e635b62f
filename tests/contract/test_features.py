"""Every capability flag drives behaviour: each one declared is read somewhere in src/.

A flag is a public class attribute of ``Features`` or of a backend's features class.
It counts as read where the source (outside the features modules) loads an attribute
of that name; a backend may only override flags the base declares.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import zodbsql
from zodbsql.backends.base.features import Features
from zodbsql.backends.mysql.adapter import MySQLBackend
from zodbsql.backends.postgresql.adapter import PostgreSQLBackend
from zodbsql.backends.sqlite.adapter import SQLiteBackend

PACKAGE_DIR = Path(zodbsql.__file__).parent
FEATURE_CLASSES = [Features] + [backend.features_class
                                for backend in (SQLiteBackend, PostgreSQLBackend, MySQLBackend)]


def declared_flags(cls: type) -> set[str]:
    """The flags a features class itself declares (not those it inherits)."""
    return {name for name in vars(cls) if not name.startswith("_")}


def attributes_read() -> set[str]:
    """Names of the attributes the package's code reads, features modules left out."""
    names: set[str] = set()
    for path in PACKAGE_DIR.rglob("*.py"):
        if path.name == "features.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                names.add(node.attr)
    return names


@pytest.mark.parametrize("cls", FEATURE_CLASSES, ids=lambda cls: cls.__name__)
def test_every_flag_is_read(cls: type) -> None:
    unread = declared_flags(cls) - attributes_read()
    assert not unread, (f"{cls.__name__} declares flags that nothing in src/ reads:"
                        f" {sorted(unread)}; make the core or a role ask them, or delete them")


@pytest.mark.parametrize("cls", FEATURE_CLASSES[1:], ids=lambda cls: cls.__name__)
def test_backends_only_answer_the_base_questions(cls: type) -> None:
    extra = declared_flags(cls) - declared_flags(Features)
    assert not extra, (f"{cls.__name__} declares {sorted(extra)}, which Features does not"
                       " ask; a value learned from the server belongs on the connection")


def test_an_unread_flag_is_caught() -> None:
    class Probe(Features):
        supports_time_travel = False
    assert declared_flags(Probe) - attributes_read() == {"supports_time_travel"}
