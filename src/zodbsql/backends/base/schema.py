"""Schema: create the tables on first open, and refuse a database this storage can't use.

The meta table records the schema version and the history mode.  ``prepare`` reads it
before anything is written, so a storage opened in the wrong mode, on a foreign database
or on another schema version stops with :class:`~zodbsql.errors.SchemaError` and leaves
the database exactly as it was.
"""
from __future__ import annotations

from zodbsql.backends.base.contract import BackendContract, ConnectionRole
from zodbsql.errors import SchemaError

#: Version 2: a revision's references are a column of it (``object_state.refs``), and
#: ``object_ref`` is a view of them (mover.py says why).
SCHEMA_VERSION = 2
#: The version a database opened for writing is migrated from (``migrate``): version 1
#: recorded each reference as a row of the table ``object_ref``.
MIGRATABLE_VERSION = 1

#: Every view zodbsql creates (dropped before the tables they read).
VIEWS = ("object_ref", "gone_oids")
#: Every table zodbsql creates, in an order that drops cleanly (``object_ref``: a table
#: in a database of version 1).
TABLES = ("blob_ref", "blob_chunk", "blob_content", "object_ref", "current_object", "object_state", "transactions",
          "oid_counter", "commit_row", "commit_log", "object_gone", "gone_row", "zodbsql_meta")


def gone_ddl(view: str, table_options: str = "", insert: str = "INSERT",
             text: str = "TEXT") -> tuple[str, ...]:
    """The record of deleted objects (``backends/base/poller.py`` says why): a row per
    pack batch or history-free commit that removed objects, numbered by ``seq``, with
    the last tid committed when they went and their oids (a JSON array, as the
    references of a state); ``view`` (the backend's), ``gone_oids``, unnests them into
    ``(seq, zoid, tid)`` rows for the poll; and ``gone_row``, the last number given and
    the floor below which the records were pruned.  IF NOT EXISTS and an insert that
    adds the row only once (``insert``: MySQL's ignores the duplicate of a process that
    added it meanwhile, its DDL being outside any transaction): databases made before
    them get them when opened for writing."""
    return (
        "CREATE TABLE IF NOT EXISTS object_gone (seq BIGINT NOT NULL PRIMARY KEY,"
        f" tid BIGINT NOT NULL, zoids {text} NOT NULL)" + table_options,
        view,
        "CREATE TABLE IF NOT EXISTS gone_row (id INTEGER NOT NULL PRIMARY KEY,"
        " last_seq BIGINT NOT NULL, floor_seq BIGINT NOT NULL, floor_tid BIGINT NOT NULL,"
        " mark_seq BIGINT NOT NULL)" + table_options,
        f"{insert} INTO gone_row (id, last_seq, floor_seq, floor_tid, mark_seq)"
        " SELECT 0, 0, 0, 0, 0 FROM commit_row WHERE NOT EXISTS (SELECT 1 FROM gone_row)",
    )


SELECT_META = "SELECT name, value FROM zodbsql_meta"
INSERT_META = "INSERT INTO zodbsql_meta (name, value) VALUES (%s, %s)"
UPDATE_VERSION = "UPDATE zodbsql_meta SET value = %s WHERE name = 'schema_version'"


