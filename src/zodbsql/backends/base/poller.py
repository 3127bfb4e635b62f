"""Poller: the newest committed tid, and what changed since a given tid.

``poll`` is one statement: the changed objects (current revision newer than ``since``)
and, as a marker row, the commit row's last tid.  One statement sees one snapshot, so
the list is exactly what changed up to that tid, and every ZODB transaction start costs
one round trip.  A history-free snapshot is a read transaction that the poll opens
(``begin_and_poll``): one round trip more here, none on PostgreSQL, whose poller sends
the two together.

**Deletions.**  A poll finds what changed by the rows written since, so it can't name an
object whose rows are gone: one a pack collected (both modes), or a history-free
``deleteObject`` removed.  Unnamed, a process that kept the object's state (the state
cache, a ZODB connection's objects) would go on serving it, and not only as garbage a
pack may leave readable: when a commit wrote a newer revision and the pack removed it
before that process polled, the older state was served as current (the model test found
it: ``tests/model``).  So every such deletion is recorded, under the commit lock, in
``object_gone``: a row per batch of a pack or history-free commit, numbered by ``seq``
(the last number given kept in ``gone_row``), stamped with the last tid committed then,
its oids a JSON array (one row per batch: a row per object took a pack's writer twice
the stalls).  The poll
reads the records numbered after the instance's last poll in the same statement (kinds
2 to 4), and the instance reports those objects as changed.  A caller that has a tid
but no number (the persistent and Redis caches, checking what they restore) asks for
the records stamped from its tid on, a few more than it needs.  Each pack first prunes
the records made before the previous pack began (``floor_seq``, ``floor_tid``): a
process that polls at least once between two packs misses none; one that did not is
told everything changed (``poll_invalidations`` returns None, the state cache starts
afresh).  Records cost nothing to a poll when there are none: an index range on
``seq`` past the newest.

**A limit.**  A process that stays open while another imports 1,000,000 objects would
read them all at its next transaction start: on SQLite that poll took 1.3 s and raised
the process's peak memory from 39 to 367 MB (the pairs, ZODB's invalidations, the state
cache's index), for objects it mostly never held.  A caller may give a ``limit``: the
statement reads one change more than that at most (``LIMIT``, written into its text,
so that a prepared statement's plan is made for that number), and a poll that reaches
it is ``truncated``, its changes not listed: the caller takes everything it kept as
changed, as after pruned deletions.
"""
from __future__ import annotations

import dataclasses
from operator import itemgetter
from typing import Any, ClassVar

from zodbsql.backends.base.contract import BackendContract, ConnectionRole, Polled, Revision
from zodbsql.backends.base.statements import for_mode
from zodbsql.errors import SchemaError

LAST_TID = "SELECT last_tid FROM commit_row"
# kind 0 is the marker row carrying the last tid; kind 1 rows are changed objects.
# History-preserving, the changed objects come from their revisions (object_state's tid
# index), newest per object: current_object keeps no index on tid, so that a commit's
# update of its rows changes no index (on PostgreSQL a HOT update, in the free space its
# fillfactor leaves; see the schemas).  The range is closed above by the last tid, which
# changes no result (no revision is newer) but the plan: with no statistics yet (a
# table just filled, before autovacuum's ANALYZE), PostgreSQL estimated "tid > x" at a
# third of the table and scanned all of it at every poll (68 ms at 1,000,000 objects),
# where it takes a two-sided range for a small one and reads the index (0.3 ms).
CHANGED_SINCE = "tid > %s AND tid <= (SELECT last_tid FROM commit_row)"
# ``{limit}``: where a caller's limit goes (see ``Poller.statement``), in a derived
# table, which SQLite takes in a UNION where it refuses a parenthesized SELECT.
HP_CHANGED = (
    "SELECT 0, 0, last_tid FROM commit_row UNION ALL SELECT 1, zoid, newest FROM"
    f" (SELECT zoid, MAX(tid) AS newest FROM object_state WHERE {CHANGED_SINCE}"
    " GROUP BY zoid{limit}) AS changed")
