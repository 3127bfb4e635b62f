"""The MySQL drivers: mysqlclient (MySQLdb) first, PyMySQL as the fallback.

Both speak the ``%s`` (format) paramstyle the roles are written in, so SQL passes
through unchanged.  Connections run in autocommit mode, so ``START TRANSACTION`` opens
every explicit transaction; error numbers from the server are translated here.
"""
from __future__ import annotations

import importlib
from typing import Any, Sequence

from zodbsql.backends.base.connections import DBConnection
from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.mysql.serverstart import ServerStart
from zodbsql.errors import (CommitLockTimeout, ConnectionLost, DatabaseConflict, DatabaseError,
                            DeadlockError, DriverNotFound)

#: Driver names in the order "auto" tries them, with the module each imports.
DRIVERS = (("mysqlclient", "MySQLdb"), ("pymysql", "pymysql"))

# Server and client error numbers.
SERVER_GONE = {2006, 2013, 2055, 1927, 4031}   # gone away, lost, killed, idle disconnect
CANT_CONNECT = {2002, 2003, 2005}
ACCESS_DENIED = {1044, 1045, 1698}
LOCK_WAIT_TIMEOUT = 1205
DEADLOCK = 1213
#: MySQL 8's answer to a NOWAIT locking read that met a lock (MariaDB answers 1205).
LOCK_NOWAIT = 3572
PACKET_TOO_LARGE = {1153, 1301, 2020}
#: Galera: "WSREP has not yet prepared node for application use" (the node is joining,
#: donating or cut off from the primary component; another node, or this one later,
#: takes the transaction).
NODE_NOT_READY = 1047
#: Galera (wsrep): the statement prefix of a causal read, which first waits until this
#: node has applied every transaction the cluster committed before it was sent (15:
#: whatever kind of statement follows).
CAUSAL_READ = "SET STATEMENT wsrep_sync_wait = 15 FOR "
#: Galera is on when wsrep_on is ON with a provider loaded.
WSREP_SETTINGS = ("SHOW GLOBAL VARIABLES WHERE Variable_name IN"
                  " ('wsrep_on', 'wsrep_provider')")


def load_driver(choice: str) -> tuple[str, Any]:
    """``(name, module)`` of the driver to use; DriverNotFound lists what failed."""
    wanted = [d for d in DRIVERS if choice in ("auto", d[0])]
    if not wanted:
        raise DriverNotFound(
            f"unknown MySQL driver {choice!r}: expected auto, mysqlclient or pymysql")
    tried = []
    for name, module in wanted:
        try:
            return name, importlib.import_module(module)
        except ImportError as exc:
            tried.append(f"{name} (import {module}): {exc}")
    raise DriverNotFound(
        "no MySQL driver could be loaded; tried " + "; ".join(tried)
        + ". Install PyMySQL (pip install PyMySQL) or mysqlclient (pip install"
        " 'zodbsql[mysql]', which needs the MySQL client headers)")


_PYMYSQL_CONNECTION: Any = None


def pymysql_connection_class(module: Any) -> Any:
    """PyMySQL's Connection, reusing one TLS context for its "preferred TLS" default.

    Without TLS options PyMySQL builds a fresh default SSLContext for every connection
    (loading the system CA store: about 20 ms, forty times the rest of a local connect).
    The context it builds is always the same, so one is built and shared; explicit TLS
    options still get their own.
    """
    global _PYMYSQL_CONNECTION
    if _PYMYSQL_CONNECTION is None:
        base = module.connections.Connection

        class Connection(base):  # type: ignore[misc, valid-type]
            _shared_default_ctx = None

            def _create_ssl_ctx(self, sslp: Any) -> Any:
                if sslp == {}:
                    cls = type(self)
                    if cls._shared_default_ctx is None:
                        cls._shared_default_ctx = super()._create_ssl_ctx(sslp)
                    return cls._shared_default_ctx
                return super()._create_ssl_ctx(sslp)
        _PYMYSQL_CONNECTION = Connection
    return _PYMYSQL_CONNECTION