class Schema:
    """Creates and checks the tables (a ``SchemaRole``).  Backends supply the DDL and
    ``LIST_TABLES``."""

    #: DDL run in order to create a history-preserving database.
    HISTORY_PRESERVING_DDL: tuple[str, ...] = ()
    #: DDL run in order to create a history-free database.
    HISTORY_FREE_DDL: tuple[str, ...] = ()
    #: DDL of the blob tables (history-preserving, history-free); part of the DDL above,
    #: and run alone to add them to a database created before blobs were supported.
    HISTORY_PRESERVING_BLOB_DDL: tuple[str, ...] = ()
    HISTORY_FREE_BLOB_DDL: tuple[str, ...] = ()
    #: DDL of the record of deleted objects (``gone_ddl``), part of every new database.
    GONE_DDL: tuple[str, ...] = ()
    #: Query listing the tables in the database (one column, the name).
    LIST_TABLES = ""
    #: Query listing the views in the database (one column, the name).
    LIST_VIEWS = ""
    #: DDL that turns a database of ``MIGRATABLE_VERSION`` into the current one
    #: (history-preserving, history-free), run in one write transaction.
    HISTORY_PRESERVING_MIGRATION: tuple[str, ...] = ()
    HISTORY_FREE_MIGRATION: tuple[str, ...] = ()

    def __init__(self, backend: BackendContract) -> None:
        self.backend = backend

    def list_tables(self, conn: ConnectionRole) -> set[str]:
        return {str(row[0]).lower() for row in conn.fetchall(self.LIST_TABLES)}

    def read_meta(self, conn: ConnectionRole) -> dict[str, str] | None:
        """The meta table as a dict, or None when the database has no zodbsql schema."""
        if "zodbsql_meta" not in self.list_tables(conn):
            return None
        return {str(name): str(value) for name, value in conn.fetchall(SELECT_META)}

    def list_views(self, conn: ConnectionRole) -> set[str]:
        return {str(row[0]).lower() for row in conn.fetchall(self.LIST_VIEWS)}

    def check(self, meta: dict[str, str], keep_history: bool,
              version_wanted: int = SCHEMA_VERSION) -> None:
        where = self.backend.describe()
        version = meta.get("schema_version")
        if version != str(version_wanted):
            hint = ""
            if version == str(MIGRATABLE_VERSION):
                hint = ("; open it once for writing (not read-only) and it is migrated in"
                        " place")
            raise SchemaError(
                f"{where} holds zodbsql schema version {version}, this zodbsql needs"
                f" version {SCHEMA_VERSION}{hint}; nothing was changed")
        stored = meta.get("keep_history") == "true"
        if stored != keep_history:
            have = "history-preserving" if stored else "history-free"
            want = "history-preserving" if keep_history else "history-free"
            raise SchemaError(
                f"{where} is a {have} zodbsql database, but the storage was configured"
                f" {want} (keep-history {'true' if keep_history else 'false'});"
                f" set keep-history {'true' if stored else 'false'} to open it."
                " Nothing was changed")

    def prepare(self, conn: ConnectionRole, keep_history: bool, create: bool,
                read_only: bool, remake: bool = False) -> None:
        """Check the schema, creating it first when the database is empty and allowed
        (``remake``: zap's, beside any other tables)."""
        meta = self.read_meta(conn)
        foreign: set[str] = set()
        if meta is None:
            foreign = self.list_tables(conn)
            if foreign:
                # Another process may have made the schema between the two looks.
                meta = self.read_meta(conn)
        if meta is not None:
            if not read_only and meta.get("schema_version") == str(MIGRATABLE_VERSION):
                self.check(meta, keep_history, MIGRATABLE_VERSION)
                self.migrate(conn, keep_history)
                meta = self.read_meta(conn) or {}
            self.check(meta, keep_history)
            tables = self.list_tables(conn)
            if not read_only and "blob_ref" not in tables:
                conn.begin_write()
                try:
                    if "blob_ref" not in self.list_tables(conn):
                        self.add_blob_tables(conn, keep_history)
                    conn.commit()
                except BaseException:
                    conn.rollback()
                    raise
            if "gone_row" not in tables:
                if read_only:
                    # Made before deletions were recorded: polls read no record.
                    self.backend.poller.reads_gone = False
                else:
                    self.add_gone_tables(conn)
            return
        where = self.backend.describe()
        if foreign and not remake:
            names = ", ".join(sorted(foreign)[:5])
            raise SchemaError(
                f"{where} holds tables that are not zodbsql's ({names}); refusing to"
                " add a zodbsql schema beside them. Use an empty database or schema")
        if read_only or not create:
            why = "the storage is read-only" if read_only else "create-schema is false"
            raise SchemaError(f"{where} has no zodbsql schema and {why}, so none was created")
        conn.begin_write()
        try:
            meta = self.read_meta(conn)  # another process may have won the race
            if meta is None:
                self.create(conn, keep_history)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        if meta is not None:
            self.check(meta, keep_history)

    def create(self, conn: ConnectionRole, keep_history: bool) -> None:
        ddl = self.HISTORY_PRESERVING_DDL if keep_history else self.HISTORY_FREE_DDL
        for statement in ddl + self.GONE_DDL:
            conn.execute(statement)
        conn.execute(INSERT_META, ("schema_version", str(SCHEMA_VERSION)))
        conn.execute(INSERT_META, ("keep_history", "true" if keep_history else "false"))

    def migrate(self, conn: ConnectionRole, keep_history: bool) -> None:
        """Turn a database of ``MIGRATABLE_VERSION`` into the current version, in one
        write transaction (another process may have done it meanwhile: then nothing)."""
        ddl = (self.HISTORY_PRESERVING_MIGRATION if keep_history
               else self.HISTORY_FREE_MIGRATION)
        conn.begin_write()
        try:
            self.lock_schema(conn)
            meta = self.read_meta(conn) or {}
            if meta.get("schema_version") == str(MIGRATABLE_VERSION):
                for statement in ddl:
                    conn.execute(statement)
                conn.execute(UPDATE_VERSION, (str(SCHEMA_VERSION),))
            conn.commit()
        except BaseException:
            conn.rollback()
            raise

    def lock_schema(self, conn: ConnectionRole) -> None:
        """Keep other processes from changing the schema until the transaction ends
        (where the write transaction alone does not)."""

    def add_blob_tables(self, conn: ConnectionRole, keep_history: bool) -> None:
        """Add the blob tables to a database made before blobs (an additive upgrade)."""
        ddl = self.HISTORY_PRESERVING_BLOB_DDL if keep_history else self.HISTORY_FREE_BLOB_DDL
        for statement in ddl:
            conn.execute(statement)

    def add_gone_tables(self, conn: ConnectionRole) -> None:
        """Add the record of deleted objects to a database made before it."""
        conn.begin_write()
        try:
            self.lock_schema(conn)
            for statement in self.GONE_DDL:
                conn.execute(statement)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise

    def drop_views(self, conn: ConnectionRole) -> None:
        """Drop zodbsql's own views (before the tables they read)."""
        views = self.list_views(conn)
        for view in VIEWS:
            if view in views:
                conn.execute(f"DROP VIEW {view}")

    def drop_all(self, conn: ConnectionRole) -> None:
        """Drop zodbsql's own views and tables (and nothing else)."""
        self.drop_views(conn)
        present = self.list_tables(conn)
        for table in TABLES:
            if table in present:
                conn.execute(f"DROP TABLE {table}")
