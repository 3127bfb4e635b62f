"""MySQL/MariaDB tables: InnoDB, utf8mb4, signed BIGINT oids and tids, LONGBLOB states.

InnoDB clusters every table on its primary key, so ``object_state``'s (zoid, tid) key
keeps an object's revisions together and a load is one b-tree descent.  DDL commits
implicitly in MySQL, so creating the schema is serialised with a named lock instead of
a transaction.  On Galera, where that lock holds on one node only, the schema is read
with causal reads and a node that sees another node's creation half done waits for it.
"""
from __future__ import annotations

import time

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.schema import (MIGRATABLE_VERSION, SCHEMA_VERSION, SELECT_META,
                                         TABLES, UPDATE_VERSION, Schema, gone_ddl)
from zodbsql.backends.mysql.connections import MySQLConnection
from zodbsql.errors import SchemaError

TABLE_OPTIONS = " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"

COMMON_DDL = (
    "CREATE TABLE zodbsql_meta (name VARCHAR(191) NOT NULL PRIMARY KEY, value TEXT NOT NULL)"
    + TABLE_OPTIONS,
    "CREATE TABLE commit_row (id TINYINT NOT NULL PRIMARY KEY CHECK (id = 0),"
    " last_tid BIGINT NOT NULL)" + TABLE_OPTIONS,
    "INSERT INTO commit_row (id, last_tid) VALUES (0, 0)",
    "CREATE TABLE oid_counter (id TINYINT NOT NULL PRIMARY KEY CHECK (id = 0),"
    " last_oid BIGINT NOT NULL)" + TABLE_OPTIONS,
    "INSERT INTO oid_counter (id, last_oid) VALUES (0, 0)",
)
# Blob data, each distinct content once (see backends/base/blobs.py); chunks are sized
# below max_allowed_packet.
BLOB_CONTENT_DDL = (
    "CREATE TABLE blob_content (content_hash BINARY(32) NOT NULL PRIMARY KEY,"
    " size BIGINT NOT NULL, chunks INT NOT NULL)" + TABLE_OPTIONS,
    "CREATE TABLE blob_chunk (content_hash BINARY(32) NOT NULL, chunk_num INT NOT NULL,"
    " data LONGBLOB NOT NULL, PRIMARY KEY (content_hash, chunk_num))" + TABLE_OPTIONS,
)
HISTORY_PRESERVING_BLOB_DDL = BLOB_CONTENT_DDL + (
    "CREATE TABLE blob_ref (zoid BIGINT NOT NULL, tid BIGINT NOT NULL,"
    " content_hash BINARY(32) NOT NULL, PRIMARY KEY (zoid, tid),"
    " KEY blob_ref_hash (content_hash))" + TABLE_OPTIONS,
)
HISTORY_FREE_BLOB_DDL = BLOB_CONTENT_DDL + (
    "CREATE TABLE blob_ref (zoid BIGINT NOT NULL PRIMARY KEY, tid BIGINT NOT NULL,"
    " content_hash BINARY(32) NOT NULL, KEY blob_ref_hash (content_hash))" + TABLE_OPTIONS,
)
# The references as rows: JSON_TABLE of each revision's array (of a NULL: none).  MERGE,
# so that a condition on zoid reaches object_state's primary key.
HISTORY_PRESERVING_REFS_VIEW = (
    "CREATE OR REPLACE ALGORITHM=MERGE VIEW object_ref AS SELECT s.zoid, s.tid, j.to_zoid"
    " FROM object_state s, JSON_TABLE(s.refs, '$[*]' COLUMNS (to_zoid BIGINT PATH '$')) j")
HISTORY_FREE_REFS_VIEW = (
    "CREATE OR REPLACE ALGORITHM=MERGE VIEW object_ref AS SELECT s.zoid, j.to_zoid"
    " FROM object_state s, JSON_TABLE(s.refs, '$[*]' COLUMNS (to_zoid BIGINT PATH '$')) j")
