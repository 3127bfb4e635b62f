"""MySQL's final step is the portable one; a lost COMMIT is settled by ending the session.

When the connection drops while COMMIT is in flight, the server may still be running
the old session (it notices a vanished client only when it next writes to it), and
until that session ends its commit can still become visible.  So before asking whether
the tid is in the database, the new connection ends the old session (``KILL``; InnoDB
then commits or rolls back as a whole) and waits until the server lists it no more.
"""
from __future__ import annotations

import time
from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.txncontrol import TransactionControl
from zodbsql.backends.mysql.connections import MySQLConnection, error_number
from zodbsql.errors import DatabaseError


SESSION_ALIVE = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s"
UPTIME = "SHOW GLOBAL STATUS LIKE 'Uptime'"
#: Seconds two readings of the server's start time may differ by and be the same start.
SAME_START = 3.0
KILL_SESSION = "KILL CONNECTION %s"
#: Server error for KILL of a session that is already gone.
UNKNOWN_THREAD = 1094


class MySQLTransactionControl(TransactionControl):
    def settle_session(self, conn: ConnectionRole, old: ConnectionRole,
                       deadline: float) -> bool:
        old.close()
        session = old.session_id
        if session is None:
            return False
        started = old.server_started if isinstance(old, MySQLConnection) else None
        if started is None:
            return False
        if abs(server_started(conn) - started) > SAME_START:
            # The server restarted since: the old session ended with it, and its
            # connection id may now be someone else's (ids start again from 1).
            return True
        killed = False
        while True:
            row = conn.fetchone(SESSION_ALIVE, (session,))
            if not row or int(row[0]) == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            if not killed:
                try:
                    conn.execute(KILL_SESSION % int(session))
                except DatabaseError as exc:
                    cause = exc.__cause__
                    if not isinstance(cause, Exception) or error_number(cause) != UNKNOWN_THREAD:
                        raise  # not "gone meanwhile"
                killed = True
            time.sleep(0.05)


def server_started(conn: ConnectionRole) -> float:
    """When the server started (Unix time, to a second or so)."""
    row = conn.fetchone(UPTIME)
    return time.time() - float(row[1]) if row else 0.0
