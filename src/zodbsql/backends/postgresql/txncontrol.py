"""PostgreSQL finishes a commit with one call of a server-side function.

``zodbsql_finish`` (procedures_hp.sql / procedures_hf.sql, installed with the schema)
does what the portable version does in seven statements: lock ``commit_row``, allocate
the tid, record the transaction, move the staged states and references.  The same
statement reads the transaction's id (``txid_current()``): when COMMIT is lost on the
wire, the server's own record of that id (``txid_status``) says whether it committed.
A history-free commit also leaves a row (tid, nonce) in ``commit_log``: after a crash or
a failover the xid may have been given to another transaction, and later commits may
have replaced every state this one wrote, but the random nonce is this commit's alone.
"""
from __future__ import annotations

import secrets
import time
from typing import Mapping

from ZODB.POSException import StorageTransactionError

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.txncontrol import TransactionControl, blob_vanished
from zodbsql.backends.postgresql.connections import PostgreSQLConnection
from zodbsql.errors import DatabaseConflict, DatabaseError


FINISH = "SELECT zodbsql_finish(%s, %s, %s, %s, %s, %s, %s, %s), txid_current()"
FINISH_LOGGED = ("SELECT zodbsql_finish(%s, %s, %s, %s, %s, %s, %s, %s, %s), txid_current()")
#: Is the commit in commit_log, and may it still be (its tid within the log's window)?
LOGGED = ("SELECT EXISTS (SELECT 1 FROM commit_log WHERE tid = %s AND nonce = %s),"
          " %s >= (SELECT last_tid FROM commit_row) - zodbsql_commit_log_window()")
TXID_STATUS = "SELECT txid_status(%s)"
TERMINATE = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
             " WHERE pid = %s AND backend_xid = %s::xid")
#: Seconds a COMMIT may stay "in progress" before its old session is terminated.
IN_PROGRESS_GRACE = 1.0
#: The SQLSTATE zodbsql_finish raises for a restored tid that is not after the last.
OUT_OF_ORDER = "ZS001"
#: The SQLSTATE zodbsql_finish raises when a staged blob content was freed meanwhile.
BLOB_VANISHED = "ZS002"
#: unique_violation: zodbsql_finish inserts the rows of the objects vote found none of
#: without ON CONFLICT, so another commit created one of them since (the same oid).
CREATED_MEANWHILE = "23505"


class PostgreSQLTransactionControl(TransactionControl):
    def finish(self, conn: ConnectionRole, clock_tid: int, requested_tid: int | None,
               user: bytes, description: bytes, extension: bytes, lock_timeout: float,
               has_states: bool = True, check_blobs: bool = False,
               blobs: bool = True) -> int:
        # The function moves blob references in every commit: no round trip to save.
        params: tuple[object, ...] = (clock_tid, requested_tid, user, description, extension,
                                      has_states, max(1, int(lock_timeout * 1000)),
                                      check_blobs)
        nonce = None if self.backend.keep_history else secrets.randbits(63)
        try:
            if nonce is None:
                row = conn.fetchone(FINISH, params)
            else:
                row = conn.fetchone(FINISH_LOGGED, (*params, nonce))
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == BLOB_VANISHED:
                raise blob_vanished(None) from exc
            if getattr(exc.__cause__, "sqlstate", None) == CREATED_MEANWHILE:
                raise DatabaseConflict(
                    "another commit created an object this one creates, after this one's"
                    f" vote ({exc.__cause__}); the transaction can be retried") from exc
            if getattr(exc.__cause__, "sqlstate", None) == OUT_OF_ORDER:
                raise StorageTransactionError(
                    f"{exc.__cause__} (restored transactions must come in order)") from exc
            raise
        assert row is not None and isinstance(conn, PostgreSQLConnection)
        conn.commit_xid = int(row[1])
        conn.commit_nonce = nonce
        return int(row[0])

    def commit_outcome(self, conn: ConnectionRole, old: ConnectionRole, tid: int,
                       written: Mapping[int, int | None], deadline: float) -> bool | None:
        xid = old.commit_xid if isinstance(old, PostgreSQLConnection) else None
        nonce = old.commit_nonce if isinstance(old, PostgreSQLConnection) else None
        old.close()
        if xid is None:
            return super().commit_outcome(conn, old, tid, written, deadline)
        grace = time.monotonic() + IN_PROGRESS_GRACE
        while True:
            try:
                row = conn.fetchone(TXID_STATUS, (xid,))
            except DatabaseError:
                # "in the future": the server crashed and restarted, and its xid counter
                # went back past ours, so ours never reached the disk.  The data tells.
                return self._logged_or_data(conn, old, tid, nonce, written, deadline)
            status = row[0] if row else None
            if status == "aborted":
                # Ours, or (after a crash) a later transaction given the same xid: either
                # way ours is not durable.
                return False
            if status != "in progress":
                # Committed, or forgotten.  After a crash a later transaction may have
                # been given the same xid, so commit_log or the data confirms it is
                # this commit.
                return self._logged_or_data(conn, old, tid, nonce, written, deadline)
            # In progress: the old session has not finished COMMIT (or not noticed that
            # its client is gone).  End it (only if it still runs this very transaction:
            # after a restart its pid may belong to someone else); the commit is then
            # durable or rolled back.
            now = time.monotonic()
            if now >= deadline:
                return None
            if now >= grace and old.session_id is not None:
                conn.fetchone(TERMINATE, (old.session_id, str(xid & 0xFFFFFFFF)))
            time.sleep(0.05)

    def _logged_or_data(self, conn: ConnectionRole, old: ConnectionRole, tid: int,
                        nonce: int | None, written: Mapping[int, int | None],
                        deadline: float) -> bool | None:
        """The old session can no longer commit: is this commit durable?  A history-free
        commit is looked up in commit_log (exact); otherwise the data tells."""
        if nonce is not None:
            row = conn.fetchone(LOGGED, (tid, nonce, tid))
            assert row is not None
            if row[0]:
                return True
            if row[1]:
                return False  # the log would hold it
        return super().commit_outcome(conn, old, tid, written, deadline)
