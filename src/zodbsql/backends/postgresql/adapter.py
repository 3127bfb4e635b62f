"""The PostgreSQL backend: its parts, and how a session is opened."""
from __future__ import annotations

import logging
import time
from typing import Any, ClassVar

from zodbsql.backends.base.adapter import Backend
from zodbsql.backends.base.connections import DBConnection
from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.wakeup import CommitWatch
from zodbsql.backends.postgresql import pooler
from zodbsql.backends.postgresql.standbys import standby_lag
from zodbsql.backends.postgresql.blobs import PostgreSQLBlobs
from zodbsql.backends.postgresql.connections import (MIN_SERVER_VERSION, PREPARE_THRESHOLD,
                                                     PostgreSQLConnection, load_driver)
from zodbsql.backends.postgresql.features import PostgreSQLFeatures
from zodbsql.backends.postgresql.locker import PostgreSQLLocker
from zodbsql.backends.postgresql.mover import PostgreSQLMover
from zodbsql.backends.postgresql.oidalloc import PostgreSQLOidAllocator
from zodbsql.backends.postgresql.options import PostgreSQLOptions
from zodbsql.backends.postgresql.packer import PostgreSQLPacker
from zodbsql.backends.postgresql.poller import PostgreSQLPoller
from zodbsql.backends.postgresql.inspector import PostgreSQLInspector
from zodbsql.backends.postgresql.listener import LISTENER_PARAMETERS, CommitListener
from zodbsql.backends.postgresql.schema import PostgreSQLSchema
from zodbsql.backends.postgresql.txncontrol import PostgreSQLTransactionControl
from zodbsql.errors import ConfigurationError, ConnectionLost, DatabaseError
from zodbsql.masking import mask_secrets

log = logging.getLogger(__name__)

DATABASE_SIZE = (
    "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = current_schema() AND c.relkind = 'r'")


#: Whether the server offers a compression method for oversized values
#: (``toast-compression``): PostgreSQL 12 and 13 have no choice, and a build without lz4
#: lists only pglz.
OFFERS_COMPRESSION = ("SELECT %s = ANY(enumvals) FROM pg_settings"
                      " WHERE name = 'default_toast_compression'")
#: The answers, for the whole process: (host:port, server version, method) -> offered.
#: Asked once per storage, it was 2,307 queries of a test that opens 768 DBs.
_COMPRESSION_OFFERED: dict[tuple[str, int, str], bool] = {}


#: What the server says while it can't take sessions for now (libpq gives no SQLSTATE
#: for a failed connection attempt).
SERVER_BUSY = ("the database system is starting up", "the database system is shutting down",
               "the database system is in recovery mode", "too many clients already",
               "remaining connection slots are reserved")


def connect_failure(where: str, exc: Exception) -> DatabaseError:
    """The error for a failed connection attempt: :class:`ConnectionLost` (retryable)
    while the server can't be reached or is busy, DatabaseError when it refused the
    login or database (retrying would not help)."""
    text = mask_secrets(str(exc))
    refused = "FATAL:" in text and not any(busy in text for busy in SERVER_BUSY)
    if refused:
        return DatabaseError(f"cannot connect to {where}: {text}")
    return ConnectionLost(f"cannot connect to {where}: {text} (the server is unreachable"
                          " or busy; a retried transaction reconnects)")


# A prepared statement is planned for its values at its first five runs (PostgreSQL's
# ``auto``), and the prefetch statement's planning (1.3 to 4 ms: a dozen CTEs) cost more
# than running it (about 3 ms for 500 states): a fresh session reading 1,000 objects
# cold took 46 ms with them and 36 ms with generic plans (medians of 8 processes).
# Every statement a session prepares looks rows up by key, or by a tid range that the
# generic plan still reads through the tid index (checked on the poll); the pack's
# session, whose range scans need their values, asks for custom plans (packer.py).
GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"


