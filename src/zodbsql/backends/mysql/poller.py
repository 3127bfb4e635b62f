"""MySQL's poll: the changes as a JSON array a commit; on Galera a history-preserving
poll is a causal read.

**A row a commit.**  The portable poll (``base/poller.py``) names each changed object in
a row of its own, history-preserving newest per object through ``GROUP BY zoid``: a
temporary table and a sort of every revision in the range, made before its ``LIMIT``
applies.  Here at most one revision past the limit is read, and each commit's oids come
as one ``JSON_ARRAYAGG`` (read by ``json.loads``, in C), as on SQLite and PostgreSQL.
MariaDB 10.11, a start after another process imported 1,000,000 objects
(``scripts/poll_after_import.py --backend mysql``): 1,534-1,561 ms before, 63-68 now
(the statement alone 1,300-1,470 and 42-45); a poll of the last two of its commits
(10,680 changes), 7.8 -> 4.3 ms.  In
the ``UNION`` the markers' values come as text (the arrays' type); the portable parse
reads them as ints.

MariaDB cuts a ``JSON_ARRAYAGG`` at ``group_concat_max_len`` (default 1 MB, MySQL's
1 KB), so each session raises it (``GROUP_CONCAT_LIMIT``, at connect); an array
longer than ``max_allowed_packet`` still comes back as NULL.  Either way, cut or
missing, an array can't be read: the poll is then taken as truncated (everything
changed, as past ``poll-changes-limit``), with a warning that names the setting, never
as the objects it did list.

**Galera.**  A history-preserving snapshot is the tid the poll reads, so on a Galera
node the poll first waits until the node has applied every commit the cluster made
before it (``MySQLConnection.causal``): a ZODB transaction that starts after a commit
was acknowledged on any node sees it, as on a single server.  So does reading the last
tid (the first poll, pack, iteration).  A history-free snapshot is the read
transaction, whose ``START TRANSACTION`` waits the same way (``begin_read``); its poll,
inside that snapshot, need not wait again.
"""
from __future__ import annotations

import json
import logging
from typing import Any, ClassVar

from zodbsql.backends.base.contract import ConnectionRole, Polled
from zodbsql.backends.base.poller import (CHANGED_SINCE, GONE_SINCE, OVER_LIMIT, REVISIONS,
                                          Poller, PollerStatements, with_commits)
from zodbsql.backends.mysql.connections import MySQLConnection

log = logging.getLogger(__name__)

#: ``{limit}``: the caller's limit on the revisions (``Poller.limited``).
CHANGED_BY_COMMIT = (
    "SELECT 0, 0, last_tid FROM commit_row"
    f" UNION ALL SELECT {REVISIONS}, tid, JSON_ARRAYAGG(zoid) FROM (SELECT tid, zoid"
    f" FROM object_state WHERE {CHANGED_SINCE}{{limit}}) AS changed GROUP BY tid")
#: A session's bound on an aggregated text (the arrays): 1 GB, the largest packet a
#: server allows, so that ``max_allowed_packet`` is the one that applies.
GROUP_CONCAT_LIMIT = "SET SESSION group_concat_max_len = 1073741824"
CUT_ARRAY = ("a poll's list of changed objects came back cut or empty (longer than the"
             " server's max_allowed_packet or group_concat_max_len): every object is"
             " taken as changed; raise max_allowed_packet")


class MySQLPoller(Poller):
    """The portable poll, its changes read as arrays (the module says why)."""

    HISTORY_PRESERVING: ClassVar[PollerStatements] = PollerStatements(
        changed=CHANGED_BY_COMMIT, poll=CHANGED_BY_COMMIT + GONE_SINCE)
    # One row an object, each at its only (newest) tid: the same statement.
    HISTORY_FREE: ClassVar[PollerStatements] = HISTORY_PRESERVING

    def last_tid_statement(self, conn: ConnectionRole) -> str:
        assert isinstance(conn, MySQLConnection)
        return conn.causal + self.sql.last_tid

    def poll(self, conn: ConnectionRole, since: int | None,
             gone_since: int | None = None, limit: int = 0) -> Polled:
        assert isinstance(conn, MySQLConnection)
        if since is None or not (conn.causal and self.keep_history):
            return super().poll(conn, since, gone_since, limit)
        sql, params = self.statement(since, gone_since, limit)
        return self.parse_poll(conn.fetchall(conn.causal + sql, params), since, gone_since,
                               limit)

    @staticmethod
    def parse_poll(rows: list[Any], since: int | None = None,
                   gone_since: int | None = None, limit: int = 0) -> Polled:
        if len(rows) == 1 and len(rows[0]) == 1:   # the last tid alone
            return Poller.parse_poll(rows)
        others = [row for row in rows if row[0] != REVISIONS]
        try:
            commits = [(int(tid), json.loads(oids))
                       for kind, tid, oids in rows if kind == REVISIONS]
        except (TypeError, ValueError):
            log.warning(CUT_ARRAY)
            return Poller.parse_poll(others + [(OVER_LIMIT, 0, 0)], since, gone_since)
        return with_commits(Poller.parse_poll(others, since, gone_since), commits, limit)
