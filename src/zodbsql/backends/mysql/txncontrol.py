"""MySQL's final step is the portable one; a lost COMMIT is settled by ending the session.

When the connection drops while COMMIT is in flight, the server may still be running
the old session (it notices a vanished client only when it next writes to it), and
until that session ends its commit can still become visible.  So before asking whether
the tid is in the database, the new connection ends the old session (``KILL``; InnoDB
then commits or rolls back as a whole) and waits until the server lists it no more.

After a restart the old session ended with the old server, and its id may have been
given to someone else's session (ids start again from 1): that one must not be killed.
Two checks keep the KILL for the old session.  The server's start is known as an
interval (``ServerStart``: ``Uptime`` counts whole seconds, and the client's clock is
read before and after asking), and the server counts as restarted only when the new
interval lies wholly after the old one: a client that stalled for seconds while it
asked (a busy machine) widens its interval rather than passing for a restart, which
would skip the KILL and let the old session's COMMIT land after the check said it had
not.  And a session is the old one only if it has the id and the client address (host
and port, for TCP) the old one had, read when it connected.
"""
from __future__ import annotations

import time
from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.txncontrol import TransactionControl
from zodbsql.backends.mysql.connections import MySQLConnection, error_number
from zodbsql.backends.mysql.serverstart import server_started
from zodbsql.errors import DatabaseError


SESSION_ALIVE = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s"
#: The same, of the session with that id and that client address.
SESSION_FROM_ALIVE = SESSION_ALIVE + " AND HOST = %s"
OWN_ADDRESS = "SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()"
KILL_SESSION = "KILL CONNECTION %s"
#: Server error for KILL of a session that is already gone.
UNKNOWN_THREAD = 1094


class MySQLTransactionControl(TransactionControl):
    def settle_session(self, conn: ConnectionRole, old: ConnectionRole,
                       deadline: float) -> bool:
        old.close()
        session = old.session_id
        if session is None or not isinstance(old, MySQLConnection):
            return False
        started = old.server_started
        if started is None:
            return False
        if started.certainly_before(server_started(conn)):
            # The server restarted since: the old session ended with it, and its
            # connection id may now be someone else's (ids start again from 1).
            return True
        address = old.client_address
        query, params = ((SESSION_FROM_ALIVE, (session, address)) if address else
                         (SESSION_ALIVE, (session,)))
        killed = False
        while True:
            row = conn.fetchone(query, params)
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


def client_address(conn: ConnectionRole) -> str | None:
    """The session's client address as the server lists it (``host:port`` over TCP)."""
    row = conn.fetchone(OWN_ADDRESS)
    return str(row[0]) if row and row[0] else None