class PostgreSQLBackend(Backend[PostgreSQLOptions]):
    name: ClassVar[str] = "postgresql"
    features_class = PostgreSQLFeatures
    schema_class = PostgreSQLSchema
    locker_class = PostgreSQLLocker
    mover_class = PostgreSQLMover
    oids_class = PostgreSQLOidAllocator
    packer_class = PostgreSQLPacker
    poller_class = PostgreSQLPoller
    txncontrol_class = PostgreSQLTransactionControl
    inspector_class = PostgreSQLInspector
    blobs_class = PostgreSQLBlobs

    def __init__(self, options: PostgreSQLOptions, keep_history: bool, lock_timeout: float,
                 read_only: bool = False) -> None:
        super().__init__(options, keep_history, lock_timeout, read_only)
        self.psycopg = load_driver(options.driver)
        #: The primaries in the order they are tried (``dsn``, then ``failover-dsns``);
        #: with more than one, libpq accepts only a server that is not in recovery.
        self.primaries = [options.dsn, *options.failovers]
        self.replicas = list(options.replicas)
        for dsn in self.primaries + self.replicas:
            self._parse(dsn)
        self.params = self._parse(options.dsn)
        self.current = 0            # the primary the last session reached
        self._reached = False
        self.replica_max_lag = options.replica_max_lag
        self.dbname, self.address = self._where(options.dsn)
        self.first_address = f"{self.address}/{self.dbname}"
        #: What is between the storage and its primary (``pooler.probe``), learned at
        #: the first session.
        self.pooling: str | None = None

    def _parse(self, dsn: str) -> dict[str, Any]:
        try:
            return dict(self.psycopg.conninfo.conninfo_to_dict(dsn))
        except self.psycopg.Error as exc:
            raise ConfigurationError(f"invalid postgresql dsn: {mask_secrets(str(exc))}") from exc

    def _where(self, dsn: str) -> tuple[str, str]:
        params = self._parse(dsn)
        host = params.get("host") or "localhost"
        port = params.get("port") or "5432"
        return str(params.get("dbname") or params.get("user") or "(default)"), f"{host}:{port}"

    def connect(self, **extra: str) -> DBConnection:
        """A session on the primary: the one reached last, else each in order.
        ``extra``: more libpq parameters (those the DSN sets win)."""
        extra = {key: value for key, value in extra.items() if key not in self.params}
        if len(self.primaries) == 1:
            conn = self._session(self._open(self.options.dsn, self.describe(), **extra),
                                 self.describe())
            return self._checked(conn)
        order = [self.current] + [i for i in range(len(self.primaries)) if i != self.current]
        failures: list[DatabaseError] = []
        for index in order:
            dbname, address = self._where(self.primaries[index])
            where = f"PostgreSQL database {dbname} at {address}"
            try:
                raw = self._open(self.primaries[index], where, target_session_attrs="primary",
                                 **extra)
            except DatabaseError as exc:
                failures.append(exc)
                continue
            if index != self.current and self._reached:
                # Another primary than before: a failover.  What the old one held may
                # be missing here (commits it acknowledged before the standby had them).
                self.server_generation += 1
            self.current, self._reached = index, True
            self.dbname, self.address = dbname, address
            return self._checked(self._session(raw, self.describe()))
        error = ConnectionLost if any(isinstance(f, ConnectionLost) for f in failures) \
            else DatabaseError
        raise error("no primary could be reached (dsn, then failover-dsns, in order): "
                    + "; ".join(str(f) for f in failures))

    def _checked(self, conn: PostgreSQLConnection) -> PostgreSQLConnection:
        """``conn``, once the first session has made sure no pooler shares server
        sessions between transactions (a storage on one is refused at start-up)."""
        if self.pooling is None:
            try:
                found = pooler.probe(conn, pooler.client_port(conn.raw), lambda: self._session(
                    self._open(self.primaries[self.current], conn.where), conn.where))
            except BaseException:
                conn.close()
                raise
            conn.statements = 0
            if found == pooler.TRANSACTION_POOLING:
                conn.close()
                raise pooler.refuse_transaction_pooling(self.describe())
            self.pooling = found
        return conn

    def replica_count(self) -> int:
        return len(self.replicas)

    def open_replica(self, index: int) -> DBConnection:
        dsn = self.replicas[index]
        dbname, address = self._where(dsn)
        where = f"PostgreSQL standby {dbname} at {address}"
        return self._session(self._open(dsn, where), where)

    def replica_lag(self, conn: DBConnection) -> float:
        return standby_lag(conn)

    def _open(self, dsn: str, where: str, **extra: str) -> Any:
        psycopg = self.psycopg
        try:
            return psycopg.connect(dsn, autocommit=True, prepare_threshold=PREPARE_THRESHOLD,
                                   **extra)
        except psycopg.ProgrammingError as exc:
            raise ConfigurationError(f"invalid postgresql dsn: {mask_secrets(str(exc))}") from exc
        except psycopg.Error as exc:
            raise connect_failure(where, exc) from exc

    def _session(self, raw: Any, where: str) -> PostgreSQLConnection:
        psycopg = self.psycopg
        conn = PostgreSQLConnection(raw, where, self.lock_timeout)
        try:
            version = raw.info.server_version
            if version < MIN_SERVER_VERSION:
                raise DatabaseError(
                    f"{where} runs PostgreSQL {version // 10000}.{version % 10000};"
                    f" zodbsql needs PostgreSQL {MIN_SERVER_VERSION // 10000} or newer")
            # JIT compiles a statement whose estimated cost passes jit_above_cost: the
            # prefetch's recursive walk is estimated at millions of rows on a large
            # table, and compiling it took 400 ms of a statement that runs in 1 ms.
            # No statement of a storage runs long enough to repay it.
            # Generic plans (GENERIC_PLANS): see there.
            set_up = ["SET jit = off", GENERIC_PLANS]
            if self.options.schema is not None:
                set_up.append("SET search_path TO "
                              + psycopg.sql.Identifier(self.options.schema).as_string(raw))
            if self.read_only:
                set_up.append("SET default_transaction_read_only = on")
            method = self.options.toast_compression
            if method != "server" and self._offers_compression(raw, method, version):
                # A staged state is compressed once, in temp_store, and reaches
                # object_state as it is: in a growing catalog's commits (BTree nodes
                # rewritten at up to 17 KB) pglz was most of the vote's INSERT into
                # temp_store (see the README, "lz4").
                set_up.append(f"SET default_toast_compression = {method}")
            # One round trip sets the session up and names it (its pid and start), for
            # the lookup after a lost COMMIT (txncontrol.py).
            conn.session_id, conn.session_started = conn.session_identity("; ".join(set_up))
        except BaseException:
            conn.close()
            raise
        conn.statements = 0
        return conn

    def _offers_compression(self, raw: Any, method: str, version: int) -> bool:
        """Does the session's server offer ``method``?  Asked once per server and
        process (reading pg_settings took 0.8 ms), before the set-up of the first
        session there."""
        if version < 140000:
            return False
        key = (f"{raw.info.host}:{raw.info.port}", version, method)
        offered = _COMPRESSION_OFFERED.get(key)
        if offered is None:
            row = raw.execute(OFFERS_COMPRESSION, (method,)).fetchone()
            offered = _COMPRESSION_OFFERED[key] = bool(row and row[0])
        return offered

    def watch_commits(self) -> CommitWatch:
        # History-free too: a start skips its poll there only while the read
        # transaction of the last poll is open (``SQLStorage._unchanged``).
        if not self.options.listen_for_commits:
            return CommitWatch()
        return CommitListener(self, lambda: self.connect(**LISTENER_PARAMETERS))

    def describe(self) -> str:
        schema = f", schema {self.options.schema}" if self.options.schema else ""
        return f"PostgreSQL database {self.dbname} at {self.address}{schema}"

    def sort_key(self) -> str:
        # The first primary's, whichever serves now: the key must not change.
        return f"zodbsql:postgresql:{self.first_address}/{self.options.schema or ''}"

    def database_size(self, conn: ConnectionRole) -> int:
        row = conn.fetchone(DATABASE_SIZE)
        return int(row[0]) if row else 0
