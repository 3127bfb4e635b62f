"""Locker: who may commit, and which staged states conflict.

A commit takes its locks in two steps.  During vote, ``stage_and_lock`` stages the states
and (``lock_objects`` here) locks the rows of the objects being changed (exclusively, in oid order) and of the objects read-current
(shared, never waiting) and returns what conflicts.  At finish, ``lock_commit`` takes the
short, database-wide lock under which the tid is allocated and the commit made visible.
A pack batch locks the rows it deletes first, skipping rows a commit holds, and only
then the commit lock.  Each backend's locker says why no cycle of waits can form.  A
backend without row locks (SQLite) takes the database write lock already in vote.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Sequence

from zodbsql.backends.base.contract import (BackendContract, Conflict, ConnectionRole,
                                            MoverRole, StagedState)
from zodbsql.backends.base.statements import for_mode, in_list

# Staged states whose expected previous tid is not the current one: (oid, expected, actual).
HP_FIND_CONFLICTS = (
    "SELECT t.zoid, t.prev_tid, COALESCE(c.tid, 0) FROM temp_store t"
    " LEFT JOIN current_object c ON c.zoid = t.zoid"
    " WHERE COALESCE(c.tid, 0) <> t.prev_tid")
HF_FIND_CONFLICTS = (
    "SELECT t.zoid, t.prev_tid, COALESCE(c.tid, 0) FROM temp_store t"
    " LEFT JOIN object_state c ON c.zoid = t.zoid"
    " WHERE COALESCE(c.tid, 0) <> t.prev_tid")
HP_CURRENT_TIDS = "SELECT zoid, tid FROM current_object WHERE zoid IN ({oids})"
HF_CURRENT_TIDS = "SELECT zoid, tid FROM object_state WHERE zoid IN ({oids})"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LockerStatements:
    """The locker's statements in one history mode ("": none in this mode)."""

    #: ``(oid, expected tid, current tid)`` of the staged states that conflict (a
    #: backend with row locks may lock and return every staged row instead).
    find_conflicts: str
    #: ``(oid, current tid)`` of ``{oids}``.
    current_tids: str
    #: The same, share-locking the rows without waiting (backends with row locks).
    lock_read_current: str = ""
    #: Lock ``{oids}`` that no commit holds, skipping the others (backends with row locks).
    lock_for_pack: str = ""


class Locker:
    """Commit and row locking with conflict detection (a ``LockerRole``)."""

    HISTORY_PRESERVING: ClassVar[LockerStatements] = LockerStatements(
        find_conflicts=HP_FIND_CONFLICTS, current_tids=HP_CURRENT_TIDS)
    HISTORY_FREE: ClassVar[LockerStatements] = LockerStatements(
        find_conflicts=HF_FIND_CONFLICTS, current_tids=HF_CURRENT_TIDS)
    #: An empty commit has nothing to lock or check (see ``LockerRole``).
    skip_empty_lock: ClassVar[bool] = True

    def __init__(self, backend: BackendContract) -> None:
        # Lockers need only the history mode: their statements and timeouts come from
        # it and from the connection they are given.
        self.keep_history = backend.keep_history
        self.sql = for_mode(self.keep_history, self.HISTORY_PRESERVING, self.HISTORY_FREE)

    def begin_commit(self, conn: ConnectionRole, timeout: float) -> None:
        """Start the transaction a commit writes in (vote)."""
        conn.begin_write()

    def lock_objects(self, conn: ConnectionRole, read_current: dict[int, int],
                     ) -> tuple[list[Conflict], list[Conflict]]:
        """Lock staged and read-current rows; return (write conflicts, read conflicts).

        A missing object has current tid 0.  Without row locks the write transaction
        (``begin_commit``) already excludes other committers.
        """
        rows = conn.fetchall(self.sql.find_conflicts)
        conflicts = [Conflict(int(o), int(e), int(a)) for o, e, a in rows]
        read_conflicts: list[Conflict] = []
        if read_current:
            current = self.current_tids(conn, sorted(read_current))
            for oid, expected in read_current.items():
                actual = current.get(oid, 0)
                if actual != expected:
                    read_conflicts.append(Conflict(oid, expected, actual))
        return conflicts, read_conflicts

    def stage_and_lock(self, conn: ConnectionRole, mover: MoverRole,
                       states: Sequence[StagedState], read_current: dict[int, int],
                       begin: float | None = None) -> tuple[list[Conflict], list[Conflict]]:
        """Stage, then lock: two steps here (a backend that can do both in one call
        overrides this), after ``begin_commit`` when ``begin`` is given."""
        if begin is not None:
            self.begin_commit(conn, begin)
        mover.stage(conn, states)
        return self.lock_objects(conn, read_current)

    def current_tids(self, conn: ConnectionRole, oids: list[int]) -> dict[int, int]:
        result: dict[int, int] = {}
        for start in range(0, len(oids), 500):
            chunk = oids[start:start + 500]
            sql = self.sql.current_tids.format(oids=in_list(len(chunk)))
            result.update((int(o), int(t)) for o, t in conn.fetchall(sql, chunk))
        return result

    def wait_for_voted_commits(self, conn: ConnectionRole) -> None:
        """Nothing to wait for: without row locks a voted commit holds the database's
        write lock until it finishes, so no pack batch runs between its vote and finish."""

    def lock_for_pack(self, conn: ConnectionRole, oids: list[int]) -> list[int]:
        """Lock the rows of objects a pack batch may delete, before the commit lock.

        Never waits: rows a commit in progress holds are skipped (that commit may make
        the object reachable again; the next pack looks at it).  Returns the oids locked,
        in order.  Without row locks, all of them.
        """
        return oids

    def lock_commit(self, conn: ConnectionRole, timeout: float) -> int | None:
        """Take the database-wide lock for tid allocation (finish).

        Returns the last committed tid when taking the lock read it (saving finish a
        statement), else None."""
        return None
