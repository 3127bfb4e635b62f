"""PostgreSQL finishes a commit with one call of a server-side function, and COMMIT.

``zodbsql_finish`` (procedures_hp.sql / procedures_hf.sql, installed with the schema)
does what the portable version does in seven statements: lock ``commit_row``, allocate
the tid, record the transaction, move the staged states in.  Its call and the COMMIT
travel as one query (``FINISH_AND_COMMIT``): one round trip and one statement in the
server's log.  A commit that staged nothing has no transaction open yet, and its call
runs alone in autocommit, its own transaction: one statement in all.  (A commit whose
blob files must be placed under the tid first sends COMMIT on its own.)

Every commit leaves a row (tid, nonce) in ``commit_log``, the nonce a random number
the client sent.  When COMMIT's answer is lost, a new session makes sure the old one can
no longer commit (it is gone, or idle outside a transaction, or it is ended), then looks
for the nonce: there if and only if this very commit is durable, with its tid.  A tid
alone can't tell (a later commit may get the same tid, and history-free commits leave
no record of their own), nor can the server's transaction id after a crash.
"""
from __future__ import annotations

import secrets
import time
from typing import Mapping

from ZODB.POSException import StorageTransactionError

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.txncontrol import TransactionControl, blob_vanished
from zodbsql.backends.postgresql.connections import SESSION_STARTED, PostgreSQLConnection
from zodbsql.errors import DatabaseConflict, DatabaseError


#: The tid, and last the tid committed before it, which ``zodbsql_allocate_tid`` leaves
#: in the transaction's ``zodbsql.previous`` (read after the function has run: the select
#: list is evaluated on its result).  The history-free finish returns the tid alone, and
#: its return type stays as older processes know it (their query reads the first column).
FINISH = ("SELECT f.*, NULLIF(current_setting('zodbsql.previous', true), '')::BIGINT"
          " FROM zodbsql_finish(%s, %s, %s, %s, %s, %s, %s, %s, %s) AS f")
#: FINISH then COMMIT, as one query (its values go inline).
FINISH_AND_COMMIT = FINISH + "; COMMIT"
#: The old session, if it may still commit: alive, and not idle outside a transaction.
OLD_SESSION = ("SELECT state FROM pg_stat_activity"
               f" WHERE pid = %s AND {SESSION_STARTED} = %s")
TERMINATE = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
             f" WHERE pid = %s AND {SESSION_STARTED} = %s")
#: The commit's tid if it is in commit_log; and whether it would still be there (the
#: lowest tid it can have is within the log's window).
LOGGED = ("SELECT (SELECT tid FROM commit_log WHERE nonce = %s),"
          " %s >= (SELECT last_tid FROM commit_row) - zodbsql_commit_log_window()")
#: Seconds the old session may go on before it is terminated.
IN_PROGRESS_GRACE = 1.0
#: The SQLSTATE zodbsql_finish raises for a restored tid that is not after the last.
OUT_OF_ORDER = "ZS001"
#: The SQLSTATE zodbsql_finish raises when a staged blob content was freed meanwhile.
BLOB_VANISHED = "ZS002"
#: unique_violation: zodbsql_finish inserts the rows of the objects vote found none of
#: without ON CONFLICT, so another commit created one of them since (the same oid).
CREATED_MEANWHILE = "23505"


def vanished_oid(error: BaseException | None) -> int | None:
    """The oid ``zodbsql_finish`` names in a BLOB_VANISHED error's DETAIL (None from a
    function installed before generation 8, which named none)."""
    detail = getattr(getattr(error, "diag", None), "message_detail", None)
    return int(detail) if isinstance(detail, str) and detail.isdigit() else None


class PostgreSQLTransactionControl(TransactionControl):
    finishes_with_commit = True

    def finish(self, conn: ConnectionRole, clock_tid: int, requested_tid: int | None,
               user: bytes, description: bytes, extension: bytes, lock_timeout: float,
               has_states: bool = True, check_blobs: bool = False,
               blobs: bool = True, commit: bool = False) -> int:
        # The function moves blob references in every commit: no round trip to save.
        assert isinstance(conn, PostgreSQLConnection)
        nonce = secrets.randbits(63)
        params = (clock_tid, requested_tid, user, description, extension, has_states,
                  max(1, int(lock_timeout * 1000)), check_blobs, nonce)
        conn.commit_nonce = nonce
        conn.commit_floor = clock_tid if requested_tid is None else requested_tid
        conn.commit_previous = None
        try:
            if commit:
                query = FINISH_AND_COMMIT if conn.in_transaction else FINISH
                row = conn.fetch_and_commit(conn.inline(query, params), query, len(params))
            else:
                row = conn.fetchone(FINISH, params)
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == BLOB_VANISHED:
                raise blob_vanished(vanished_oid(exc.__cause__)) from exc
            if getattr(exc.__cause__, "sqlstate", None) == CREATED_MEANWHILE:
                raise DatabaseConflict(
                    "another commit created an object this one creates, after this one's"
                    f" vote ({exc.__cause__}); the transaction can be retried") from exc
            if getattr(exc.__cause__, "sqlstate", None) == OUT_OF_ORDER:
                raise StorageTransactionError(
                    f"{exc.__cause__} (restored transactions must come in order)") from exc
            raise
        assert row is not None
        if row[-1] is not None:
            conn.commit_previous = int(row[-1])
        return int(row[0])

    def commit_outcome(self, conn: ConnectionRole, old: ConnectionRole, tid: int | None,
                       written: Mapping[int, int | None], deadline: float) -> bool | None:
        assert isinstance(old, PostgreSQLConnection)
        old.close()
        nonce = old.commit_nonce
        if nonce is None:
            return None  # no finish ran on it: nothing to look for
        grace = time.monotonic() + IN_PROGRESS_GRACE
        while True:
            if self._logged(conn, old, nonce) is True:
                return True
            if not self._may_still_commit(conn, old):
                # It can't change the answer any more: what the log says now is final.
                return self._logged(conn, old, nonce)
            now = time.monotonic()
            if now >= deadline:
                return None
            if now >= grace:
                # It has not noticed that its client is gone, or it waits for a lock or
                # a synchronous standby: end it; the commit is then durable or not.
                conn.fetchone(TERMINATE, (old.session_id, old.session_started))
            time.sleep(0.05)

    @staticmethod
    def _may_still_commit(conn: ConnectionRole, old: PostgreSQLConnection) -> bool:
        """Is the old session still there, inside a transaction or running a query?
        (Idle outside one, it has committed or rolled back; after a restart or a
        failover it is gone, and the pid may be another session's: the start tells.)"""
        row = conn.fetchone(OLD_SESSION, (old.session_id, old.session_started))
        return row is not None and row[0] != "idle"

    @staticmethod
    def _logged(conn: ConnectionRole, old: PostgreSQLConnection, nonce: int) -> bool | None:
        """True (and ``old.commit_tid`` set) if the commit is in commit_log; False if it
        is not and would be; None if it may have left the log's window."""
        row = conn.fetchone(LOGGED, (nonce, old.commit_floor))
        assert row is not None
        if row[0] is not None:
            old.commit_tid = int(row[0])
            return True
        return False if row[1] else None
