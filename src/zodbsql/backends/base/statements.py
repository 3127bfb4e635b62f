"""How a role holds its SQL: one statement set per history mode, and IN lists.

A role's statements are named module-level constants, gathered into a frozen dataclass
with one field per statement (``MoverStatements``, ...).  The role's class declares the
set of each history mode, ``HISTORY_PRESERVING`` and ``HISTORY_FREE``, and picks one
once, when it is built (``self.sql``); its methods read ``self.sql.<name>`` and never
choose by mode again.  A backend overrides a statement by name::

    class MySQLMover(Mover):
        HISTORY_FREE = dataclasses.replace(Mover.HISTORY_FREE, move_states=HF_MOVE_STATES)

(mypy checks the names).  Statements with a list of values take it as ``{oids}`` (or
``{pairs}``, ``{hashes}``) filled in with :func:`in_list`.  Server-side functions live
in ``.sql`` files beside their backend (PostgreSQL), loaded by its schema.
"""
from __future__ import annotations

from typing import TypeVar

S = TypeVar("S")


def in_list(count: int, width: int = 1) -> str:
    """The placeholders of an IN list of ``count`` values, each a tuple of ``width``:
    ``%s, %s`` or ``(%s, %s), (%s, %s)``."""
    item = "%s" if width == 1 else "(" + ", ".join(["%s"] * width) + ")"
    return ", ".join([item] * count)


def for_mode(keep_history: bool, preserving: S, free: S) -> S:
    """The statement set of the history mode in use."""
    return preserving if keep_history else free
