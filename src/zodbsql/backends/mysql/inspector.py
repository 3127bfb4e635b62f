"""What doctor checks for MySQL/MariaDB: packet size, buffer pool, durability, isolation,
binary log format, privileges; on a Galera node also the cluster (size, status, this
node's state) and the settings Galera needs (binlog_format, innodb_autoinc_lock_mode)
or that cost zodbsql (wsrep_sync_wait)."""
from __future__ import annotations

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.inspector import ERROR, OK, WARNING, Finding, Inspector
from zodbsql.backends.mysql.connections import MySQLConnection
from zodbsql.backends.mysql.options import MySQLOptions
from zodbsql.backends.mysql.replicas import describe_status, replica_lag, replication_status
from zodbsql.errors import DatabaseError


# SHOW VARIABLES ignores names a server doesn't have (MariaDB before 11.1 calls the
# isolation tx_isolation, MySQL 8 only transaction_isolation).
SETTINGS = (
    "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('version', 'max_allowed_packet',"
    " 'innodb_buffer_pool_size', 'innodb_flush_log_at_trx_commit', 'tx_isolation',"
    " 'transaction_isolation', 'binlog_format', 'log_bin', 'max_connections',"
    " 'wsrep_sync_wait', 'innodb_autoinc_lock_mode')")
CLUSTER_STATUS = (
    "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_cluster_size',"
    " 'wsrep_cluster_status', 'wsrep_local_state_comment', 'wsrep_ready')")
#: Nodes a cluster needs to keep a quorum when one fails.
QUORUM_NODES = 3
LARGEST_STATE = "SELECT COALESCE(MAX(state_size), 0) FROM object_state"
GRANTS = "SHOW GRANTS FOR CURRENT_USER()"
#: Sessions one client process may hold (ZODB connection pool + committing pool).
SESSIONS_PER_CLIENT = 15
# The scratch database's name is generated here, never taken from input.
CREATE_SCRATCH = "CREATE DATABASE {name} CHARACTER SET utf8mb4"
DROP_SCRATCH = "DROP DATABASE IF EXISTS {name}"


def _mysql_class_from(offset: int) -> str:
    head = f"SUBSTRING({{state}}, {offset}, 256)"
    return (f"CONCAT(SUBSTRING_INDEX({head}, CHAR(10), 1), '.',"
            f" SUBSTRING_INDEX(SUBSTRING_INDEX({head}, CHAR(10), 2), CHAR(10), -1))")


#: ZODB pickles a state's class first: protocol 2+ as 0x80, the protocol, then GLOBAL
#: ('c' module LF name LF); protocol 1 (old databases) as GLOBAL at once.
CLASS_OF_STATE = (
    "CASE WHEN LENGTH({state}) > 4 AND ASCII({state}) = 128"
    " AND ASCII(SUBSTRING({state}, 3, 1)) = 99 THEN " + _mysql_class_from(4) +
    " WHEN LENGTH({state}) > 2 AND ASCII({state}) = 99 THEN " + _mysql_class_from(2) +
    " ELSE '(other)' END")


