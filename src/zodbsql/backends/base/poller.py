"""Poller: the newest committed tid, and what changed since a given tid.

``poll`` reads the last tid and then every object whose current revision is newer than
``since``, with no upper bound.  The two statements may see different commits (no
transaction is held), so the snapshot tid returned is the larger of the last tid and the
newest change seen: bounding the changes by the first tid instead would lose an object
changed before it and again after it, whose current row already names the later tid.
Commits are made visible in tid order, so every commit up to that tid is in the result.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zodbsql.backends.base.adapter import Backend
    from zodbsql.backends.base.connections import DBConnection

LAST_TID = "SELECT last_tid FROM commit_row"
HP_CHANGES = "SELECT zoid, tid FROM current_object WHERE tid > %s"
HF_CHANGES = "SELECT zoid, tid FROM object_state WHERE tid > %s"


class Poller:
    def __init__(self, backend: "Backend") -> None:
        self.backend = backend
        self.keep_history = backend.keep_history

    def last_tid(self, conn: "DBConnection") -> int:
        row = conn.fetchone(LAST_TID)
        return int(row[0]) if row else 0

    def poll(self, conn: "DBConnection", since: int | None) -> tuple[int, list[tuple[int, int]]]:
        """``(snapshot tid, [(oid, tid), ...])``: objects changed after ``since``.

        With ``since`` None only the snapshot tid is read.
        """
        upto = self.last_tid(conn)
        if since is None or upto <= since:
            return upto, []
        sql = HP_CHANGES if self.keep_history else HF_CHANGES
        changes = [(int(oid), int(tid)) for oid, tid in conn.fetchall(sql, (since,))]
        newest = max((tid for _, tid in changes), default=upto)
        return max(upto, newest), changes
