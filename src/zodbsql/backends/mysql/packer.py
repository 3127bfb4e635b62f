"""MySQL packs with permanent work tables, one pack per database at a time.

The walk inserts into ``pack_reach`` what ``pack_reach`` doesn't hold yet; MySQL can't
open a TEMPORARY table twice in one statement, so the work tables are ordinary InnoDB
tables, created on first pack and dropped with the schema.  A named lock (released when
the pack's session ends) keeps two processes from sharing them.  The pack session runs
at READ COMMITTED, so its INSERT ... SELECTs take no shared locks on the rows they read.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from zodbsql.backends.base.contract import BackendContract, ConnectionRole
from zodbsql.backends.base.packer import Packer
from zodbsql.backends.base.statements import for_mode, in_list
from zodbsql.backends.mysql.connections import prepare_for_writing
from zodbsql.errors import DatabaseError

# A pack step holds commit_row and then deletes; a committer that voted holds its
# objects' current rows and then waits for commit_row.  So a step must never wait for a
# row lock: it locks what it deletes with SKIP LOCKED and leaves the objects a committer
# is writing for the next pack, and every delete is a join driven by the oid list in a
# TEMPORARY table (STRAIGHT_JOIN, primary key lookups), because a DELETE ... WHERE zoid
# IN (long list) may be planned as a scan that waits on every locked row of the table.
CREATE_DELETE_LIST = ("CREATE TEMPORARY TABLE IF NOT EXISTS temp_pack_delete"
                      " (zoid BIGINT NOT NULL PRIMARY KEY) ENGINE=InnoDB")
CLEAR_DELETE_LIST = "DELETE FROM temp_pack_delete"
ADD_TO_DELETE_LIST = "INSERT INTO temp_pack_delete (zoid) VALUES (%s)"
DROP_FROM_DELETE_LIST = "DELETE FROM temp_pack_delete WHERE zoid IN ({oids})"
HP_LOCK_FOR_DELETE = ("SELECT x.zoid FROM temp_pack_delete d STRAIGHT_JOIN current_object x"
                      " ON x.zoid = d.zoid ORDER BY d.zoid FOR UPDATE SKIP LOCKED")
HF_LOCK_FOR_DELETE = ("SELECT x.zoid FROM temp_pack_delete d STRAIGHT_JOIN object_state x"
                      " ON x.zoid = d.zoid ORDER BY d.zoid FOR UPDATE SKIP LOCKED")
HP_EXISTING = ("SELECT x.zoid FROM temp_pack_delete d STRAIGHT_JOIN current_object x"
               " ON x.zoid = d.zoid")
HF_EXISTING = ("SELECT x.zoid FROM temp_pack_delete d STRAIGHT_JOIN object_state x"
               " ON x.zoid = d.zoid")
HP_DELETE_OBJECTS = (
    "DELETE x FROM temp_pack_delete d STRAIGHT_JOIN blob_ref x ON x.zoid = d.zoid",
    "DELETE x FROM temp_pack_delete d STRAIGHT_JOIN object_ref x ON x.zoid = d.zoid",
    "DELETE x FROM temp_pack_delete d STRAIGHT_JOIN current_object x ON x.zoid = d.zoid",
    "DELETE x FROM temp_pack_delete d STRAIGHT_JOIN object_state x ON x.zoid = d.zoid",
)
HF_DELETE_OBJECTS = (
    "DELETE x FROM temp_pack_delete d STRAIGHT_JOIN blob_ref x ON x.zoid = d.zoid",
    "DELETE x FROM temp_pack_delete d STRAIGHT_JOIN object_ref x ON x.zoid = d.zoid",
    "DELETE x FROM temp_pack_delete d STRAIGHT_JOIN object_state x ON x.zoid = d.zoid",
)
CREATE_WORK_TABLES = (
    "CREATE TABLE IF NOT EXISTS pack_object (zoid BIGINT NOT NULL PRIMARY KEY,"
    " keep_tid BIGINT NOT NULL, old_count BIGINT NOT NULL) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS pack_reach (zoid BIGINT NOT NULL PRIMARY KEY,"
    " gen BIGINT NOT NULL, KEY pack_reach_gen (gen)) ENGINE=InnoDB",
    CREATE_DELETE_LIST,
)
PACK_LOCK = "SELECT GET_LOCK(CONCAT('zodbsql.pack.', DATABASE()), %s)"
PACK_UNLOCK = "SELECT RELEASE_LOCK(CONCAT('zodbsql.pack.', DATABASE()))"


@dataclasses.dataclass(frozen=True)
class DeleteListStatements:
    """How a pack step deletes the objects listed in ``temp_pack_delete``, per mode."""

    #: Lock the listed objects' current rows that no commit holds.
    lock: str
    #: The listed objects that exist.
    existing: str


class MySQLPacker(Packer):
    CREATE_WORK_TABLES = CREATE_WORK_TABLES
    HISTORY_PRESERVING = dataclasses.replace(Packer.HISTORY_PRESERVING,
                                             delete_objects=HP_DELETE_OBJECTS)
    HISTORY_FREE = dataclasses.replace(Packer.HISTORY_FREE, delete_objects=HF_DELETE_OBJECTS)
    DELETE_LIST_PRESERVING = DeleteListStatements(HP_LOCK_FOR_DELETE, HP_EXISTING)
    DELETE_LIST_FREE = DeleteListStatements(HF_LOCK_FOR_DELETE, HF_EXISTING)

    def __init__(self, backend: BackendContract) -> None:
        super().__init__(backend)
        self.delete_list = for_mode(self.keep_history, self.DELETE_LIST_PRESERVING,
                                    self.DELETE_LIST_FREE)

    def prepare(self, conn: ConnectionRole, pack_tid: int, gc: bool) -> None:
        timeout = self.backend.lock_timeout
        prepare_for_writing(conn, timeout)
        # Held until finish or until the pack's session ends.  Waiting (rather than
        # failing at once) also covers the previous pack's session, whose lock the
        # server frees only when it has processed that session's disconnect.
        row = conn.fetchone(PACK_LOCK, (max(1, int(timeout)),))
        if not row or row[0] != 1:
            raise DatabaseError(
                f"another process has been packing {self.backend.describe()} for more"
                f" than {timeout:g}s (commit-lock-timeout); one pack at a time")
        super().prepare(conn, pack_tid, gc)

    def delete_objects(self, conn: ConnectionRole, oids: Sequence[int]) -> None:
        conn.execute(CLEAR_DELETE_LIST)
        conn.executemany(ADD_TO_DELETE_LIST, [(oid,) for oid in oids])
        locked = {int(r[0]) for r in conn.fetchall(self.delete_list.lock)}
        if len(locked) < len(oids):
            existing = {int(r[0]) for r in conn.fetchall(self.delete_list.existing)}
            busy = sorted(existing - locked)   # rows a committer holds: skipped this time
            if busy:
                conn.execute(DROP_FROM_DELETE_LIST.format(oids=in_list(len(busy))), busy)
        for statement in self.sql.delete_objects:
            conn.execute(statement)

    def finish(self, conn: ConnectionRole, pack_tid: int) -> None:
        super().finish(conn, pack_tid)
        conn.fetchone(PACK_UNLOCK)
