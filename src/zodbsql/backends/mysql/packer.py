"""MySQL packs with permanent work tables, one pack per database at a time.

The walk inserts into ``pack_reach`` what ``pack_reach`` doesn't hold yet; MySQL can't
open a TEMPORARY table twice in one statement, so the work tables are ordinary InnoDB
tables, created on first pack and dropped with the schema.  A named lock (released when
the pack's session ends) keeps two processes from sharing them; on Galera, where it
holds on one node only, a row of ``pack_lock`` locked on every node does too.  The pack session runs
at READ COMMITTED, so its INSERT ... SELECTs take no shared locks on the rows they read.
"""
from __future__ import annotations

import dataclasses
import os
import socket
from typing import Sequence

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.packer import Packer
from zodbsql.backends.mysql.connections import MySQLConnection, prepare_for_writing
from zodbsql.errors import CommitLockTimeout, DatabaseConflict, DatabaseError

# A pack step holds commit_row and then deletes; a committer that voted holds its
# objects' current rows and then waits for commit_row.  So a step must never wait for a
# row lock: before commit_row, it locks the rows it may delete with SKIP LOCKED
# (MySQLLocker.lock_for_pack) and leaves the objects a committer is writing for the next
# pack; and every delete is a join driven by the oid list in a TEMPORARY table
# (STRAIGHT_JOIN, primary key lookups), because a DELETE ... WHERE zoid IN (long list)
# may be planned as a scan that waits on every locked row of the table.
CREATE_DELETE_LIST = ("CREATE TEMPORARY TABLE IF NOT EXISTS temp_pack_delete"
                      " (zoid BIGINT NOT NULL PRIMARY KEY) ENGINE=InnoDB")
CLEAR_DELETE_LIST = "DELETE FROM temp_pack_delete"
ADD_TO_DELETE_LIST = "INSERT INTO temp_pack_delete (zoid) VALUES (%s)"
HP_DELETE_OBJECTS = (
    "DELETE x FROM temp_pack_delete d STRAIGHT_JOIN blob_ref x ON x.zoid = d.zoid",
    "DELETE x FROM temp_pack_delete d STRAIGHT_JOIN current_object x ON x.zoid = d.zoid",
    "DELETE x FROM temp_pack_delete d STRAIGHT_JOIN object_state x ON x.zoid = d.zoid",
)
HF_DELETE_OBJECTS = (
    "DELETE x FROM temp_pack_delete d STRAIGHT_JOIN blob_ref x ON x.zoid = d.zoid",
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
# Galera: the pack lock is a row held by an open transaction whose every changed row is
# replicated at once (streaming replication), so it is locked on every node.
CREATE_PACK_LOCK = ("CREATE TABLE IF NOT EXISTS pack_lock (id TINYINT NOT NULL PRIMARY KEY,"
                    " holder VARCHAR(255) NOT NULL) ENGINE=InnoDB")
HAS_PACK_LOCK_ROW = "SELECT 1 FROM pack_lock WHERE id = 0"
ADD_PACK_LOCK_ROW = "INSERT IGNORE INTO pack_lock (id, holder) VALUES (0, '')"
STREAM_EACH_ROW = ("SET SESSION wsrep_trx_fragment_unit = 'rows'",
                   "SET SESSION wsrep_trx_fragment_size = 1")
TAKE_PACK_LOCK_ROW = "UPDATE pack_lock SET holder = %s WHERE id = 0"


class MySQLPacker(Packer):
    CREATE_WORK_TABLES = CREATE_WORK_TABLES
    HISTORY_PRESERVING = dataclasses.replace(Packer.HISTORY_PRESERVING,
                                             delete_objects=HP_DELETE_OBJECTS)
    HISTORY_FREE = dataclasses.replace(Packer.HISTORY_FREE, delete_objects=HF_DELETE_OBJECTS)

    def prepare(self, conn: ConnectionRole, pack_tid: int, gc: bool) -> None:
        timeout = self.backend.lock_timeout
        prepare_for_writing(conn, timeout)
        # Held until finish or until the pack's session ends.  Waiting (rather than
        # failing at once) also covers the previous pack's session, whose lock the
        # server frees only when it has processed that session's disconnect.
        row = conn.fetchone(PACK_LOCK, (max(1, int(timeout)),))
        if not row or row[0] != 1:
            raise self._busy(timeout)
        assert isinstance(conn, MySQLConnection)
        if conn.galera:
            self._lock_cluster(conn, timeout)
        super().prepare(conn, pack_tid, gc)

    def _busy(self, timeout: float) -> DatabaseError:
        return DatabaseError(
            f"another process has been packing {self.backend.describe()} for more"
            f" than {timeout:g}s (commit-lock-timeout); one pack at a time")

    def _lock_cluster(self, conn: MySQLConnection, timeout: float) -> None:
        """GET_LOCK holds on one Galera node only: lock the pack_lock row from a
        companion session that streams its changes, which locks the row on every node,
        until the pack's session ends (or its node leaves the cluster)."""
        conn.execute(CREATE_PACK_LOCK)
        if not conn.fetchone(conn.causal + HAS_PACK_LOCK_ROW):
            conn.execute(ADD_PACK_LOCK_ROW)  # waits for nobody: no pack holds it yet
        lock = self.backend.connect()
        assert isinstance(lock, MySQLConnection)
        conn.companion = lock
        for statement in STREAM_EACH_ROW:
            lock.execute(statement)
        lock.set_lock_timeout(timeout)
        lock.begin_write()
        try:
            lock.execute(lock.causal + TAKE_PACK_LOCK_ROW,
                         (f"pid {os.getpid()} on {socket.gethostname()}",))
        except (CommitLockTimeout, DatabaseConflict) as exc:
            conn.companion = None
            lock.close()
            raise self._busy(timeout) from exc

    def delete_objects(self, conn: ConnectionRole, oids: Sequence[int]) -> None:
        # ``oids`` are rows this transaction locked already (lock_for_pack).
        conn.execute(CLEAR_DELETE_LIST)
        conn.executemany(ADD_TO_DELETE_LIST, [(oid,) for oid in oids])
        for statement in self.sql.delete_objects:
            conn.execute(statement)

    def finish(self, conn: ConnectionRole, pack_tid: int) -> None:
        super().finish(conn, pack_tid)
        conn.fetchone(PACK_UNLOCK)
        assert isinstance(conn, MySQLConnection)
        if conn.companion is not None:
            conn.companion.close()  # rolled back: the row is free on every node
            conn.companion = None
