"""Poller: the newest committed tid, and what changed since a given tid.

Both answers come from the same committed data: ``changes(after, upto)`` is bounded
above by the tid just read, so a commit that lands between the two queries is left for
the next poll rather than half-reported.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zodbsql.backends.base.adapter import Backend
    from zodbsql.backends.base.connections import DBConnection

LAST_TID = "SELECT last_tid FROM commit_row"
HP_CHANGES = "SELECT zoid, tid FROM current_object WHERE tid > %s AND tid <= %s"
HF_CHANGES = "SELECT zoid, tid FROM object_state WHERE tid > %s AND tid <= %s"


class Poller:
    def __init__(self, backend: "Backend") -> None:
        self.backend = backend
        self.keep_history = backend.keep_history

    def last_tid(self, conn: "DBConnection") -> int:
        row = conn.fetchone(LAST_TID)
        return int(row[0]) if row else 0

    def changes(self, conn: "DBConnection", after: int, upto: int) -> list[tuple[int, int]]:
        """``(oid, tid)`` of every object whose current revision is in ``(after, upto]``."""
        if upto <= after:
            return []
        sql = HP_CHANGES if self.keep_history else HF_CHANGES
        return [(int(oid), int(tid)) for oid, tid in conn.fetchall(sql, (after, upto))]
