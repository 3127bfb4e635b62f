"""MySQL's poll is the portable one; on Galera a history-preserving poll is a causal read.

A history-preserving snapshot is the tid the poll reads, so on a Galera node the poll
first waits until the node has applied every commit the cluster made before it
(``MySQLConnection.causal``): a ZODB transaction that starts after a commit was
acknowledged on any node sees it, as on a single server.  So does reading the last tid
(the first poll, pack, iteration).  A history-free snapshot is
the read transaction, whose ``START TRANSACTION`` waits the same way (``begin_read``);
its poll, inside that snapshot, need not wait again.
"""
from __future__ import annotations

from zodbsql.backends.base.contract import ConnectionRole, Polled
from zodbsql.backends.base.poller import Poller
from zodbsql.backends.mysql.connections import MySQLConnection


class MySQLPoller(Poller):
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
