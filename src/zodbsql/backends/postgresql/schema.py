"""PostgreSQL's tables: BIGINT oids and tids, BYTEA states, oids from a sequence.

Only the tables of the current schema (``search_path``) count, so several zodbsql
databases can live side by side in one PostgreSQL database, one schema each.
"""
from __future__ import annotations

from importlib import resources
from typing import Any

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.schema import Schema, gone_ddl
from zodbsql.errors import SchemaError


COMMON_DDL = (
    "CREATE TABLE zodbsql_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE commit_row (id INTEGER PRIMARY KEY CHECK (id = 0), last_tid BIGINT NOT NULL)",
    "INSERT INTO commit_row (id, last_tid) VALUES (0, 0)",
    # Oids come from zoid_seq (see oidalloc.py): nextval never blocks and is never undone.
    "CREATE SEQUENCE zoid_seq START WITH 1 MINVALUE 0",
)
# Blob data, each distinct content once (see backends/base/blobs.py).
BLOB_CONTENT_DDL = (
    "CREATE TABLE blob_content (content_hash BYTEA PRIMARY KEY, size BIGINT NOT NULL,"
    " chunks INTEGER NOT NULL)",
    "CREATE TABLE blob_chunk (content_hash BYTEA NOT NULL, chunk_num INTEGER NOT NULL,"
    " data BYTEA NOT NULL, PRIMARY KEY (content_hash, chunk_num))",
    # Chunks are compressed already or not worth compressing; keep them out of line.
    "ALTER TABLE blob_chunk ALTER COLUMN data SET STORAGE EXTERNAL",
)
HISTORY_PRESERVING_BLOB_DDL = BLOB_CONTENT_DDL + (
    "CREATE TABLE blob_ref (zoid BIGINT NOT NULL, tid BIGINT NOT NULL,"
    " content_hash BYTEA NOT NULL, PRIMARY KEY (zoid, tid))",
    "CREATE INDEX blob_ref_hash ON blob_ref (content_hash)",
)
HISTORY_FREE_BLOB_DDL = BLOB_CONTENT_DDL + (
    "CREATE TABLE blob_ref (zoid BIGINT PRIMARY KEY, tid BIGINT NOT NULL,"
    " content_hash BYTEA NOT NULL)",
    "CREATE INDEX blob_ref_hash ON blob_ref (content_hash)",
)
# The references as rows: each revision's array unnested (a NULL: none).  A view is
# inlined into the query, so a condition on zoid reaches object_state's primary key.
HISTORY_PRESERVING_REFS_VIEW = (
    "CREATE VIEW object_ref AS SELECT s.zoid, s.tid, r.to_zoid FROM object_state s"
    " CROSS JOIN LATERAL unnest(s.refs) AS r (to_zoid)")
HISTORY_FREE_REFS_VIEW = (
    "CREATE VIEW object_ref AS SELECT s.zoid, r.to_zoid FROM object_state s"
    " CROSS JOIN LATERAL unnest(s.refs) AS r (to_zoid)")
HISTORY_PRESERVING_DDL = COMMON_DDL + (
    "CREATE TABLE transactions (tid BIGINT PRIMARY KEY, packed INTEGER NOT NULL DEFAULT 0,"
    " username BYTEA NOT NULL, description BYTEA NOT NULL, extension BYTEA NOT NULL)",
    # data_tid: set when the state is a copy of an older revision's (undo, restore).
    # refs: the oids the state refers to, ascending (base/mover.py).
    "CREATE TABLE object_state (zoid BIGINT NOT NULL, tid BIGINT NOT NULL,"
    " data_tid BIGINT, checksum BIGINT, state_size BIGINT NOT NULL, refs BIGINT[],"
    " state BYTEA, PRIMARY KEY (zoid, tid))",
    "CREATE INDEX object_state_tid ON object_state (tid)",
    # No index on tid (the poll reads object_state's), and room on each page
    # (fillfactor 70): a commit's update of an object's row is then HOT, written beside
    # the old one with no index entry.
    "CREATE TABLE current_object (zoid BIGINT PRIMARY KEY, tid BIGINT NOT NULL)"
    " WITH (fillfactor = 70)",
    HISTORY_PRESERVING_REFS_VIEW,
) + HISTORY_PRESERVING_BLOB_DDL
# A database's record of recent commits (procedures_hf.sql says why).  IF NOT EXISTS:
# databases made before it get it when their procedures are installed again.
COMMIT_LOG_DDL = ("CREATE TABLE IF NOT EXISTS commit_log (tid BIGINT NOT NULL,"
                  " nonce BIGINT NOT NULL, PRIMARY KEY (tid, nonce))")
