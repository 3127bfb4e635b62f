"""The PostgreSQL backend: its parts, and how a session is opened."""
from __future__ import annotations

from typing import ClassVar

from zodbsql.backends.base.adapter import Backend
from zodbsql.backends.base.connections import DBConnection
from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.postgresql.blobs import PostgreSQLBlobs
from zodbsql.backends.postgresql.connections import (MIN_SERVER_VERSION, PREPARE_THRESHOLD,
                                                     PostgreSQLConnection, load_driver)
from zodbsql.backends.postgresql.features import PostgreSQLFeatures
from zodbsql.backends.postgresql.locker import PostgreSQLLocker
from zodbsql.backends.postgresql.mover import PostgreSQLMover
from zodbsql.backends.postgresql.oidalloc import PostgreSQLOidAllocator
from zodbsql.backends.postgresql.options import PostgreSQLOptions
from zodbsql.backends.postgresql.packer import PostgreSQLPacker
from zodbsql.backends.postgresql.inspector import PostgreSQLInspector
from zodbsql.backends.postgresql.schema import PostgreSQLSchema
from zodbsql.backends.postgresql.txncontrol import PostgreSQLTransactionControl
from zodbsql.errors import ConfigurationError, ConnectionLost, DatabaseError
from zodbsql.masking import mask_secrets

DATABASE_SIZE = (
    "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = current_schema() AND c.relkind = 'r'")


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


class PostgreSQLBackend(Backend[PostgreSQLOptions]):
    name: ClassVar[str] = "postgresql"
    features_class = PostgreSQLFeatures
    schema_class = PostgreSQLSchema
    locker_class = PostgreSQLLocker
    mover_class = PostgreSQLMover
    oids_class = PostgreSQLOidAllocator
    packer_class = PostgreSQLPacker
    txncontrol_class = PostgreSQLTransactionControl
    inspector_class = PostgreSQLInspector
    blobs_class = PostgreSQLBlobs

    def __init__(self, options: PostgreSQLOptions, keep_history: bool, lock_timeout: float,
                 read_only: bool = False) -> None:
        super().__init__(options, keep_history, lock_timeout, read_only)
        self.psycopg = load_driver(options.driver)
        try:
            params = self.psycopg.conninfo.conninfo_to_dict(options.dsn)
        except self.psycopg.Error as exc:
            raise ConfigurationError(f"invalid postgresql dsn: {mask_secrets(str(exc))}") from exc
        self.params = params
        host = params.get("host") or "localhost"
        port = params.get("port") or "5432"
        self.dbname = params.get("dbname") or params.get("user") or "(default)"
        self.address = f"{host}:{port}"

    def connect(self) -> DBConnection:
        psycopg = self.psycopg
        try:
            raw = psycopg.connect(self.options.dsn, autocommit=True,
                                  prepare_threshold=PREPARE_THRESHOLD)
        except psycopg.ProgrammingError as exc:
            raise ConfigurationError(f"invalid postgresql dsn: {mask_secrets(str(exc))}") from exc
        except psycopg.Error as exc:
            raise connect_failure(self.describe(), exc) from exc
        conn = PostgreSQLConnection(raw, self.describe(), self.lock_timeout)
        try:
            conn.session_id = raw.info.backend_pid
            version = raw.info.server_version
            if version < MIN_SERVER_VERSION:
                raise DatabaseError(
                    f"{self.describe()} runs PostgreSQL {version // 10000}.{version % 10000};"
                    f" zodbsql needs PostgreSQL {MIN_SERVER_VERSION // 10000} or newer")
            if self.options.schema is not None:
                conn.execute("SET search_path TO "
                             + psycopg.sql.Identifier(self.options.schema).as_string(raw))
            if self.read_only:
                conn.execute("SET default_transaction_read_only = on")
        except BaseException:
            conn.close()
            raise
        conn.statements = 0
        return conn

    def describe(self) -> str:
        schema = f", schema {self.options.schema}" if self.options.schema else ""
        return f"PostgreSQL database {self.dbname} at {self.address}{schema}"

    def sort_key(self) -> str:
        return f"zodbsql:postgresql:{self.address}/{self.dbname}/{self.options.schema or ''}"

    def database_size(self, conn: ConnectionRole) -> int:
        row = conn.fetchone(DATABASE_SIZE)
        return int(row[0]) if row else 0
