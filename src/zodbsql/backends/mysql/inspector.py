"""What doctor checks for MySQL/MariaDB: packet size, buffer pool, durability, isolation,
binary log format, privileges."""
from __future__ import annotations

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.inspector import ERROR, OK, WARNING, Finding, Inspector


# SHOW VARIABLES ignores names a server doesn't have (MariaDB before 11.1 calls the
# isolation tx_isolation, MySQL 8 only transaction_isolation).
SETTINGS = (
    "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('version', 'max_allowed_packet',"
    " 'innodb_buffer_pool_size', 'innodb_flush_log_at_trx_commit', 'tx_isolation',"
    " 'transaction_isolation', 'binlog_format', 'log_bin', 'max_connections')")
LARGEST_STATE = "SELECT COALESCE(MAX(state_size), 0) FROM object_state"
GRANTS = "SHOW GRANTS FOR CURRENT_USER()"
#: Sessions one client process may hold (ZODB connection pool + committing pool).
SESSIONS_PER_CLIENT = 15
# The scratch database's name is generated here, never taken from input.
CREATE_SCRATCH = "CREATE DATABASE {name} CHARACTER SET utf8mb4"
DROP_SCRATCH = "DROP DATABASE IF EXISTS {name}"


class MySQLInspector(Inspector):
    CREATE_SCRATCH = CREATE_SCRATCH
    DROP_SCRATCH = DROP_SCRATCH
    SCRATCH_FIELD = "db"

    def inspect(self, conn: ConnectionRole, clients: int) -> list[Finding]:
        values = {str(name): str(value) for name, value in conn.fetchall(SETTINGS)}
        version = values.get("version", "?")
        packet = int(values.get("max_allowed_packet", 0))
        pool = int(values.get("innodb_buffer_pool_size", 0))
        flush = int(values.get("innodb_flush_log_at_trx_commit", 1))
        isolation = values.get("transaction_isolation") or values.get("tx_isolation", "?")
        binlog, log_bin = values.get("binlog_format", "?"), values.get("log_bin", "OFF")
        max_conn = int(values.get("max_connections", 0))
        findings = [Finding(OK, "server version", str(version))]
        largest = 0
        if "object_state" in self.backend.schema.list_tables(conn):
            largest = int((conn.fetchone(LARGEST_STATE) or (0,))[0])
        # States travel escaped (up to twice their size) in one statement.
        needed = max(2 * largest, 2 * (1 << 20)) + (1 << 16)
        findings.append(Finding(OK, "max_allowed_packet",
                                f"{packet >> 20} MiB (largest state {largest} bytes)")
                        if packet >= needed else Finding(
                            WARNING if packet >= 2 * largest else ERROR, "max_allowed_packet",
                            f"{packet >> 20} MiB (largest state {largest} bytes)",
                            f"set max_allowed_packet to at least {needed >> 20 or 1}M (64M is"
                            " usual): states and blob chunks must fit one statement"))
        findings.append(Finding(OK, "innodb_buffer_pool_size", f"{pool >> 20} MiB")
                        if pool >= 512 << 20 else Finding(
                            WARNING, "innodb_buffer_pool_size", f"{pool >> 20} MiB",
                            "give InnoDB more memory: innodb_buffer_pool_size = half to three"
                            " quarters of a dedicated server's RAM"))
        findings.append(Finding(OK, "innodb_flush_log_at_trx_commit", str(flush)) if flush == 1
                        else Finding(WARNING, "innodb_flush_log_at_trx_commit", str(flush),
                                     "committed transactions can be lost in a crash; set it to 1"))
        findings.append(Finding(OK, "transaction_isolation", str(isolation))
                        if str(isolation) in ("READ-COMMITTED", "REPEATABLE-READ") else Finding(
                            WARNING, "transaction_isolation", str(isolation),
                            "zodbsql sets its own isolation per session; a server default of"
                            " READ-UNCOMMITTED or SERIALIZABLE is unusual, check my.cnf"))
        if log_bin.upper() in ("ON", "1"):
            findings.append(Finding(OK, "binlog_format", str(binlog)) if str(binlog) == "ROW"
                            else Finding(WARNING, "binlog_format", str(binlog),
                                         "use binlog_format = ROW for safe replication of"
                                         " zodbsql's INSERT ... SELECT statements"))
        else:
            findings.append(Finding(OK, "binlog_format", "binary log off"))
        needed_sessions = clients * SESSIONS_PER_CLIENT
        findings.append(Finding(OK, "max_connections", str(max_conn))
                        if max_conn >= needed_sessions else Finding(
                            WARNING, "max_connections", str(max_conn),
                            f"{clients} client processes may open about {needed_sessions}"
                            f" sessions; raise max_connections"))
        grants = " ".join(str(r[0]) for r in conn.fetchall(GRANTS)).upper()
        can = ("ALL PRIVILEGES" in grants or all(
            p in grants for p in ("CREATE", "CREATE TEMPORARY TABLES", "INSERT", "DELETE")))
        findings.append(Finding(OK, "privileges", "CREATE, TEMPORARY TABLES, INSERT, DELETE")
                        if can else Finding(
                            ERROR, "privileges", grants[:200],
                            "GRANT CREATE, CREATE TEMPORARY TABLES, SELECT, INSERT, UPDATE,"
                            " DELETE, DROP ON <db>.* to the storage's user"))
        return findings + self.schema_findings(conn)