HISTORY_FREE_DDL = COMMON_DDL + (
    "CREATE TABLE object_state (zoid BIGINT PRIMARY KEY, tid BIGINT NOT NULL,"
    " checksum BIGINT, state_size BIGINT NOT NULL, refs BIGINT[], state BYTEA)",
    "CREATE INDEX object_state_tid ON object_state (tid)",
    HISTORY_FREE_REFS_VIEW,
) + HISTORY_FREE_BLOB_DDL
# The catalogs, not information_schema: its views cost the server about 2 ms a query,
# and every storage that opens asks them (a process opening storages often, ZODB's race
# tests, pays it each time).  Tables: plain, partitioned, foreign; views and
# materialized views, as "not zodbsql's" things beside which no schema is added.
IN_CURRENT_SCHEMA = "(SELECT oid FROM pg_namespace WHERE nspname = current_schema())"
LIST_TABLES = ("SELECT relname FROM pg_class WHERE relkind IN ('r', 'p', 'f', 'v', 'm')"
               f" AND relnamespace = {IN_CURRENT_SCHEMA}")
LIST_VIEWS = ("SELECT relname FROM pg_class WHERE relkind = 'v'"
              f" AND relnamespace = {IN_CURRENT_SCHEMA}")
# From version 1 (a row per reference in the table object_ref), in one transaction.
ADD_REFS_COLUMN = "ALTER TABLE object_state ADD COLUMN refs BIGINT[]"
HISTORY_PRESERVING_MIGRATION = (
    ADD_REFS_COLUMN,
    "UPDATE object_state s SET refs = r.refs FROM (SELECT zoid, tid,"
    " array_agg(to_zoid ORDER BY to_zoid) AS refs FROM object_ref GROUP BY zoid, tid) r"
    " WHERE s.zoid = r.zoid AND s.tid = r.tid",
    "DROP TABLE object_ref",
    HISTORY_PRESERVING_REFS_VIEW,
)
HISTORY_FREE_MIGRATION = (
    ADD_REFS_COLUMN,
    "UPDATE object_state s SET refs = r.refs FROM (SELECT zoid,"
    " array_agg(to_zoid ORDER BY to_zoid) AS refs FROM object_ref GROUP BY zoid) r"
    " WHERE s.zoid = r.zoid",
    "DROP TABLE object_ref",
    HISTORY_FREE_REFS_VIEW,
)
HAS_SEQUENCE = ("SELECT 1 FROM pg_class WHERE relkind = 'S' AND relname = 'zoid_seq'"
                f" AND relnamespace = {IN_CURRENT_SCHEMA}")
DROP_FINISH = ("DROP FUNCTION IF EXISTS zodbsql_finish(BIGINT, BIGINT, BYTEA, BYTEA, BYTEA,"
               " BOOLEAN, INTEGER, BOOLEAN)")
# The history-free finish function, which takes the commit's nonce (commit_log).
DROP_NONCE_FINISH = ("DROP FUNCTION IF EXISTS zodbsql_finish(BIGINT, BIGINT, BYTEA, BYTEA,"
                     " BYTEA, BOOLEAN, INTEGER, BOOLEAN, BIGINT)")
DROP_ALLOCATE_TID = "DROP FUNCTION IF EXISTS zodbsql_allocate_tid(BIGINT, BIGINT, INTEGER, BOOLEAN)"
DROP_LOCK_OBJECTS = "DROP FUNCTION IF EXISTS zodbsql_lock_objects(BIGINT[], BIGINT[])"
DROP_STAGE_AND_LOCK = ("DROP FUNCTION IF EXISTS zodbsql_stage_and_lock(BIGINT[], BIGINT[],"
                       " BIGINT[], BIGINT[], BIGINT[], BYTEA[], TEXT[], BIGINT[], BIGINT[])")
