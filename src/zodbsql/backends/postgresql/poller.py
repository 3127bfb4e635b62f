"""PostgreSQL's poll: the changes as an array a commit; a history-free start sends it
with its BEGIN.

**A row a commit.**  The portable poll (``base/poller.py``) names each changed object
in a row of its own, history-preserving newest per object through ``GROUP BY zoid``: a
hash of every revision in the range, made before its ``LIMIT`` applies.  Here at most
one revision past the limit is read, and each commit's oids come as one ``array_agg``;
``newest_each`` keeps each object's newest tid.  A poll after two commits of 1,000
objects, sent and read by psycopg (a scratch database, medians of 300):
history-preserving 0.79 -> 0.53 ms, history-free 0.44 -> 0.34.  A start after another
process imported 1,000,000 objects (``scripts/poll_after_import.py --backend
postgresql``) 661-676 -> 69-70 ms, since the ``LIMIT`` now stops the scan.  The
revisions are taken in no order: ordered by tid, the grouping streamed and a small poll
took 0.06 ms less, but on a table just filled (its statistics not yet made again)
PostgreSQL sorted all 1,067,509 revisions on disk for the ``LIMIT`` (0.4 s).  In a
``UNION`` every row has the arrays' type, so the marker rows carry their value as a
one-element array and the deletions none.  The caller's limit counts the revisions
read, not the objects (a poll of objects changed twice is truncated sooner), as
SQLite's does.

**With its BEGIN.**  A history-free snapshot is a repeatable-read transaction begun
right before the poll (``PostgreSQLConnection.begin_read``).  Sent apart, BEGIN is a
round trip of its own at every ZODB transaction start; here it and the poll go as one
simple-protocol query (``begin_read_fetchall``): one round trip and one statement in the
server's log.  The snapshot is the same, since a repeatable-read transaction takes it at
its first query, the poll.  What is given up: that query carries its tid in its text and
is planned at each start, where the poll alone was prepared on the server once (about
55 us of the server's time in a table of 100,000 objects).  On loopback here the two
come out even; across a network the round trip saved is worth more.
"""
from __future__ import annotations

from typing import Any, ClassVar

from zodbsql.backends.base.contract import ConnectionRole, Polled
from zodbsql.backends.base.poller import (CHANGED_SINCE, REVISIONS, Poller, PollerStatements,
                                          with_commits)
from zodbsql.backends.postgresql.connections import PostgreSQLConnection

#: ``{limit}``: the caller's limit on the revisions (``Poller.limited``), in no order
#: (the module says why).
CHANGED_BY_COMMIT = (
    "SELECT 0, 0, ARRAY[last_tid] FROM commit_row"
    f" UNION ALL SELECT {REVISIONS}, tid, array_agg(zoid) FROM (SELECT tid, zoid"
    f" FROM object_state WHERE {CHANGED_SINCE}{{limit}}) AS changed GROUP BY tid")
#: The portable deletions' rows (kinds 2 to 4) in the arrays' type.
GONE_SINCE = (
    " UNION ALL SELECT 2, floor_seq, ARRAY[last_seq] FROM gone_row"
    " UNION ALL SELECT 3, 0, ARRAY[floor_tid] FROM gone_row"
    " UNION ALL SELECT 4, zoid, NULL FROM gone_oids WHERE seq > %s AND tid >= %s")
FIRST_POLL = ("SELECT 0, 0, ARRAY[last_tid] FROM commit_row"
              " UNION ALL SELECT 2, floor_seq, ARRAY[last_seq] FROM gone_row")


class PostgreSQLPoller(Poller):
    """The portable poll, its changes read as arrays (the module says why)."""

    HISTORY_PRESERVING: ClassVar[PollerStatements] = PollerStatements(
        changed=CHANGED_BY_COMMIT, poll=CHANGED_BY_COMMIT + GONE_SINCE,
        first_poll=FIRST_POLL)
    # One row an object, each at its only (newest) tid: the same statement.
    HISTORY_FREE: ClassVar[PollerStatements] = HISTORY_PRESERVING

    #: The end of the snapshot before goes in the poll's query (``end_first``).
    ends_with_begin = True

    def begin_and_poll(self, conn: ConnectionRole, since: int | None,
                       gone_since: int | None, end_first: bool, limit: int) -> Polled:
        assert isinstance(conn, PostgreSQLConnection)
        sql, params = self.statement(since, gone_since, limit)
        # The parameters are ints written into the text: nothing else ever is.
        text = sql % tuple(int(each) for each in params) if params else sql
        return self.parse_poll(conn.begin_read_fetchall(text, end_first), since, gone_since,
                               limit)

    @staticmethod
    def parse_poll(rows: list[Any], since: int | None = None,
                   gone_since: int | None = None, limit: int = 0) -> Polled:
        if len(rows) == 1 and len(rows[0]) == 1:   # the last tid alone
            return Poller.parse_poll(rows)
        commits = [(tid, oids) for kind, tid, oids in rows if kind == REVISIONS]
        # The other rows as the portable ones: a marker's value out of its array.
        others = [(kind, value, array[0] if array else 0)
                  for kind, value, array in rows if kind != REVISIONS]
        return with_commits(Poller.parse_poll(others, since, gone_since), commits, limit)