HF_CHANGED = (
    "SELECT 0, 0, last_tid FROM commit_row UNION ALL SELECT 1, zoid, tid FROM"
    f" (SELECT zoid, tid FROM object_state WHERE {CHANGED_SINCE}{{limit}}) AS changed")
# The deletions (the docstring says why): kind 2 carries the floor and the newest record
# number, kind 3 the floor's tid, kind 4 rows are deleted objects with their record's
# number: those after the caller's number, and recorded at or after its tid.
GONE_SINCE = (
    " UNION ALL SELECT 2, floor_seq, last_seq FROM gone_row"
    " UNION ALL SELECT 3, 0, floor_tid FROM gone_row"
    " UNION ALL SELECT 4, zoid, seq FROM gone_oids WHERE seq > %s AND tid >= %s")
FIRST_POLL = "SELECT 0, 0, last_tid FROM commit_row UNION ALL SELECT 2, floor_seq, last_seq FROM gone_row"
#: Kind 5: a row a commit, its tid and the oids it changed as one array (each backend's
#: poll: its poller.py says why), in place of a kind 1 row a change.
REVISIONS = 5
#: Kind 6: a poll went past its limit: it read no change, or those it read are not
#: listed (a statement that counts first says so; the portable one reads one past it).
OVER_LIMIT = 6


def newest_each(commits: list[tuple[int, list[int]]]) -> list[Revision]:
    """``(oid, tid)`` once per oid of ``commits`` (tid, oids), at its newest tid, in the
    order the oids first come when the commits are taken oldest first."""
    newest: dict[int, int] = {}
    for tid, oids in sorted(commits):     # by tid: no two commits have the same
        newest.update(dict.fromkeys(oids, tid))
    return list(newest.items())


def with_commits(polled: Polled, commits: list[tuple[int, list[int]]],
                 limit: int = 0) -> Polled:
    """``polled`` (the markers' and deletions' rows parsed) with the changes of
    ``commits``, rows of kind 5 as (tid, oids); none listed if it is truncated, or if
    they hold more revisions than ``limit`` (a statement that reads one past it)."""
    if not commits:
        return polled
    upto = max(polled.upto, max(map(itemgetter(0), commits)))
    if polled.truncated or 0 < limit < sum(len(oids) for _, oids in commits):
        return polled._replace(upto=upto, truncated=True)
    return polled._replace(upto=upto, changes=newest_each(commits))


