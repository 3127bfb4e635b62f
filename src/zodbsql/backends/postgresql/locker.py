"""PostgreSQL locking: row locks in vote, a one-row lock in finish, no deadlock.

Vote calls ``zodbsql_stage_and_lock`` (procedures_lock.sql) once: it stages the states
(each with its references), then runs ``zodbsql_lock_objects``, which takes the pack gate
(an advisory lock) shared, locks the current rows of the objects the commit changes
(``FOR UPDATE``, in oid order), then share-locks the rows it read-current without
waiting (``FOR SHARE NOWAIT``), then returns every write and read conflict. Finish
locks ``commit_row`` for the short step that allocates the tid and publishes the commit.

The pack gate: a pack batch that deletes objects takes it exclusively first, so it
waits for every commit between vote and finish.  Such a commit may link again an object
the batch finds unreachable, and its references are visible only once it has finished
(a batch that went ahead deleted the object under it: a dangling reference).

Why no two commits can wait for each other in a cycle:

0. A commit waits for the pack gate holding no lock; a pack batch waits for it first,
   holding none either, and voted commits that hold it wait only as described below.
1. A commit waits for a row lock only in the first step, and there it takes exclusive
   locks in ascending oid order.  While it waits for oid *y*, every row lock it holds is
   on an oid below *y*.
2. The share locks of the second step never wait (NOWAIT): a row another commit holds
   for writing is reported at once as a read conflict, a retryable
   ``ReadConflictError``; that commit is about to change the object anyway.
3. A commit past step 2 waits only for ``commit_row``, and the commit holding it is in
   finish, which only writes rows it locked itself and waits for nothing.
4. A pack batch, once it holds the gate, locks the rows it will delete with ``SKIP
   LOCKED`` (never waiting; rows a commit holds are left for the next pack) before it
   takes ``commit_row``; no voted commit holds ``commit_row`` or waits for the batch.

So every wait for a row goes from a commit in step 1 to a holder that either waits for a
higher oid (also in step 1) or for ``commit_row`` or for nothing; following the waits,
oids strictly increase until a commit that is not waiting for a row.  No cycle.
Commits of disjoint objects never wait for each other.  Every wait is bounded by
``lock_timeout``, set per transaction from ``row-lock-timeout``.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from ZODB.POSException import ReadConflictError

from zodbsql.backends.base.contract import (Conflict, ConnectionRole, MoverRole,
                                            StagedState)
from zodbsql.backends.base.locker import Locker
from zodbsql.backends.postgresql.mover import as_arrays, bigint_array, text_array
from zodbsql.backends.postgresql.connections import PostgreSQLConnection, sqlstate
from zodbsql.errors import CommitLockTimeout, DatabaseError, RowLockTimeout


#: The integer arrays as text, the states in binary (mover.py says why).
STAGE_AND_LOCK = (
    "SELECT * FROM zodbsql_stage_and_lock(%t::BIGINT[], %t::BIGINT[], %t::BIGINT[],"
    " %t::BIGINT[], %t::BIGINT[], %b::BYTEA[], %t::TEXT[], %t::BIGINT[], %t::BIGINT[])")
BEGIN_WITH_TIMEOUT = "BEGIN; SET LOCAL lock_timeout = {millis}"
#: A commit whose states take at most this many bytes sends them inline, with BEGIN.
INLINE_BYTES = 8192
LOCK_COMMIT = "SELECT last_tid FROM commit_row FOR UPDATE"
#: Exclusive, against every voted commit's shared hold (procedures_lock.sql).
CLOSE_PACK_GATE = "SELECT pg_advisory_xact_lock(zodbsql_pack_gate())"
HP_LOCK_FOR_PACK = (
    "SELECT zoid FROM current_object WHERE zoid = ANY(%b::BIGINT[]) ORDER BY zoid"
    " FOR UPDATE SKIP LOCKED")
HF_LOCK_FOR_PACK = (
    "SELECT zoid FROM object_state WHERE zoid = ANY(%b::BIGINT[]) ORDER BY zoid"
    " FOR UPDATE SKIP LOCKED")
#: The SQLSTATE zodbsql_lock_objects raises when a row read-current is being written.
READ_CURRENT_LOCKED = "ZS003"


class PostgreSQLLocker(Locker):
    HISTORY_PRESERVING = dataclasses.replace(Locker.HISTORY_PRESERVING,
                                             lock_for_pack=HP_LOCK_FOR_PACK)
    HISTORY_FREE = dataclasses.replace(Locker.HISTORY_FREE, lock_for_pack=HF_LOCK_FOR_PACK)
    _row_wait = 0.0

    def begin_commit(self, conn: ConnectionRole, timeout: float) -> None:
        # One round trip: open the transaction and bound its lock waits.
        self._row_wait = timeout
        millis = max(1, int(timeout * 1000))
        conn.execute(BEGIN_WITH_TIMEOUT.format(millis=millis))
        conn.in_transaction = True

    def stage_and_lock(self, conn: ConnectionRole, mover: MoverRole,
                       states: Sequence[StagedState], read_current: dict[int, int],
                       begin: float | None = None) -> tuple[list[Conflict], list[Conflict]]:
        # One call stages (the mover's arrays) and locks: a round trip less per commit.
        oids = sorted(read_current)
        *numbers, stored, refs = as_arrays(states, 7)
        params = [*map(bigint_array, numbers), stored, text_array(refs), bigint_array(oids),
                  bigint_array([read_current[o] for o in oids])]
        small = sum(len(state) for state in stored if state is not None) <= INLINE_BYTES
        try:
            if begin is not None and small and isinstance(conn, PostgreSQLConnection):
                # BEGIN and the call as one query: a small commit's states go inline
                # (hex text, twice their size), a large one's in binary after BEGIN.
                self._row_wait = begin
                opening = BEGIN_WITH_TIMEOUT.format(millis=max(1, int(begin * 1000)))
                rows = conn.simple_query(f"{opening}; {conn.inline(STAGE_AND_LOCK, params)}",
                                         f"{opening}; {STAGE_AND_LOCK}", len(params), last=True)
            else:
                if begin is not None:
                    self.begin_commit(conn, begin)
                rows = conn.fetchall(STAGE_AND_LOCK, params)
        except CommitLockTimeout as exc:
            raise RowLockTimeout(
                "another commit held the row lock of an object this one changes for"
                f" longer than row-lock-timeout (default: commit-lock-timeout;"
                f" {self._row_wait:g}s); the transaction can be retried") from exc
        except DatabaseError as exc:
            if sqlstate(exc.__cause__) == READ_CURRENT_LOCKED:
                raise ReadConflictError(
                    "another commit is changing an object this transaction read-current"
                    " (checkCurrentSerialInTransaction); the transaction can be retried"
                ) from exc
            raise
        conflicts: list[Conflict] = []
        read_conflicts: list[Conflict] = []
        for oid, expected, actual, kind in rows:
            # psycopg loads "char" as str, in text and binary results alike.
            found = read_conflicts if kind == "r" else conflicts
            found.append(Conflict(int(oid), int(expected), int(actual)))
        return conflicts, read_conflicts

    def wait_for_voted_commits(self, conn: ConnectionRole) -> None:
        conn.fetchone(CLOSE_PACK_GATE)

    def lock_for_pack(self, conn: ConnectionRole, oids: list[int]) -> list[int]:
        return [int(row[0]) for row in conn.fetchall(self.sql.lock_for_pack, (oids,))]

    def lock_commit(self, conn: ConnectionRole, timeout: float) -> int | None:
        # Only a pack batch calls this here (zodbsql_finish takes commit_row itself),
        # and it wants the lock, not the tid.
        conn.execute(LOCK_COMMIT)
        return None
