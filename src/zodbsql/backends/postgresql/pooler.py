"""Is a connection pooler (pgbouncer) between zodbsql and PostgreSQL, and does it keep
a server session per client session?

zodbsql keeps session state across transactions: the staging tables are TEMPORARY
(created once per session), statements are prepared on the server after their second
use (``PREPARE_THRESHOLD``), ``SET search_path``, ``SET jit = off``, ``SET plan_cache_mode`` and
``SET default_transaction_read_only`` are session settings, and a lost COMMIT is
settled by the server's pid of the session.
A pooler in session mode (pgbouncer ``pool_mode = session``) keeps all of that; in
transaction or statement mode the next transaction may run on another server session
without them, so the storage refuses to start rather than fail later.

How it is told, once per backend, at the first session: when the server's port
(``inet_server_port()``) is the one the client connected to, nothing is in between.
Otherwise a second client session opens a transaction and both ask for the server's
backend pid: a pooler that shares server sessions hands the second client the session
the first one just released (pgbouncer reuses the most recent one), or moves the first
client to another one while the second holds its own; a session setting made by the
first client before is gone too.
"""
from __future__ import annotations

import secrets
from typing import Any, Callable

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.errors import ConfigurationError

SERVER = "SELECT pg_backend_pid(), inet_server_port()"
PID = "SELECT pg_backend_pid()"
MARK = "SELECT set_config('zodbsql.pooler_probe', %s, false)"
READ_MARK = "SELECT current_setting('zodbsql.pooler_probe', true)"
BEGIN = "BEGIN"

#: What ``probe`` finds.
DIRECT, SESSION_POOLING, TRANSACTION_POOLING = "direct", "session", "transaction"


def probe(conn: ConnectionRole, client_port: int | None,
          open_second: Callable[[], ConnectionRole]) -> str:
    """DIRECT, SESSION_POOLING (a pooler or proxy that keeps sessions) or
    TRANSACTION_POOLING, for the server ``conn`` is a session on."""
    row = conn.fetchone(SERVER)
    assert row is not None
    first_pid, server_port = int(row[0]), row[1]
    if server_port is not None and client_port is not None and int(server_port) == client_port:
        return DIRECT
    token = secrets.token_hex(8)
    conn.fetchone(MARK, (token,))
    second = open_second()
    try:
        second.execute(BEGIN)
        second.in_transaction = True
        row = second.fetchone(PID)
        second_pid = int(row[0]) if row else -1
        row = conn.fetchone(PID)
        again = int(row[0]) if row else -1
        row = conn.fetchone(READ_MARK)
        kept = row is not None and row[0] == token
    finally:
        second.rollback()
        second.close()
    if second_pid == first_pid or again != first_pid or not kept:
        return TRANSACTION_POOLING
    return SESSION_POOLING


def refuse_transaction_pooling(where: str) -> ConfigurationError:
    return ConfigurationError(
        f"{where} is reached through a connection pooler that shares server sessions"
        " between transactions (pgbouncer pool_mode = transaction or statement), but"
        " zodbsql keeps session state from one transaction to the next (temporary staging"
        " tables, prepared statements, SET search_path). Set pool_mode = session for this"
        " database in pgbouncer.ini (or connect to PostgreSQL directly)")


def client_port(raw: Any) -> int | None:
    """The port the client connected to (None over a Unix socket)."""
    try:
        return int(raw.info.port)
    except (TypeError, ValueError):
        return None
