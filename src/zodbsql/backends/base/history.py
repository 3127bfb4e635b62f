"""History: transaction metadata, the undo log, revisions of one object, iteration.

Only the history-preserving schema has a ``transactions`` table; in history-free mode
iteration groups the current states by the tid that wrote them.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Iterator

from zodbsql.backends.base.contract import (BackendContract, ConnectionRole, CurrentRecord,
                                            HistoryEntry, IteratedRecord, StateRow,
                                            TransactionHeader, UndoEntry, WrittenState)
from zodbsql.backends.base.mover import opened, state_row
from zodbsql.backends.base.statements import for_mode

SET_COMMIT_ROW = "UPDATE commit_row SET last_tid = %s"
INSERT_TRANSACTION = (
    "INSERT INTO transactions (tid, packed, username, description, extension)"
    " VALUES (%s, %s, %s, %s, %s)")
OBJECT_HISTORY = (
    "SELECT s.tid, s.state_size, t.username, t.description, t.extension"
    " FROM object_state s JOIN transactions t ON t.tid = s.tid"
    " WHERE s.zoid = %s ORDER BY s.tid DESC LIMIT %s")
HF_OBJECT_HISTORY = "SELECT tid, state_size FROM object_state WHERE zoid = %s"
UNDO_LOG = (
    "SELECT tid, username, description, extension FROM transactions"
    " WHERE packed = 0 AND tid > %s ORDER BY tid DESC LIMIT %s OFFSET %s")
TRANSACTION_INFO = "SELECT packed FROM transactions WHERE tid = %s"
TRANSACTION_STATES = (
    "SELECT zoid, checksum, state FROM object_state WHERE tid = %s ORDER BY zoid")
STATE_BEFORE = (
    "SELECT tid, checksum, state FROM object_state WHERE zoid = %s AND tid < %s"
    " ORDER BY tid DESC LIMIT 1")
ITER_TRANSACTIONS = (
    "SELECT tid, packed, username, description, extension FROM transactions"
    " WHERE tid >= %s AND tid <= %s ORDER BY tid LIMIT %s")
HP_ITER_RECORDS = "SELECT zoid, state, data_tid FROM object_state WHERE tid = %s ORDER BY zoid"
HF_ITER_TIDS = "SELECT DISTINCT tid FROM object_state WHERE tid >= %s AND tid <= %s ORDER BY tid LIMIT %s"
HF_ITER_RECORDS = "SELECT zoid, state, NULL FROM object_state WHERE tid = %s ORDER BY zoid"
HP_CURRENT_RECORDS = (
    "SELECT c.zoid, c.tid, s.state FROM current_object c"
    " JOIN object_state s ON s.zoid = c.zoid AND s.tid = c.tid"
    " WHERE c.zoid > %s AND s.state IS NOT NULL ORDER BY c.zoid LIMIT %s")
HF_CURRENT_RECORDS = (
    "SELECT zoid, tid, state FROM object_state WHERE zoid > %s ORDER BY zoid LIMIT %s")
# Objects whose current revision refers to an oid ("who references this object").  No
# index leads from a reference back to its referrer (commits would pay an entry per
# reference for it), so this reads the whole reference table: a tool's question, not a
# load's.
HP_REFERRERS = (
    "SELECT r.zoid FROM object_ref r JOIN current_object c ON c.zoid = r.zoid AND c.tid = r.tid"
    " WHERE r.to_zoid = %s ORDER BY r.zoid")
HF_REFERRERS = "SELECT zoid FROM object_ref WHERE to_zoid = %s ORDER BY zoid"
META_GET = "SELECT value FROM zodbsql_meta WHERE name = %s"
META_DELETE = "DELETE FROM zodbsql_meta WHERE name = %s"
META_INSERT = "INSERT INTO zodbsql_meta (name, value) VALUES (%s, %s)"
META_UPDATE = "UPDATE zodbsql_meta SET value = %s WHERE name = %s"
#: Inserts unless the name has a row: waits for another transaction inserting the same
#: name, and then inserts nothing if that one committed (PostgreSQL and SQLite).
META_ADD = ("INSERT INTO zodbsql_meta (name, value) VALUES (%s, %s)"
            " ON CONFLICT (name) DO NOTHING")

MAX_TID = (1 << 63) - 1


def _bytes(value: Any) -> bytes:
    return bytes(value) if value is not None else b""


def _header(row: tuple[Any, ...]) -> TransactionHeader:
    tid, packed, user, description, extension = row
    return TransactionHeader(int(tid), bool(packed), _bytes(user), _bytes(description),
                             _bytes(extension))


@dataclasses.dataclass(frozen=True, kw_only=True)
class HistoryStatements:
    """The history role's statements in one history mode ("": none in this mode)."""

    set_commit_row: str = SET_COMMIT_ROW
    meta_get: str = META_GET
    meta_delete: str = META_DELETE
    meta_insert: str = META_INSERT
    meta_add: str = META_ADD
    meta_update: str = META_UPDATE
    #: The transactions table (history-preserving only).
    insert_transaction: str = ""
    undo_log: str = ""
    transaction_info: str = ""
    transaction_states: str = ""
    state_before: str = ""
    #: ``(tid, size, user, description, extension)``; history-free ``(tid, size)``.
    object_history: str
    current_records: str
    referrers: str
    #: The transactions in a tid range; history-free: the tids of the current states.
    iter_transactions: str
    iter_records: str


