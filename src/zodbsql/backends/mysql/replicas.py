"""Binlog replicas: how far behind the primary one is.

The lag is read on the replica itself (``SHOW REPLICA STATUS``), so choosing one costs
no round trip to the primary.  MariaDB 10.5+ and MySQL 8.0.22+ know that spelling; older
servers only ``SHOW SLAVE STATUS``, tried when the first is a syntax error.  The columns
are ``Slave_*``/``Seconds_Behind_Master`` on MariaDB, ``Replica_*``/
``Seconds_Behind_Source`` on MySQL.
"""
from __future__ import annotations

from typing import Any

from zodbsql.backends.mysql.connections import MySQLConnection, error_number
from zodbsql.errors import DatabaseError

#: MySQL's error number for a statement it can't parse.
PARSE_ERROR = 1064
NOT_A_REPLICA = 0.0
STOPPED = float("inf")


def replication_status(conn: MySQLConnection) -> dict[str, Any] | None:
    """The replica's status row by column name, or None on a server that replicates
    from nothing (a primary, or a promoted replica)."""
    for statement in ("SHOW REPLICA STATUS", "SHOW SLAVE STATUS"):
        conn.statements += 1
        try:
            cursor = conn.raw.cursor()
            cursor.execute(statement)
            row = cursor.fetchone()
            names = [column[0] for column in cursor.description or ()]
            cursor.fetchall()
            return dict(zip(names, row)) if row is not None else None
        except Exception as exc:
            if error_number(exc) == PARSE_ERROR:
                continue
            error = conn.translate_error(exc, statement)
            raise DatabaseError(
                f"cannot read the replication status of {conn.where}: {error} (GRANT"
                " REPLICA MONITOR, or REPLICATION CLIENT on MySQL, to the user)") from exc
    return None


def _field(status: dict[str, Any], *names: str) -> Any:
    for name in names:
        if name in status:
            return status[name]
    return None


def replica_lag(conn: MySQLConnection) -> float:
    """Seconds the replica ``conn`` is behind: 0 on a server that is no replica (a
    promoted one), infinite when its replication threads are stopped or broken."""
    status = replication_status(conn)
    if status is None:
        return NOT_A_REPLICA
    running = [_field(status, f"Slave_{part}_Running", f"Replica_{part}_Running")
               for part in ("IO", "SQL")]
    behind = _field(status, "Seconds_Behind_Master", "Seconds_Behind_Source")
    if any(str(flag) != "Yes" for flag in running) or behind is None:
        return STOPPED
    return float(behind)


def describe_status(status: dict[str, Any] | None) -> str:
    """One line for doctor: the replica's source, threads and lag."""
    if status is None:
        return "replicates from nothing (a primary, or a promoted replica)"
    source = (f"{_field(status, 'Master_Host', 'Source_Host')}:"
              f"{_field(status, 'Master_Port', 'Source_Port')}")
    io = _field(status, "Slave_IO_Running", "Replica_IO_Running")
    sql = _field(status, "Slave_SQL_Running", "Replica_SQL_Running")
    behind = _field(status, "Seconds_Behind_Master", "Seconds_Behind_Source")
    error = _field(status, "Last_Error") or _field(status, "Last_IO_Error") or ""
    line = f"from {source}, IO thread {io}, SQL thread {sql}, {behind} s behind"
    return f"{line}; last error: {error}" if error else line