def missing_commit_row() -> SchemaError:
    """The one row of ``commit_row`` is gone.  Read as tid 0, a new process would see
    an empty database (ZODB then fails creating a root that exists, with a
    ConflictError that reads as retryable) and a commit would number its transaction
    from nothing."""
    return SchemaError("the schema is damaged: table commit_row has no row, so the"
                       " last transaction can't be read (zodbsql doctor gives the"
                       " statement that restores it)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PollerStatements:
    """The poller's statements in one history mode."""

    last_tid: str = LAST_TID
    #: The changes alone (a database opened read-only that has no record of deletions).
    changed: str
    poll: str
    first_poll: str = FIRST_POLL


class Poller:
    """The portable poll: one UNION statement (a ``PollerRole``)."""

    HISTORY_PRESERVING: ClassVar[PollerStatements] = PollerStatements(
        changed=HP_CHANGED, poll=HP_CHANGED + GONE_SINCE)
    HISTORY_FREE: ClassVar[PollerStatements] = PollerStatements(
        changed=HF_CHANGED, poll=HF_CHANGED + GONE_SINCE)

    def __init__(self, backend: BackendContract) -> None:
        self.backend = backend
        self.keep_history = backend.keep_history
        self.sql = for_mode(self.keep_history, self.HISTORY_PRESERVING, self.HISTORY_FREE)
        #: Does the database record deletions?  (One made before the record and opened
        #: read-only does not: the schema says so when it is opened.)
        self.reads_gone = True
        self._texts: dict[tuple[str, int], str] = {}

    def last_tid(self, conn: ConnectionRole) -> int:
        row = conn.fetchone(self.last_tid_statement(conn))
        if row is None:
            raise missing_commit_row()
        return int(row[0])

    def last_tid_statement(self, conn: ConnectionRole) -> str:
        """The statement that reads the last tid on ``conn``."""
        return self.sql.last_tid

    def statement(self, since: int | None, gone_since: int | None,
                  limit: int) -> tuple[str, tuple[int, ...]]:
        """The poll's statement and its parameters."""
        if since is None:
            return (self.sql.first_poll if self.reads_gone else self.sql.last_tid), ()
        if not self.reads_gone:
            return self.limited(self.sql.changed, limit), (since,)
        sql = self.limited(self.sql.poll, limit)
        if gone_since is None:
            return sql, (since, -1, since)
        return sql, (since, gone_since, 0)

    def limited(self, template: str, limit: int) -> str:
        """``template`` reading at most one change more than ``limit`` (0: all)."""
        key = (template, limit)
        text = self._texts.get(key)
        if text is None:
            clause = f" LIMIT {int(limit) + 1}" if limit > 0 else ""
            text = self._texts[key] = template.format(limit=clause)
        return text

    def poll(self, conn: ConnectionRole, since: int | None,
             gone_since: int | None = None, limit: int = 0) -> Polled:
        """What changed after ``since``, what was deleted after record ``gone_since``
        (see ``PollerRole.poll``)."""
        sql, params = self.statement(since, gone_since, limit)
        return self.parse_poll(conn.fetchall(sql, params), since, gone_since, limit)

    #: Can ``begin_and_poll`` end the read transaction before in the same round trip?
    ends_with_begin = False

    def begin_and_poll(self, conn: ConnectionRole, since: int | None,
                       gone_since: int | None, end_first: bool, limit: int) -> Polled:
        """:meth:`poll` in a read transaction it begins (``conn.begin_read``), after
        ending the one still open when ``end_first``."""
        if end_first:
            conn.rollback()
        conn.begin_read()
        return self.poll(conn, since, gone_since, limit)

    @staticmethod
    def parse_poll(rows: list[Any], since: int | None = None,
                   gone_since: int | None = None, limit: int = 0) -> Polled:
        """The poll statement's rows as a :class:`Polled` (a poll of ``since``, and
        ``gone_since``, with ``limit``: see ``statement``).

        A poll after another process's large commits names thousands of oids, all paid
        for at the transaction's start: one comprehension, not a step per row
        (1,000 rows: ~0.45 -> ~0.2 ms), and the other rows (a few markers, the
        deletions) read from what is left, not from every row again: 12,000 changes
        on PostgreSQL took 5 to 6 ms in three passes over all rows.  The drivers give
        BIGINT columns as ints, so the changes are taken as they come."""
        if len(rows) == 1 and len(rows[0]) == 1:   # the last tid alone
            return Polled(int(rows[0][0]), [], [], 0, 0)
        changes: list[Revision] = [(oid, tid) for kind, oid, tid in rows if kind == 1]
        others = [row for row in rows if row[0] != 1]
        gone = [int(oid) for kind, oid, _ in others if kind == 4]
        # The marker rows (kinds 0, 2, 3, 6), one each.
        markers = {kind: (int(value), int(tid)) for kind, value, tid in others
                   if kind != 4}
        if 0 not in markers:
            raise missing_commit_row()
        upto = markers[0][1]
        floor, gone_seq = markers.get(2, (0, 0))
        floor_tid = markers.get(3, (0, 0))[1]
        # A changed row newer than the marker can't be (one snapshot), but be safe.
        if changes:
            upto = max(upto, max(map(itemgetter(1), changes)))
        complete = True
        if since is not None and gone_since is None and floor:
            # Without a record number: the records after ``since`` are all there if
            # none pruned was made after it.
            complete = since > floor_tid
        if 0 < limit < len(changes) or OVER_LIMIT in markers:
            return Polled(upto, [], gone, gone_seq, floor, complete, truncated=True)
        return Polled(upto, changes, gone, gone_seq, floor, complete)
