"""PostgreSQL finishes a commit with one call of a server-side function.

``zodbsql_finish`` (procedures_hp.sql / procedures_hf.sql, installed with the schema)
does what the portable version does in seven statements: lock ``commit_row``, allocate
the tid, record the transaction, move the staged states and references.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ZODB.POSException import StorageTransactionError

from zodbsql.backends.base.txncontrol import TransactionControl, blob_vanished
from zodbsql.errors import DatabaseError

if TYPE_CHECKING:
    from zodbsql.backends.base.connections import DBConnection

FINISH = "SELECT zodbsql_finish(%s, %s, %s, %s, %s, %s, %s, %s)"
#: The SQLSTATE zodbsql_finish raises for a restored tid that is not after the last.
OUT_OF_ORDER = "ZS001"
#: The SQLSTATE zodbsql_finish raises when a staged blob content was freed meanwhile.
BLOB_VANISHED = "ZS002"


class PostgreSQLTransactionControl(TransactionControl):
    def finish(self, conn: "DBConnection", clock_tid: int, requested_tid: int | None,
               user: bytes, description: bytes, extension: bytes, lock_timeout: float,
               has_states: bool = True, check_blobs: bool = False,
               blobs: bool = True) -> int:
        # The function moves blob references in every commit: no round trip to save.
        try:
            row = conn.fetchone(FINISH, (clock_tid, requested_tid, user, description,
                                         extension, has_states,
                                         max(1, int(lock_timeout * 1000)), check_blobs))
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == BLOB_VANISHED:
                raise blob_vanished(None) from exc
            if getattr(exc.__cause__, "sqlstate", None) == OUT_OF_ORDER:
                raise StorageTransactionError(
                    f"{exc.__cause__} (restored transactions must come in order)") from exc
            raise
        assert row is not None
        return int(row[0])
