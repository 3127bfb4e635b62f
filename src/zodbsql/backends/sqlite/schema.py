"""SQLite's tables.  Integers are 64-bit; tids and oids fit as signed values."""
import time

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.schema import Schema, gone_ddl
from zodbsql.errors import CommitLockTimeout

#: Seconds between tries of the switch to WAL that another connection kept from it.
SWITCH_RETRY = 0.02

COMMON_DDL = (
    "CREATE TABLE zodbsql_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE commit_row (id INTEGER PRIMARY KEY CHECK (id = 0), last_tid INTEGER NOT NULL)",
    "INSERT INTO commit_row (id, last_tid) VALUES (0, 0)",
    "CREATE TABLE oid_counter (id INTEGER PRIMARY KEY CHECK (id = 0), last_oid INTEGER NOT NULL)",
    "INSERT INTO oid_counter (id, last_oid) VALUES (0, 0)",
)
# Blob data, each distinct content once (see backends/base/blobs.py).
BLOB_CONTENT_DDL = (
    "CREATE TABLE blob_content (content_hash BLOB PRIMARY KEY, size INTEGER NOT NULL,"
    " chunks INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE blob_chunk (content_hash BLOB NOT NULL, chunk_num INTEGER NOT NULL,"
    " data BLOB NOT NULL, PRIMARY KEY (content_hash, chunk_num))",
)
HISTORY_PRESERVING_BLOB_DDL = BLOB_CONTENT_DDL + (
    "CREATE TABLE blob_ref (zoid INTEGER NOT NULL, tid INTEGER NOT NULL,"
    " content_hash BLOB NOT NULL, PRIMARY KEY (zoid, tid)) WITHOUT ROWID",
    "CREATE INDEX blob_ref_hash ON blob_ref (content_hash)",
)
HISTORY_FREE_BLOB_DDL = BLOB_CONTENT_DDL + (
    "CREATE TABLE blob_ref (zoid INTEGER PRIMARY KEY, tid INTEGER NOT NULL,"
    " content_hash BLOB NOT NULL)",
    "CREATE INDEX blob_ref_hash ON blob_ref (content_hash)",
)
# The references as rows (base/mover.py): json_each of a NULL yields none.
HISTORY_PRESERVING_REFS_VIEW = (
    "CREATE VIEW object_ref AS SELECT s.zoid AS zoid, s.tid AS tid, j.value AS to_zoid"
    " FROM object_state s, json_each(s.refs) j")
HISTORY_FREE_REFS_VIEW = (
    "CREATE VIEW object_ref AS SELECT s.zoid AS zoid, j.value AS to_zoid"
    " FROM object_state s, json_each(s.refs) j")