# Schema version 1's, which staged the references as rows: dropped when the procedures
# are installed again, so a process of an older zodbsql fails its vote instead of
# committing states without their references.
DROP_ROWS_STAGE_AND_LOCK = ("DROP FUNCTION IF EXISTS zodbsql_stage_and_lock(BIGINT[],"
                            " BIGINT[], BIGINT[], BIGINT[], BIGINT[], BYTEA[], BIGINT[],"
                            " BIGINT[], BIGINT[], BIGINT[])")
DROP_CHANNEL = "DROP FUNCTION IF EXISTS zodbsql_channel()"
DROP_LOG_WINDOW = "DROP FUNCTION IF EXISTS zodbsql_commit_log_window()"
DROP_PACK_GATE = "DROP FUNCTION IF EXISTS zodbsql_pack_gate()"
#: The generation markers, older ones first (an older one is dropped when the
#: procedures are installed again).
DROP_OLD_GENERATIONS = ("DROP FUNCTION IF EXISTS zodbsql_procedures_2()",
                        "DROP FUNCTION IF EXISTS zodbsql_procedures_3()",
                        "DROP FUNCTION IF EXISTS zodbsql_procedures_4()",
                        "DROP FUNCTION IF EXISTS zodbsql_procedures_5()",
                        "DROP FUNCTION IF EXISTS zodbsql_procedures_6()",
                        "DROP FUNCTION IF EXISTS zodbsql_procedures_7()")
DROP_GENERATION = "DROP FUNCTION IF EXISTS zodbsql_procedures_8()"
#: The procedures, which are installed together; the newest (``zodbsql_procedures_8``,
#: which only names their generation) comes with the current bodies of the others.  One
#: missing means a database made by an older zodbsql (or damaged), whose procedures are
#: installed again.
PROCEDURES = ("zodbsql_pack_gate", "zodbsql_commit_log_window", "zodbsql_channel",
              "zodbsql_allocate_tid", "zodbsql_finish", "zodbsql_lock_objects",
              "zodbsql_stage_and_lock", "zodbsql_procedures_8")
HAS_CURRENT_PROCEDURES = (
    f"SELECT 1 FROM pg_proc WHERE pronamespace = {IN_CURRENT_SCHEMA} AND proname = ANY(%s)"
    " HAVING count(DISTINCT proname) = %s")
# The finish function of databases made before blobs (one argument fewer).
DROP_OLD_FINISH = ("DROP FUNCTION IF EXISTS zodbsql_finish(BIGINT, BIGINT, BYTEA, BYTEA,"
                   " BYTEA, BOOLEAN, INTEGER)")
# Serialises schema creation between processes (the key is arbitrary but fixed).
CURRENT_SCHEMA = "SELECT current_schema()"
CREATE_LOCK = "SELECT pg_advisory_xact_lock(hashtext('zodbsql:create:' || current_schema()))"


# The deleted oids of each record as rows (base/schema.py's gone_ddl).
GONE_OIDS_VIEW = (
    "CREATE OR REPLACE VIEW gone_oids AS SELECT g.seq, u.zoid, g.tid FROM object_gone g"
    " CROSS JOIN LATERAL unnest(translate(g.zoids, '[]', '{}')::BIGINT[]) AS u (zoid)")


