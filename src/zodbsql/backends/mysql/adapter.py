"""The MySQL/MariaDB backend: its parts, and how a session is opened and set up."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, ClassVar

from zodbsql.backends.base.adapter import Backend
from zodbsql.backends.base.connections import DBConnection
from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.mysql.connections import (ACCESS_DENIED, CANT_CONNECT, CAUSAL_READ,
                                                SERVER_GONE, WSREP_SETTINGS,
                                                MySQLConnection, error_number, is_galera,
                                                load_driver, prepare_for_writing,
                                                pymysql_connection_class)
from zodbsql.backends.mysql.blobs import MySQLBlobs
from zodbsql.backends.mysql.features import MySQLFeatures
from zodbsql.backends.mysql.history import MySQLHistory
from zodbsql.backends.mysql.inspector import MySQLInspector
from zodbsql.backends.mysql.locker import MySQLLocker
from zodbsql.backends.mysql.mover import MySQLMover
from zodbsql.backends.mysql.oidalloc import MySQLOidAllocator
from zodbsql.backends.mysql.options import MySQLOptions
from zodbsql.backends.mysql.packer import MySQLPacker
from zodbsql.backends.mysql.poller import GROUP_CONCAT_LIMIT, MySQLPoller
from zodbsql.backends.mysql.replicas import replica_lag
from zodbsql.backends.mysql.schema import MySQLSchema
from zodbsql.backends.mysql.serverstart import ServerStart, server_started
from zodbsql.backends.mysql.txncontrol import MySQLTransactionControl, client_address
from zodbsql.errors import ConnectionLost, DatabaseError
from zodbsql.masking import mask_secrets

#: Connect errors: the login is right but the database is not the user's; no such
#: database; the server is down, gone during the handshake, full or shutting down.
NO_DATABASE_RIGHTS = 1044
NO_SUCH_DATABASE = 1049
UNREACHABLE = CANT_CONNECT | SERVER_GONE | {1040, 1053}
#: Bytes of a statement that are not the state itself (column values, SQL text).
PACKET_OVERHEAD = 64 * 1024

log = logging.getLogger(__name__)


class MySQLBackend(Backend[MySQLOptions]):
    name: ClassVar[str] = "mysql"
    features_class = MySQLFeatures
    schema_class = MySQLSchema
    locker_class = MySQLLocker
    mover_class = MySQLMover
    poller_class = MySQLPoller
    oids_class = MySQLOidAllocator
    packer_class = MySQLPacker
    blobs_class = MySQLBlobs
    inspector_class = MySQLInspector
    txncontrol_class = MySQLTransactionControl
    history_class = MySQLHistory

    def __init__(self, options: MySQLOptions, keep_history: bool, lock_timeout: float,
                 read_only: bool = False) -> None:
        super().__init__(options, keep_history, lock_timeout, read_only)
        self.driver_name, self.module = load_driver(options.driver)
        #: Whether the server is a Galera node: probed on the first connection.
        self.galera: bool | None = None
        #: Each replica's options (replica-dsns).
        self.replicas = options.replicas
        self.replica_max_lag = options.replica_max_lag
        #: When the server the last connections reached started (``_note_start``).
        self._started: ServerStart | None = None
        self._start_lock = threading.Lock()
        #: Raised by one each time a connection finds the server restarted.
        self.server_generation = 0

    def _where(self, o: MySQLOptions | None = None) -> str:
        o = o or self.options
        server = f"unix socket {o.unix_socket}" if o.unix_socket else f"{o.host}:{o.port}"
        return f"MySQL database {o.db!r} on {server}"

    def _connect_args(self, o: MySQLOptions) -> dict[str, Any]:
        args: dict[str, Any] = {"user": o.user, "charset": "utf8mb4", "autocommit": True,
                                "port": int(o.port), "connect_timeout": 10,
                                # The poll's arrays (poller.py) cut at no length of their own.
                                "init_command": GROUP_CONCAT_LIMIT}
        if self.driver_name == "mysqlclient":
            args.update(db=o.db, passwd=o.passwd)
            # libmysqlclient uses the socket only for host "localhost".
            args["host"] = "localhost" if o.unix_socket else o.host
        else:
            # (PyMySQL's own max_allowed_packet only sizes LOAD DATA LOCAL's packets.)
            args.update(database=o.db, password=o.passwd, host=o.host)
        if o.unix_socket:
            args["unix_socket"] = o.unix_socket
        return args

    def connect(self) -> MySQLConnection:
        return self._connect(self.options)

    def _connect(self, options: MySQLOptions, role: str = "") -> MySQLConnection:
        where = role + self._where(options)
        try:
            if self.driver_name == "pymysql":
                raw = pymysql_connection_class(self.module)(**self._connect_args(options))
            else:
                raw = self.module.connect(**self._connect_args(options))
        except Exception as exc:
            raise self._connect_failure(where, exc) from exc
        conn = MySQLConnection(raw, self.driver_name, where, self.module)
        try:
            row = conn.fetchone(
                "SELECT @@max_allowed_packet, @@innodb_lock_wait_timeout, @@version")
            conn.max_allowed_packet = int(row[0]) if row else 0
            conn.lock_timeout = int(float(row[1])) if row else None
            # MariaDB spells a share lock that never waits LOCK IN SHARE MODE NOWAIT,
            # MySQL 8 FOR SHARE NOWAIT (and allows no NOWAIT after LOCK IN SHARE MODE).
            conn.share_lock_nowait = (
                "LOCK IN SHARE MODE NOWAIT" if row and "MariaDB" in str(row[2])
                else "FOR SHARE NOWAIT")
            # The largest state that fits one statement: the drivers send states escaped
            # in the statement text, where each byte can take two.
            conn.max_state_size = max(0, (conn.max_allowed_packet - PACKET_OVERHEAD) // 2)
            conn.max_state_size_detail = (
                f"the server's max_allowed_packet is {conn.max_allowed_packet} bytes and"
                " a state is sent escaped, up to twice its size; raise max_allowed_packet")
            if not role:
                # A replica's session reads what it has applied; the causal wait is
                # for the primary's Galera nodes only.
                if self.galera is None:
                    self.galera = is_galera(conn.fetchall(WSREP_SETTINGS))
                conn.galera = self.galera
                conn.causal = CAUSAL_READ if self.galera else ""
            # Loads read at REPEATABLE READ (the history-free snapshot); whatever the
            # server's default, say so explicitly.
            conn.set_isolation("REPEATABLE READ")
            if not role:
                conn.server_started = server_started(conn)
                self._note_start(conn.server_started)
        except BaseException:
            conn.close()
            raise
        conn.statements = 0
        return conn

    def _note_start(self, started: ServerStart) -> None:
        """A connection reached a server that started at ``started``: one that started
        after the server reached before is a restart, and raises ``server_generation``.
        InnoDB shows a commit to other sessions before its log is on disk, so a crash
        can lose a commit that a process already read: what it cached from before the
        restart may name states the database no longer holds (the storage drops it at
        its next poll, and refuses a commit whose snapshot came before)."""
        with self._start_lock:
            seen = self._started
            if seen is not None and not seen.certainly_before(started):
                return
            self._started = started
            if seen is not None:
                self.server_generation += 1
                log.warning("%s restarted (it started after the last connection's"
                            " server did): what was read before it is dropped",
                            self.describe())

    def replica_count(self) -> int:
        return len(self.replicas)

    def open_replica(self, index: int) -> MySQLConnection:
        return self._connect(self.replicas[index], "replica of ")

    def replica_lag(self, conn: DBConnection) -> float:
        assert isinstance(conn, MySQLConnection)
        return replica_lag(conn)

    def _connect_failure(self, where: str, exc: Exception) -> DatabaseError:
        """The error for a failed connection attempt, with what to do about it;
        :class:`ConnectionLost` (retryable) while the server can't be reached."""
        number = error_number(exc)
        text = mask_secrets(str(exc))
        user = self.options.user
        if number == NO_DATABASE_RIGHTS:
            return DatabaseError(
                f"user {user!r} logged in but may not use {where}: {text} (GRANT the"
                f" privileges doctor lists ON {self.options.db}.* TO the user)")
        if number in ACCESS_DENIED:
            return DatabaseError(
                f"cannot log in to {where} as user {user!r}: {text} (check user and"
                " passwd, and the hosts the user may connect from)")
        if number in UNREACHABLE:
            return ConnectionLost(
                f"cannot reach the MySQL server for {where}: {text} (a retried"
                " transaction reconnects once the server is back)")
        if number == NO_SUCH_DATABASE:
            return DatabaseError(
                f"{where} does not exist: {text} (create it with CREATE DATABASE;"
                " zodbsql creates tables, not databases)")
        return DatabaseError(f"cannot connect to {where}: {text}")

    def connect_for_commit(self, lock_timeout: float) -> DBConnection:
        conn = self.connect()
        try:
            # Known before COMMIT (the start read by ``connect``), so that a lost COMMIT
            # can tell a restarted server, and its session from another one given the
            # same id.
            conn.client_address = client_address(conn)
            prepare_for_writing(conn, lock_timeout)
            self.mover.prepare_connection(conn)
        except BaseException:
            conn.close()
            raise
        conn.statements = 0
        return conn

    def describe(self) -> str:
        return self._where()

    def sort_key(self) -> str:
        o = self.options
        server = o.unix_socket or f"{o.host}:{o.port}"
        return f"zodbsql:mysql:{server}/{o.db}"

    def database_size(self, conn: ConnectionRole) -> int:
        row = conn.fetchone(
            "SELECT COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables"
            " WHERE table_schema = DATABASE()")
        return int(row[0]) if row else 0

