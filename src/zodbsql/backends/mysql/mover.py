"""MySQL stages commits in TEMPORARY tables and upserts with ON DUPLICATE KEY UPDATE.

A TEMPORARY table is private to the session and never locked by other sessions; MySQL
can't name one twice in a statement, which none of these statements does.  Deletes
driven by the staged oids are multi-table DELETEs with ``STRAIGHT_JOIN`` from the temp
table, so InnoDB visits (and locks) exactly the staged rows instead of scanning.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Sequence

from zodbsql.backends.base.contract import ConnectionRole, StagedState
from zodbsql.backends.base.mover import REFERENCES_EACH, STAGE_STATE, Mover
from zodbsql.backends.mysql.connections import MySQLConnection

CREATE_TEMP_TABLES = (
    "CREATE TEMPORARY TABLE IF NOT EXISTS temp_store (zoid BIGINT NOT NULL PRIMARY KEY,"
    " prev_tid BIGINT NOT NULL, data_tid BIGINT, checksum BIGINT, state_size BIGINT NOT NULL,"
    " state LONGBLOB, refs LONGTEXT) ENGINE=InnoDB",
    "CREATE TEMPORARY TABLE IF NOT EXISTS temp_blob (zoid BIGINT NOT NULL PRIMARY KEY,"
    " content_hash BINARY(32) NOT NULL) ENGINE=InnoDB",
)
HP_SET_CURRENT = (
    "INSERT INTO current_object (zoid, tid) SELECT zoid, %s FROM temp_store"
    " ON DUPLICATE KEY UPDATE tid = VALUES(tid)")
HF_MOVE_STATES = (
    "INSERT INTO object_state (zoid, tid, checksum, state_size, refs, state)"
    " SELECT zoid, %s, checksum, state_size, refs, state FROM temp_store"
    " WHERE state IS NOT NULL"
    " ON DUPLICATE KEY UPDATE tid = VALUES(tid), checksum = VALUES(checksum),"
    " state_size = VALUES(state_size), refs = VALUES(refs), state = VALUES(state)")
HF_DELETE_REMOVED = (
    "DELETE s FROM temp_store t STRAIGHT_JOIN object_state s ON s.zoid = t.zoid"
    " WHERE t.state IS NULL")
HF_RECORD_DELETED = (
    "INSERT INTO object_gone (seq, tid, zoids) SELECT g.last_seq, %s,"
    " (SELECT JSON_ARRAYAGG(zoid) FROM temp_store WHERE state IS NULL) FROM gone_row g")
HF_DELETE_OLD_BLOBS = (
    "DELETE b FROM temp_store t STRAIGHT_JOIN blob_ref b ON b.zoid = t.zoid")


# InnoDB keeps what DELETE removes from a TEMPORARY table: a history-free loader's
# DELETE of the staged references (a table of its own in schema version 1) went from 1.5
# to 20 ms a commit in a minute, and the INSERT ... SELECT that read the table grew with
# it (61 to 11 commits/s in a two-minute soak).
# TRUNCATE empties it for good; it ends any transaction it runs in, so the commit runs
# it before its own begins (``clear_staged``'s contract).
TRUNCATE_TEMP_STORE = "TRUNCATE TABLE temp_store"

# Staging with mysqlclient: the rows as one multi-row INSERT per max_allowed_packet,
# built here.  Its executemany builds the same statement but quotes every value through
# Connection.literal in Python: 6.3 of the 12.4 ms that 1,000 states of 190 bytes took
# to stage, where the server's part was 5.7.  Numbers go in as digits and the states and
# references through the driver's own escaping (``string_literal``, libmysqlclient's
# mysql_real_escape_string), as its executemany escapes them.
STAGE_ROWS = b"INSERT INTO temp_store (zoid, prev_tid, data_tid, checksum, state_size, state, refs) VALUES "
#: Room kept in a packet for the statement's head and the protocol's header.
PACKET_MARGIN = 1024


class MySQLMover(Mover):
    CREATE_TEMP_TABLES = CREATE_TEMP_TABLES
    # FOR ORDINALITY numbers an array's elements from 1.
    FIRST_REFERENCES = (
        "SELECT k.zoid, j.to_zoid FROM kept k, JSON_TABLE(k.refs, '$[*]' COLUMNS"
        " (ordinal FOR ORDINALITY, to_zoid BIGINT PATH '$')) j"
        f" WHERE j.ordinal <= {REFERENCES_EACH}")
    HISTORY_PRESERVING = dataclasses.replace(Mover.HISTORY_PRESERVING,
                                             set_current=HP_SET_CURRENT)
    HISTORY_FREE = dataclasses.replace(
        Mover.HISTORY_FREE, move_states=HF_MOVE_STATES, delete_removed=HF_DELETE_REMOVED,
        record_deleted=HF_RECORD_DELETED,
        delete_old_blobs=HF_DELETE_OLD_BLOBS)

    def stage(self, conn: ConnectionRole, states: Sequence[StagedState]) -> None:
        # mysqlclient's quoting of bytes, as its literal() quotes them (zodbsql never
        # asks for the _binary prefix); PyMySQL has none of that name.
        quote = getattr(getattr(conn, "raw", None), "string_literal", None)
        if not (states and isinstance(conn, MySQLConnection) and quote is not None):
            super().stage(conn, states)     # PyMySQL: its executemany
            return
        for statement, count in staging_statements(states, quote, conn.max_allowed_packet):
            conn.execute_script(statement, f"{STAGE_STATE} ({count} rows)")

    def clear_staged(self, conn: ConnectionRole) -> None:
        if conn.in_transaction:
            super().clear_staged(conn)     # never end a transaction someone began
            return
        conn.execute(TRUNCATE_TEMP_STORE)


def staging_statements(states: Sequence[StagedState], quote: Callable[[bytes], bytes],
                       max_packet: int) -> Iterator[tuple[bytes, int]]:
    """Multi-row INSERTs of ``states`` into temp_store, each under ``max_packet`` bytes
    (0: unknown, one statement), with the number of rows each carries."""
    limit = max_packet - PACKET_MARGIN if max_packet > PACKET_MARGIN else 0
    rows: list[bytes] = []
    size = len(STAGE_ROWS)
    for oid, prev_tid, data_tid, checksum, state_size, state, refs in states:
        row = b"(%d,%d,%b,%b,%d,%b,%b)" % (
            oid, prev_tid, number(data_tid), number(checksum), state_size,
            b"NULL" if state is None else quote(state),
            b"NULL" if refs is None else quote(refs.encode("ascii")))
        if rows and limit and size + len(row) + 1 > limit:
            yield STAGE_ROWS + b",".join(rows), len(rows)
            rows, size = [], len(STAGE_ROWS)
        rows.append(row)
        size += len(row) + 1
    if rows:
        yield STAGE_ROWS + b",".join(rows), len(rows)


def number(value: Any) -> bytes:
    """An integer column's literal (NULL for None)."""
    return b"NULL" if value is None else b"%d" % value
