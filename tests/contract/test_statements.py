"""Statement sets: chosen once per role and history mode, overridden by name."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from zodbsql.backends.base.mover import Mover
from zodbsql.backends.base.statements import in_list
from zodbsql.backends.mysql.mover import MySQLMover
from zodbsql.backends.sqlite.adapter import SQLiteBackend
from zodbsql.backends.sqlite.options import SQLiteOptions

ROLES = ("mover", "locker", "poller", "history", "packer", "checker", "txncontrol")


def changed_fields(base: Any, override: Any) -> set[str]:
    return {field.name for field in dataclasses.fields(base)
            if getattr(base, field.name) != getattr(override, field.name)}


def test_in_list() -> None:
    assert in_list(1) == "%s"
    assert in_list(3) == "%s, %s, %s"
    assert in_list(2, 2) == "(%s, %s), (%s, %s)"


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
def test_each_role_chooses_the_set_of_its_mode_once(tmp_path: Path, keep_history: bool) -> None:
    backend = SQLiteBackend(SQLiteOptions(str(tmp_path / "db.sqlite")), keep_history, 1.0)
    for name in ROLES:
        role = getattr(backend, name)
        wanted = role.HISTORY_PRESERVING if keep_history else role.HISTORY_FREE
        assert role.sql is wanted, name


def test_a_backend_overrides_statements_by_name() -> None:
    assert changed_fields(Mover.HISTORY_PRESERVING, MySQLMover.HISTORY_PRESERVING) == {
        "set_current"}
    assert changed_fields(Mover.HISTORY_FREE, MySQLMover.HISTORY_FREE) == {
        "move_states", "delete_removed", "delete_old_blobs", "record_deleted"}
    with pytest.raises(TypeError):
        dataclasses.replace(Mover.HISTORY_FREE, no_such_statement="SELECT 1")  # type: ignore[call-arg]
