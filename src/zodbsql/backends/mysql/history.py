"""MySQL's statements of the history role where its dialect differs."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from zodbsql.backends.base.history import History, HistoryStatements

#: MySQL has no ON CONFLICT: a duplicate name makes the insert a no-op update instead
#: (it too waits for a transaction inserting the same name).
META_ADD = ("INSERT INTO zodbsql_meta (name, value) VALUES (%s, %s)"
            " ON DUPLICATE KEY UPDATE name = name")


class MySQLHistory(History):
    HISTORY_PRESERVING: ClassVar[HistoryStatements] = dataclasses.replace(
        History.HISTORY_PRESERVING, meta_add=META_ADD)
    HISTORY_FREE: ClassVar[HistoryStatements] = dataclasses.replace(
        History.HISTORY_FREE, meta_add=META_ADD)
