"""Checker: the reads ``zodbsql verify`` makes.  All read-only.

States are read in oid order in batches (keyset pagination on the primary key, so each
batch is an index range scan); dangling references are found with one anti-join.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Iterator

from zodbsql.backends.base.contract import (BackendContract, CheckedState, ConnectionRole,
                                            DanglingReference)
from zodbsql.backends.base.statements import for_mode

# The same in both modes.
STATES = (
    "SELECT zoid, tid, checksum, state FROM object_state"
    " WHERE zoid > %s OR (zoid = %s AND tid > %s) ORDER BY zoid, tid LIMIT %s")
COUNT_STATES = "SELECT COUNT(*) FROM object_state"
# References from current revisions to objects that are missing or deleted.
HP_DANGLING = (
    "SELECT r.zoid, r.tid, r.to_zoid FROM object_ref r"
    " JOIN current_object c ON c.zoid = r.zoid AND c.tid = r.tid"
    " LEFT JOIN current_object t ON t.zoid = r.to_zoid"
    " LEFT JOIN object_state s ON s.zoid = t.zoid AND s.tid = t.tid"
    " WHERE t.zoid IS NULL OR s.state IS NULL ORDER BY r.zoid, r.to_zoid")
HF_DANGLING = (
    "SELECT r.zoid, o.tid, r.to_zoid FROM object_ref r"
    " JOIN object_state o ON o.zoid = r.zoid"
    " LEFT JOIN object_state t ON t.zoid = r.to_zoid"
    " WHERE t.zoid IS NULL ORDER BY r.zoid, r.to_zoid")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckerStatements:
    """The checker's statements in one history mode."""

    count_states: str = COUNT_STATES
    states: str = STATES
    dangling: str


class Checker:
    """The reads of ``verify`` (a ``CheckerRole``)."""

    HISTORY_PRESERVING: ClassVar[CheckerStatements] = CheckerStatements(dangling=HP_DANGLING)
    HISTORY_FREE: ClassVar[CheckerStatements] = CheckerStatements(dangling=HF_DANGLING)

    def __init__(self, backend: BackendContract) -> None:
        self.keep_history = backend.keep_history
        self.sql = for_mode(self.keep_history, self.HISTORY_PRESERVING, self.HISTORY_FREE)

    def count_states(self, conn: ConnectionRole) -> int:
        row = conn.fetchone(self.sql.count_states)
        assert row is not None          # COUNT(*) answers one row, 0 for an empty table
        return int(row[0])

    def iter_states(self, conn: ConnectionRole,
                    batch: int = 500) -> Iterator[list[CheckedState]]:
        """Batches of stored revisions in (oid, tid) order."""
        sql = self.sql.states
        oid, tid = -1, -1
        while True:
            rows = [CheckedState(int(o), int(t), c, bytes(s) if s is not None else None)
                    for o, t, c, s in conn.fetchall(sql, (oid, oid, tid, batch))]
            if not rows:
                return
            yield rows
            oid, tid = rows[-1].oid, rows[-1].tid

    def dangling_references(self, conn: ConnectionRole) -> list[DanglingReference]:
        """Every reference from a current revision to a missing object."""
        return [DanglingReference(int(o), int(t), int(m))
                for o, t, m in conn.fetchall(self.sql.dangling)]