def error_number(exc: Exception) -> int | None:
    args = getattr(exc, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


class MySQLConnection(DBConnection):
    """One MySQL session; remembers its isolation level and lock wait timeout."""

    def __init__(self, raw: Any, driver_name: str, where: str, module: Any) -> None:
        super().__init__(raw)
        self.driver_name = driver_name
        self.where = where
        self.module = module
        self.isolation: str | None = None
        self.lock_timeout: int | None = None
        self.max_allowed_packet = 0
        #: The clause of a locking read that share-locks without waiting, in this
        #: server's spelling (set at connect from its version).
        self.share_lock_nowait = "LOCK IN SHARE MODE NOWAIT"
        #: When the server started, and the session's client address (committing
        #: connections: read before COMMIT, so that a lost COMMIT can tell a restarted
        #: server, and its session from another given the same id; txncontrol.py).
        self.server_started: ServerStart | None = None
        self.client_address: str | None = None
        self.connection_id = int(raw.thread_id())
        self.session_id = self.connection_id
        #: A node of a Galera cluster (probed at connect, ``is_galera``): rows locked
        #: here are not locked on the other nodes, and a conflict with a commit on
        #: another node shows as error 1213 (certification failure), often at COMMIT.
        self.galera = False
        #: Put before the statements that must see every commit the cluster made
        #: before them (CAUSAL_READ on Galera, nothing on a single server).
        self.causal = ""
        #: A session that lives and dies with this one (the pack's cluster-wide lock
        #: on Galera, see packer.py): closed with it.
        self.companion: "MySQLConnection | None" = None

    def close(self) -> None:
        if self.companion is not None:
            self.companion.close()
            self.companion = None
        super().close()

    # -- session settings (each sent only when it changes) ----------------------------------
    def set_isolation(self, level: str) -> None:
        if self.isolation != level:
            self.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {level}")
            self.isolation = level

    def set_lock_timeout(self, seconds: float) -> None:
        whole = max(1, int(round(seconds)))
        if self.lock_timeout != whole:
            self.execute(f"SET SESSION innodb_lock_wait_timeout = {whole}")
            self.lock_timeout = whole

    # -- transactions -----------------------------------------------------------------------
    def begin_read(self) -> None:
        # History-free snapshot: one consistent view for the whole ZODB transaction
        # (on Galera, of this node once it has applied what the cluster committed).
        self.execute(self.causal + "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        self.in_transaction = True

    def begin_write(self) -> None:
        self.execute("START TRANSACTION")
        self.in_transaction = True

    # -- statements -------------------------------------------------------------------------
    # The format paramstyle drivers apply ``sql % params`` whenever params is not None;
    # None keeps a statement without parameters literal.
    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return super().execute(sql, params or None)  # type: ignore[arg-type]

    def fetchall(self, sql: str, params: Sequence[Any] = (), binary: bool = False,
                 prepare: bool = False) -> list[Any]:
        return super().fetchall(sql, params or None, binary)  # type: ignore[arg-type]

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return super().fetchone(sql, params or None)  # type: ignore[arg-type]

    def execute_insert_id(self, sql: str, params: Sequence[Any]) -> int:
        """Run one statement and return the LAST_INSERT_ID it set (from the OK packet)."""
        self._count()
        try:
            with self.tracing(sql):
                cursor = self.raw.cursor()
                cursor.execute(sql, params)
                return int(cursor.lastrowid)
        except Exception as exc:
            raise self._fail(exc, sql) from exc

    def translate_error(self, exc: Exception, sql: str | None) -> Exception:
        number = error_number(exc)
        text = f"{self.driver_name} error on {self.where}: {exc}"
        if number in SERVER_GONE or isinstance(exc, getattr(self.module, "InterfaceError", ())):
            return ConnectionLost(
                f"the connection to {self.where} was lost ({exc}); the transaction can be"
                " retried", sql)
        if number in (LOCK_WAIT_TIMEOUT, LOCK_NOWAIT):
            return CommitLockTimeout(
                f"a row or commit lock on {self.where} was not granted within"
                f" {self.lock_timeout or '?'}s (commit-lock-timeout, applied as the"
                f" session's innodb_lock_wait_timeout); the transaction can be retried")
        if self.galera and number == DEADLOCK:
            return DatabaseConflict(
                f"Galera rolled this transaction back on {self.where}: a transaction"
                " committed on another node changed the same rows first (certification"
                f" failure or brute-force abort); it can be retried ({exc})")
        if self.galera and number == NODE_NOT_READY:
            return ConnectionLost(
                f"the Galera node {self.where} is not ready for queries (joining, donating"
                f" or outside the primary component: {exc}); the transaction can be"
                " retried, on this node once it has synced or on another", sql)
        if number == DEADLOCK:
            return DeadlockError(
                f"InnoDB deadlock on {self.where}; the transaction was rolled back and can"
                f" be retried ({exc})")
        if number in PACKET_TOO_LARGE:
            return DatabaseError(
                f"a statement to {self.where} was larger than the server's"
                f" max_allowed_packet ({self.max_allowed_packet} bytes): {exc}."
                " Raise max_allowed_packet on the server", sql)
        return DatabaseError(text, sql)


def prepare_for_writing(conn: ConnectionRole, lock_timeout: float) -> None:
    """READ COMMITTED (locking reads see the newest commit, no gap locks) and the
    lock wait timeout; statements are sent only for what changes."""
    assert isinstance(conn, MySQLConnection)
    conn.set_isolation("READ COMMITTED")
    conn.set_lock_timeout(lock_timeout)


def is_galera(rows: Sequence[Any]) -> bool:
    """Whether ``WSREP_SETTINGS`` answered as a Galera node (MySQL answers no rows)."""
    settings = {str(name).lower(): str(value) for name, value in rows}
    provider = settings.get("wsrep_provider", "none").strip().lower()
    return settings.get("wsrep_on", "OFF").upper() == "ON" and provider not in ("", "none")