class History:
    """Transaction metadata and the reads of history, undo and iteration (a
    ``HistoryRole``)."""

    HISTORY_PRESERVING: ClassVar[HistoryStatements] = HistoryStatements(
        insert_transaction=INSERT_TRANSACTION, undo_log=UNDO_LOG,
        transaction_info=TRANSACTION_INFO, transaction_states=TRANSACTION_STATES,
        state_before=STATE_BEFORE, object_history=OBJECT_HISTORY,
        current_records=HP_CURRENT_RECORDS, referrers=HP_REFERRERS,
        iter_transactions=ITER_TRANSACTIONS, iter_records=HP_ITER_RECORDS)
    HISTORY_FREE: ClassVar[HistoryStatements] = HistoryStatements(
        object_history=HF_OBJECT_HISTORY, current_records=HF_CURRENT_RECORDS,
        referrers=HF_REFERRERS, iter_transactions=HF_ITER_TIDS, iter_records=HF_ITER_RECORDS)

    def __init__(self, backend: BackendContract) -> None:
        self.backend = backend
        self.keep_history = backend.keep_history
        self.sql = for_mode(self.keep_history, self.HISTORY_PRESERVING, self.HISTORY_FREE)

    # -- the commit row: the tid clock (read by the poller) ------------------------------------
    def record_commit(self, conn: ConnectionRole, tid: int, user: bytes, description: bytes,
                      extension: bytes) -> None:
        conn.execute(self.sql.set_commit_row, (tid,))
        if self.keep_history:
            conn.execute(self.sql.insert_transaction, (tid, 0, user, description, extension))

    # -- meta values (pack time) ---------------------------------------------------------------
    def get_meta(self, conn: ConnectionRole, name: str) -> str | None:
        row = conn.fetchone(self.sql.meta_get, (name,))
        return str(row[0]) if row else None

    def set_meta(self, conn: ConnectionRole, name: str, value: str) -> None:
        conn.execute(self.sql.meta_delete, (name,))
        conn.execute(self.sql.meta_insert, (name, value))

    def add_meta(self, conn: ConnectionRole, name: str, value: str) -> None:
        """Record ``name`` as ``value`` unless it has a value (in a write transaction).
        Another transaction recording the same name is waited for, and wins if it
        commits: ``get_meta`` after it, in the same transaction, reads the winner's."""
        conn.execute(self.sql.meta_add, (name, value))

    def update_meta(self, conn: ConnectionRole, name: str, value: str) -> None:
        """Change the value ``name`` has (in a write transaction): unlike ``set_meta``'s
        delete and insert, two transactions doing it at once don't collide on the key."""
        conn.execute(self.sql.meta_update, (value, name))

    # -- reading ------------------------------------------------------------------------------------
    def object_history(self, conn: ConnectionRole, oid: int, size: int) -> list[HistoryEntry]:
        """Revisions of ``oid``, newest first."""
        sql = self.sql.object_history
        if self.keep_history:
            return [HistoryEntry(int(tid), int(sz), _bytes(user), _bytes(desc), _bytes(ext))
                    for tid, sz, user, desc, ext in conn.fetchall(sql, (oid, size))]
        return [HistoryEntry(int(tid), int(sz), b"", b"", b"")
                for tid, sz in conn.fetchall(sql, (oid,))]

    def undo_log(self, conn: ConnectionRole, after_tid: int, offset: int,
                 limit: int) -> list[UndoEntry]:
        """Undoable transactions newer than ``after_tid``, newest first."""
        return [UndoEntry(int(tid), _bytes(user), _bytes(desc), _bytes(ext))
                for tid, user, desc, ext in conn.fetchall(self.sql.undo_log,
                                                          (after_tid, limit, offset))]

    def transaction_exists(self, conn: ConnectionRole, tid: int) -> bool:
        return conn.fetchone(self.sql.transaction_info, (tid,)) is not None

    def transaction_states(self, conn: ConnectionRole, tid: int) -> list[WrittenState]:
        """Every record ``tid`` wrote."""
        return [WrittenState(int(oid), stored_checksum,
                             opened(self.backend.codec, int(oid), tid, state))
                for oid, stored_checksum, state in conn.fetchall(self.sql.transaction_states,
                                                                 (tid,))]

    def state_before(self, conn: ConnectionRole, oid: int, tid: int) -> StateRow | None:
        return state_row(conn.fetchone(self.sql.state_before, (oid, tid)), oid,
                         self.backend.codec)

    def current_records(self, conn: ConnectionRole, after_oid: int,
                        limit: int) -> list[CurrentRecord]:
        """Current, non-deleted objects with oid > after_oid."""
        codec = self.backend.codec
        return [CurrentRecord(int(oid), int(tid), codec.decode(int(oid), int(tid), bytes(state)))
                for oid, tid, state in conn.fetchall(self.sql.current_records,
                                                     (after_oid, limit))]

    def referrers(self, conn: ConnectionRole, oid: int) -> list[int]:
        """Oids of the objects whose current revision refers to ``oid``."""
        return [int(row[0]) for row in conn.fetchall(self.sql.referrers, (oid,))]

    def iter_transactions(self, conn: ConnectionRole, start: int, stop: int, batch: int = 100,
                          ) -> Iterator[tuple[TransactionHeader, list[IteratedRecord]]]:
        """Each transaction in ``[start, stop]`` with the records it wrote."""
        sql = self.sql
        while start <= stop:
            found = conn.fetchall(sql.iter_transactions, (start, stop, batch))
            if self.keep_history:
                rows = [_header(row) for row in found]
            else:
                rows = [TransactionHeader(int(tid), False, b"", b"", b"") for (tid,) in found]
            if not rows:
                return
            for row in rows:
                yield row, [IteratedRecord(int(oid), opened(self.backend.codec, int(oid),
                                                            row.tid, state),
                                           int(data_tid) if data_tid is not None else None)
                            for oid, state, data_tid in conn.fetchall(sql.iter_records,
                                                                      (row.tid,))]
            start = rows[-1].tid + 1