class MySQLInspector(Inspector):
    CREATE_SCRATCH = CREATE_SCRATCH
    DROP_SCRATCH = DROP_SCRATCH
    SCRATCH_FIELD = "db"
    HAS_INDEX = ("SELECT 1 FROM information_schema.statistics WHERE table_schema ="
                 " DATABASE() AND table_name = 'current_object' AND index_name = %s LIMIT 1")
    DROP_OLD_POLL_INDEX = "ALTER TABLE current_object DROP INDEX current_object_tid"
    CLASS_OF_STATE = CLASS_OF_STATE
    DAY_OF_TID = "(tid >> 32) DIV 1440"

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
        galera = isinstance(conn, MySQLConnection) and conn.galera
        if galera:
            findings.extend(self._galera_findings(conn, values))
        elif log_bin.upper() in ("ON", "1"):
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
        findings += self.replica_findings(conn)
        return findings + self.schema_findings(conn)

    def replica_findings(self, conn: ConnectionRole) -> list[Finding]:
        """Each of replica-dsns: reachable, replicating, and how far behind; and an
        error when the storage's own server is itself a replica."""
        options = self.backend.options
        if not isinstance(options, MySQLOptions) or not options.replicas:
            return []
        findings = []
        assert isinstance(conn, MySQLConnection)
        try:
            if replication_status(conn) is not None:
                findings.append(Finding(ERROR, "primary", "the storage's server replicates"
                                        " from another (it is a replica)",
                                        "name the primary in host/port; replicas go in"
                                        " replica-dsns"))
        except DatabaseError as exc:
            findings.append(Finding(WARNING, "primary", str(exc), ""))
        bound = options.replica_max_lag
        for index, replica in enumerate(options.replicas):
            where = f"replica {replica.host}:{replica.port}"
            try:
                session = self.backend.open_replica(index)
            except DatabaseError as exc:
                findings.append(Finding(WARNING, where, f"unreachable: {exc}",
                                        "its reads go to the primary until it is back"))
                continue
            assert isinstance(session, MySQLConnection)
            try:
                status = replication_status(session)
                lag = replica_lag(session)
            except DatabaseError as exc:
                findings.append(Finding(WARNING, where, str(exc), ""))
                continue
            finally:
                session.close()
            detail = describe_status(status)
            findings.append(Finding(OK, where, detail) if lag <= bound else Finding(
                WARNING, where, detail, f"above replica-max-lag ({bound:g}s) or stopped:"
                " skipped, its reads go to the primary (START REPLICA on it, read its"
                " Last_Error)"))
        return findings

    def _galera_findings(self, conn: ConnectionRole, values: dict[str, str]) -> list[Finding]:
        status = {str(n): str(v) for n, v in conn.fetchall(CLUSTER_STATUS)}
        size = int(status.get("wsrep_cluster_size", "0") or 0)
        primary = status.get("wsrep_cluster_status", "?")
        state = status.get("wsrep_local_state_comment", "?")
        ready = status.get("wsrep_ready", "OFF")
        shown = f"{size} nodes, component {primary}, this node {state}"
        if primary != "Primary" or ready != "ON":
            cluster = Finding(ERROR, "galera cluster", shown,
                              "this node is cut off from the primary component and refuses"
                              " queries: connect to a node of the primary component, or"
                              " restore the quorum")
        elif state != "Synced":
            cluster = Finding(WARNING, "galera cluster", shown,
                              "this node is still joining or donating; wait until it is"
                              " Synced (wsrep_local_state_comment)")
        elif size < QUORUM_NODES:
            cluster = Finding(WARNING, "galera cluster", shown,
                              f"with fewer than {QUORUM_NODES} nodes the loss of one stops"
                              " the cluster (no quorum): add a node or an arbitrator (garbd)")
        else:
            cluster = Finding(OK, "galera cluster", shown)
        sync_wait = values.get("wsrep_sync_wait", "0")
        binlog = values.get("binlog_format", "?")
        autoinc = values.get("innodb_autoinc_lock_mode", "?")
        return [
            cluster,
            Finding(OK, "wsrep_sync_wait", f"{sync_wait} (zodbsql makes its polls and"
                    " commit checks causal itself)") if sync_wait == "0" else Finding(
                WARNING, "wsrep_sync_wait", sync_wait,
                "every statement of every session waits for the cluster; zodbsql makes"
                " the reads that need it causal by itself: set wsrep_sync_wait = 0 unless"
                " other applications need it"),
            Finding(OK, "binlog_format", binlog) if binlog == "ROW" else Finding(
                ERROR, "binlog_format", binlog,
                "Galera replicates row events only: set binlog_format = ROW"),
            Finding(OK, "innodb_autoinc_lock_mode", autoinc) if autoinc == "2" else Finding(
                WARNING, "innodb_autoinc_lock_mode", autoinc,
                "Galera needs interleaved auto-increment locks: set"
                " innodb_autoinc_lock_mode = 2"),
        ]