# The tid index names each revision's object too, so that a poll (which wants only
# those two) reads the index alone, not the row of each revision it names: a poll of
# two commits of 1,000 objects each after another process wrote them, 1.0 -> 0.6 ms.
# History-free, the table's rowid is the oid, which every index holds already.
HISTORY_PRESERVING_TID_INDEX = "CREATE INDEX object_state_tid ON object_state (tid, zoid)"
TID_INDEX_COLUMNS = "SELECT count(*) FROM pragma_index_info('object_state_tid')"
HISTORY_PRESERVING_DDL = COMMON_DDL + (
    "CREATE TABLE transactions (tid INTEGER PRIMARY KEY, packed INTEGER NOT NULL DEFAULT 0,"
    " username BLOB NOT NULL, description BLOB NOT NULL, extension BLOB NOT NULL)",
    # A rowid table: large states stay out of the (zoid, tid) b-tree.
    # data_tid: set when the state is a copy of an older revision's (undo, restore).
    # refs (the oids the state refers to, a JSON array) before the state: a row's
    # columns are read in order, and a large state's overflow pages come last.
    "CREATE TABLE object_state (zoid INTEGER NOT NULL, tid INTEGER NOT NULL,"
    " data_tid INTEGER, checksum INTEGER, state_size INTEGER NOT NULL, refs TEXT,"
    " state BLOB, PRIMARY KEY (zoid, tid))",
    HISTORY_PRESERVING_TID_INDEX,
    # No index on tid: the poll reads object_state's (base/poller.py).
    "CREATE TABLE current_object (zoid INTEGER PRIMARY KEY, tid INTEGER NOT NULL)",
    HISTORY_PRESERVING_REFS_VIEW,
) + HISTORY_PRESERVING_BLOB_DDL
HISTORY_FREE_DDL = COMMON_DDL + (
    "CREATE TABLE object_state (zoid INTEGER PRIMARY KEY, tid INTEGER NOT NULL,"
    " checksum INTEGER, state_size INTEGER NOT NULL, refs TEXT, state BLOB)",
    "CREATE INDEX object_state_tid ON object_state (tid)",
    HISTORY_FREE_REFS_VIEW,
) + HISTORY_FREE_BLOB_DDL
LIST_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
LIST_VIEWS = "SELECT name FROM sqlite_master WHERE type = 'view'"
# From version 1 (a row per reference in the table object_ref): each revision's
# references gathered into its refs column (ascending: the subquery's order), then the
# table replaced by the view.  The column comes after the state here, which only
# costs a read of a large state's overflow pages when refs is read.
ADD_REFS_COLUMN = "ALTER TABLE object_state ADD COLUMN refs TEXT"
HISTORY_PRESERVING_MIGRATION = (
    ADD_REFS_COLUMN,
    "UPDATE object_state SET refs = (SELECT '[' || group_concat(to_zoid, ',') || ']'"
    " FROM (SELECT r.to_zoid FROM object_ref r WHERE r.zoid = object_state.zoid"
    " AND r.tid = object_state.tid ORDER BY r.to_zoid))",
    "DROP TABLE object_ref",
    HISTORY_PRESERVING_REFS_VIEW,
)
HISTORY_FREE_MIGRATION = (
    ADD_REFS_COLUMN,
    "UPDATE object_state SET refs = (SELECT '[' || group_concat(to_zoid, ',') || ']'"
    " FROM (SELECT r.to_zoid FROM object_ref r WHERE r.zoid = object_state.zoid"
    " ORDER BY r.to_zoid))",
    "DROP TABLE object_ref",
    HISTORY_FREE_REFS_VIEW,
)
HAS_META = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'zodbsql_meta'"


def use_wal(conn: ConnectionRole, timeout: float) -> None:
    """Put the database in WAL mode (persistent: done once per file, outside a
    transaction).  The switch needs the file to itself, and SQLite refuses it while
    another connection reads it (processes opening a new database together), in some
    lock states at once, without its busy wait: tried again until one has switched it,
    for ``timeout`` seconds (commit-lock-timeout) and the last try's busy wait."""
    deadline = time.monotonic() + timeout
    while True:
        row = conn.fetchone("PRAGMA journal_mode")
        if not row or str(row[0]).lower() == "wal":
            return
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except CommitLockTimeout:
            if time.monotonic() >= deadline:
                raise
            time.sleep(SWITCH_RETRY)


# The deleted oids of each record as rows (base/schema.py's gone_ddl).
GONE_OIDS_VIEW = (
    "CREATE VIEW IF NOT EXISTS gone_oids AS SELECT g.seq AS seq, j.value AS zoid,"
    " g.tid AS tid FROM object_gone g, json_each(g.zoids) j")


class SQLiteSchema(Schema):
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
        super().prepare(conn, keep_history, create, read_only, remake)
        if keep_history and not read_only:
            self.widen_tid_index(conn)
        if not read_only:
            # The schema is checked (or was just created): now it's ours.
            use_wal(conn, self.backend.lock_timeout)

    def widen_tid_index(self, conn: ConnectionRole) -> None:
        """Give a history-preserving database made before the tid index named the oid
        its two-column index (an additive upgrade, once: 1.25 s for 1,067,511 revisions
        here, other writers waiting on the write lock).  Opened read-only, such a
        database polls as before, reading a row per revision."""
        if self._tid_index_columns(conn) != 1:
            return
        conn.begin_write()
        try:
            if self._tid_index_columns(conn) == 1:   # not done meanwhile
                conn.execute("DROP INDEX object_state_tid")
                conn.execute(HISTORY_PRESERVING_TID_INDEX)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise

    @staticmethod
    def _tid_index_columns(conn: ConnectionRole) -> int:
        row = conn.fetchone(TID_INDEX_COLUMNS)
        return int(row[0]) if row else 0