HISTORY_PRESERVING_DDL = COMMON_DDL + (
    "CREATE TABLE transactions (tid BIGINT NOT NULL PRIMARY KEY,"
    " packed TINYINT NOT NULL DEFAULT 0, username MEDIUMBLOB NOT NULL,"
    " description MEDIUMBLOB NOT NULL, extension MEDIUMBLOB NOT NULL)" + TABLE_OPTIONS,
    # data_tid: set when the state is a copy of an older revision's (undo, restore).
    # refs: the oids the state refers to, a JSON array (base/mover.py).
    "CREATE TABLE object_state (zoid BIGINT NOT NULL, tid BIGINT NOT NULL,"
    " data_tid BIGINT, checksum BIGINT, state_size BIGINT NOT NULL, refs LONGTEXT,"
    " state LONGBLOB, PRIMARY KEY (zoid, tid), KEY object_state_tid (tid))" + TABLE_OPTIONS,
    # No index on tid: the poll reads object_state's (base/poller.py).
    "CREATE TABLE current_object (zoid BIGINT NOT NULL PRIMARY KEY, tid BIGINT NOT NULL)"
    + TABLE_OPTIONS,
    HISTORY_PRESERVING_REFS_VIEW,
) + HISTORY_PRESERVING_BLOB_DDL
HISTORY_FREE_DDL = COMMON_DDL + (
    "CREATE TABLE object_state (zoid BIGINT NOT NULL PRIMARY KEY, tid BIGINT NOT NULL,"
    " checksum BIGINT, state_size BIGINT NOT NULL, refs LONGTEXT, state LONGBLOB,"
    " KEY object_state_tid (tid))" + TABLE_OPTIONS,
    HISTORY_FREE_REFS_VIEW,
) + HISTORY_FREE_BLOB_DDL
# The deleted oids of each record as rows (base/schema.py's gone_ddl); MERGE, so that
# the poll's condition on seq reaches object_gone's primary key.
GONE_OIDS_VIEW = (
    "CREATE OR REPLACE ALGORITHM=MERGE VIEW gone_oids AS SELECT g.seq, j.zoid, g.tid"
    " FROM object_gone g, JSON_TABLE(g.zoids, '$[*]' COLUMNS (zoid BIGINT PATH '$')) j")
LIST_TABLES = ("SELECT table_name FROM information_schema.tables"
               " WHERE table_schema = DATABASE()")
LIST_VIEWS = ("SELECT table_name FROM information_schema.views"
              " WHERE table_schema = DATABASE()")
# From version 1 (a row per reference in the table object_ref).  DDL commits at once in
# MySQL, so each step can be run again after a crash between them: the column is added
# if missing, filled from the table while it is one, the table dropped, the view made.
ADD_REFS_COLUMN = ("ALTER TABLE object_state ADD COLUMN IF NOT EXISTS refs LONGTEXT"
                   " AFTER state_size")
REFS_IS_TABLE = ("SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE()"
                 " AND table_name = 'object_ref' AND table_type = 'BASE TABLE'")
LONG_GROUP_CONCAT = "SET SESSION group_concat_max_len = 4294967295"
HP_FILL_REFS = (
    "UPDATE object_state s JOIN (SELECT zoid, tid, CONCAT('[',"
    " GROUP_CONCAT(to_zoid ORDER BY to_zoid SEPARATOR ','), ']') AS refs"
    " FROM object_ref GROUP BY zoid, tid) r ON r.zoid = s.zoid AND r.tid = s.tid"
    " SET s.refs = r.refs")
HF_FILL_REFS = (
    "UPDATE object_state s JOIN (SELECT zoid, CONCAT('[',"
    " GROUP_CONCAT(to_zoid ORDER BY to_zoid SEPARATOR ','), ']') AS refs"
    " FROM object_ref GROUP BY zoid) r ON r.zoid = s.zoid SET s.refs = r.refs")
DROP_REFS_TABLE = "DROP TABLE object_ref"
#: Pack's work tables (permanent: see packer.py); dropped with the schema.
WORK_TABLES = ("pack_reach", "pack_object", "pack_lock")
#: Named locks are server-wide: the database name keeps them per database.
SCHEMA_LOCK = "SELECT GET_LOCK(CONCAT('zodbsql.schema.', DATABASE()), %s)"
SCHEMA_UNLOCK = "SELECT RELEASE_LOCK(CONCAT('zodbsql.schema.', DATABASE()))"
# The row voted commits share-lock and pack batches lock for update (locker.py); added
# to databases made before it when they are opened for writing.
HAS_PACK_GATE = "SELECT 1 FROM zodbsql_meta WHERE name = 'pack_gate'"
ADD_PACK_GATE = "INSERT IGNORE INTO zodbsql_meta (name, value) VALUES ('pack_gate', '')"
#: Seconds to wait for the schema lock, or on Galera for another node's creation.
SCHEMA_WAIT = 60