class PostgreSQLSchema(Schema):
    GONE_DDL = gone_ddl(GONE_OIDS_VIEW)
    HISTORY_PRESERVING_DDL = HISTORY_PRESERVING_DDL
    HISTORY_FREE_DDL = HISTORY_FREE_DDL
    HISTORY_PRESERVING_BLOB_DDL = HISTORY_PRESERVING_BLOB_DDL
    HISTORY_FREE_BLOB_DDL = HISTORY_FREE_BLOB_DDL
    LIST_TABLES = LIST_TABLES
    LIST_VIEWS = LIST_VIEWS
    HISTORY_PRESERVING_MIGRATION = HISTORY_PRESERVING_MIGRATION
    HISTORY_FREE_MIGRATION = HISTORY_FREE_MIGRATION

    def prepare(self, conn: ConnectionRole, keep_history: bool, create: bool,
                read_only: bool, remake: bool = False) -> None:
        # A search_path naming no existing schema leaves current_schema() NULL: say
        # so, instead of finding "no tables" or failing to create them.
        row = conn.fetchone(CURRENT_SCHEMA)
        if row is None or row[0] is None:
            backend: Any = self.backend
            named = backend.options.schema
            what = (f"schema {named!r} does not exist; create it first" if named else
                    "no schema of the search_path exists; create one first")
            raise SchemaError(f"{backend.describe()}: {what} (CREATE SCHEMA), zodbsql"
                              " creates tables, not schemas")
        super().prepare(conn, keep_history, create, read_only, remake)
        if not read_only and conn.fetchone(
                HAS_CURRENT_PROCEDURES, (list(PROCEDURES), len(PROCEDURES))) is None:
            # A database made before vote locked in one call, before commits were
            # announced (listener.py), before commit_log, before the pack gate or
            # before vote staged and locked in one call, or before generation 2, 3
            # (rows found through arrays of oids), 4 (new objects' rows inserted
            # plainly), 5 (references a column of the state), 6 (history-preserving
            # commits in commit_log), 7 (history-free deletions recorded) or 8 (a
            # freed blob content named by its oid): install them again
            # (all are CREATE OR REPLACE, so reinstalling them is harmless).
            conn.begin_write()
            try:
                conn.execute(CREATE_LOCK)
                self.install_procedures(conn, keep_history)
                conn.commit()
            except BaseException:
                conn.rollback()
                raise

    def create(self, conn: ConnectionRole, keep_history: bool) -> None:
        conn.execute(CREATE_LOCK)
        if self.read_meta(conn) is not None:
            return  # another process created it while this one waited for the lock
        super().create(conn, keep_history)
        self.install_procedures(conn, keep_history)

    def lock_schema(self, conn: ConnectionRole) -> None:
        conn.execute(CREATE_LOCK)

    def install_procedures(self, conn: ConnectionRole, keep_history: bool) -> None:
        mode = "procedures_hp.sql" if keep_history else "procedures_hf.sql"
        conn.execute(COMMIT_LOG_DDL)
        if not keep_history:
            conn.execute(DROP_FINISH)  # the one before commit_log, without the nonce
        for older in DROP_OLD_GENERATIONS:
            conn.execute(older)
        conn.execute(DROP_ROWS_STAGE_AND_LOCK)
        files = resources.files(__package__)
        for procedures in ("procedures_common.sql", mode):
            conn.execute_script(files.joinpath(procedures).read_text())
        current = "current_object" if keep_history else "object_state"
        lock = files.joinpath("procedures_lock.sql").read_text()
        conn.execute_script(lock.replace("{current}", current))

    def add_blob_tables(self, conn: ConnectionRole, keep_history: bool) -> None:
        conn.execute(CREATE_LOCK)
        if "blob_ref" in self.list_tables(conn):
            return
        super().add_blob_tables(conn, keep_history)
        conn.execute(DROP_OLD_FINISH)
        self.install_procedures(conn, keep_history)

    def drop_all(self, conn: ConnectionRole) -> None:
        super().drop_all(conn)
        conn.execute(DROP_FINISH)
        conn.execute(DROP_NONCE_FINISH)
        conn.execute(DROP_LOG_WINDOW)
        conn.execute(DROP_PACK_GATE)
        conn.execute(DROP_ALLOCATE_TID)
        conn.execute(DROP_STAGE_AND_LOCK)  # before the function it calls
        conn.execute(DROP_ROWS_STAGE_AND_LOCK)
        conn.execute(DROP_LOCK_OBJECTS)
        conn.execute(DROP_CHANNEL)
        conn.execute(DROP_GENERATION)
        for older in DROP_OLD_GENERATIONS:
            conn.execute(older)
        if conn.fetchone(HAS_SEQUENCE) is not None:
            conn.execute("DROP SEQUENCE zoid_seq")