class MySQLSchema(Schema):
    HISTORY_PRESERVING_DDL = HISTORY_PRESERVING_DDL
    HISTORY_FREE_DDL = HISTORY_FREE_DDL
    HISTORY_PRESERVING_BLOB_DDL = HISTORY_PRESERVING_BLOB_DDL
    HISTORY_FREE_BLOB_DDL = HISTORY_FREE_BLOB_DDL
    GONE_DDL = gone_ddl(GONE_OIDS_VIEW, TABLE_OPTIONS, "INSERT IGNORE", "LONGTEXT")
    LIST_TABLES = LIST_TABLES
    LIST_VIEWS = LIST_VIEWS

    def prepare(self, conn: ConnectionRole, keep_history: bool, create: bool,
                read_only: bool, remake: bool = False) -> None:
        self._await_creation_elsewhere(conn)
        if read_only or not create:
            super().prepare(conn, keep_history, create, read_only, remake)
        else:
            # Two processes opening an empty database at once: one creates, the other
            # waits and then finds the schema (the base re-reads the meta table under
            # the lock).
            self._take_schema_lock(conn)
            try:
                super().prepare(conn, keep_history, create, read_only, remake)
            finally:
                conn.fetchone(SCHEMA_UNLOCK)
        if not read_only and conn.fetchone(HAS_PACK_GATE) is None:
            conn.begin_write()
            try:
                conn.execute(ADD_PACK_GATE)
                conn.commit()
            except BaseException:
                conn.rollback()
                raise

    def migrate(self, conn: ConnectionRole, keep_history: bool) -> None:
        self._take_schema_lock(conn)
        try:
            meta = self.read_meta(conn) or {}
            if meta.get("schema_version") != str(MIGRATABLE_VERSION):
                return  # another process migrated it meanwhile
            conn.execute(ADD_REFS_COLUMN)
            if conn.fetchone(REFS_IS_TABLE) is not None:
                conn.execute(LONG_GROUP_CONCAT)
                conn.execute(HP_FILL_REFS if keep_history else HF_FILL_REFS)
                conn.execute(DROP_REFS_TABLE)
            conn.execute(HISTORY_PRESERVING_REFS_VIEW if keep_history
                         else HISTORY_FREE_REFS_VIEW)
            conn.begin_write()
            try:
                conn.execute(UPDATE_VERSION, (str(SCHEMA_VERSION),))
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
        finally:
            conn.fetchone(SCHEMA_UNLOCK)

    def _take_schema_lock(self, conn: ConnectionRole) -> None:
        """The named lock a process holds while it creates, checks or migrates the
        schema (a session may take it again inside: migrate under prepare)."""
        row = conn.fetchone(SCHEMA_LOCK, (SCHEMA_WAIT,))
        if not row or row[0] != 1:
            raise SchemaError(
                f"{self.backend.describe()}: another process held the schema lock for"
                f" {SCHEMA_WAIT}s (it creates or migrates the schema); nothing was changed")

    def list_tables(self, conn: ConnectionRole) -> set[str]:
        assert isinstance(conn, MySQLConnection)
        # Causal on Galera: a schema another node created is seen here.
        rows = conn.fetchall(conn.causal + LIST_TABLES)
        return {str(row[0]).lower() for row in rows} - set(WORK_TABLES)

    def read_meta(self, conn: ConnectionRole) -> dict[str, str] | None:
        assert isinstance(conn, MySQLConnection)
        if "zodbsql_meta" not in self.list_tables(conn):
            return None
        return {str(n): str(v) for n, v in conn.fetchall(conn.causal + SELECT_META)}

    def _await_creation_elsewhere(self, conn: ConnectionRole) -> None:
        """On Galera the schema lock is local to a node: while another node creates
        the schema, its tables (each CREATE replicated at once) can be here before the
        meta rows (committed at the end).  Wait for those, as the lock would."""
        assert isinstance(conn, MySQLConnection)
        deadline = time.monotonic() + SCHEMA_WAIT
        while conn.galera and self.read_meta(conn) == {} and time.monotonic() < deadline:
            time.sleep(0.2)

    def drop_all(self, conn: ConnectionRole) -> None:
        self.drop_views(conn)
        present = super().list_tables(conn)
        for table in WORK_TABLES + TABLES:
            if table in present:
                conn.execute(f"DROP TABLE {table}")
