"""What doctor checks for PostgreSQL: version, settings that matter, privileges."""
from __future__ import annotations

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.inspector import ERROR, OK, WARNING, Finding, Inspector
from zodbsql.backends.postgresql.options import PostgreSQLOptions
from zodbsql.backends.postgresql.standbys import IN_RECOVERY, REPLICATION, standby_lag
from zodbsql.errors import DatabaseError
from zodbsql.masking import mask_secrets


SETTING = "SELECT setting, unit FROM pg_settings WHERE name = %s"
PRIVILEGES = (
    "SELECT has_schema_privilege(current_schema(), 'CREATE'),"
    " has_database_privilege(current_database(), 'TEMP')")
#: Sessions one client process may hold: the ZODB connection pool's load sessions (7 by
#: default) and the storage's pool of committing sessions (8).
SESSIONS_PER_CLIENT = 15
# The scratch schema's name is generated here, never taken from input.
CREATE_SCRATCH = "CREATE SCHEMA {name}"
DROP_SCRATCH = "DROP SCHEMA IF EXISTS {name} CASCADE"


def _pg_class_from(offset: int) -> str:
    head = f"encode(substring({{state}} from {offset} for 256), 'escape')"
    return f"split_part({head}, E'\\n', 1) || '.' || split_part({head}, E'\\n', 2)"


#: ZODB pickles a state's class first: protocol 2+ as 0x80, the protocol, then GLOBAL
#: ('c' module LF name LF); protocol 1 (old databases) as GLOBAL at once.
CLASS_OF_STATE = (
    "CASE WHEN length({state}) > 4 AND get_byte({state}, 0) = 128"
    " AND get_byte({state}, 2) = 99 THEN " + _pg_class_from(4) +
    " WHEN length({state}) > 2 AND get_byte({state}, 0) = 99 THEN " + _pg_class_from(2) +
    " ELSE '(other)' END")


class PostgreSQLInspector(Inspector):
    CREATE_SCRATCH = CREATE_SCRATCH
    DROP_SCRATCH = DROP_SCRATCH
    SCRATCH_FIELD = "schema"
    # pg_sequences: no row for a sequence that is gone, NULL before the first nextval.
    LAST_OID = ("SELECT last_value FROM pg_sequences WHERE schemaname = current_schema()"
                " AND sequencename = 'zoid_seq'")
    RAISE_OID_COUNTER = "SELECT setval('zoid_seq', {oid})"
    RESTORE_OID_COUNTER = ("CREATE SEQUENCE zoid_seq START WITH 1 MINVALUE 0;"
                           " SELECT setval('zoid_seq', {oid})")
    HAS_INDEX = ("SELECT 1 FROM pg_indexes WHERE schemaname = current_schema()"
                 " AND indexname = %s")
    # The fillfactor leaves room for HOT updates on the pages written from then on.
    DROP_OLD_POLL_INDEX = ("DROP INDEX current_object_tid;"
                           " ALTER TABLE current_object SET (fillfactor = 70)")
    CLASS_OF_STATE = CLASS_OF_STATE

    def _setting(self, conn: ConnectionRole, name: str) -> tuple[str, str]:
        row = conn.fetchone(SETTING, (name,))
        return (str(row[0]), str(row[1] or "")) if row else ("?", "")

    def inspect(self, conn: ConnectionRole, clients: int) -> list[Finding]:
        findings = []
        version = int(conn.raw.info.server_version)
        findings.append(Finding(OK, "server version", f"{version // 10000}.{version % 10000}"))
        max_conn = int(self._setting(conn, "max_connections")[0])
        needed = clients * SESSIONS_PER_CLIENT
        findings.append(Finding(OK, "max_connections", str(max_conn)) if max_conn >= needed
                        else Finding(WARNING, "max_connections", str(max_conn),
                                     f"{clients} client processes may open about {needed}"
                                     f" sessions; raise max_connections to {needed} or more"))
        idle, _ = self._setting(conn, "idle_in_transaction_session_timeout")
        findings.append(Finding(OK, "idle_in_transaction_session_timeout", f"{idle} ms")
                        if idle == "0" or int(idle) >= 600_000 else Finding(
                            WARNING, "idle_in_transaction_session_timeout", f"{idle} ms",
                            "history-free storages hold a read snapshot for the length of a"
                            " ZODB transaction; set it to 10min or more (or 0)"))
        sync, _ = self._setting(conn, "synchronous_commit")
        findings.append(Finding(OK, "synchronous_commit", sync) if sync in ("on", "remote_apply",
                                                                            "remote_write")
                        else Finding(WARNING, "synchronous_commit", sync,
                                     "committed transactions can be lost in a crash;"
                                     " set synchronous_commit = on"))
        buffers, unit = self._setting(conn, "shared_buffers")
        size = int(buffers) * (8192 if unit == "8kB" else 1)
        findings.append(Finding(OK, "shared_buffers", f"{size // 2**20} MiB") if size >= 256 * 2**20
                        else Finding(WARNING, "shared_buffers", f"{size // 2**20} MiB",
                                     "raise shared_buffers to about a quarter of the"
                                     " server's memory (at least 256MB)"))
        row = conn.fetchone(PRIVILEGES)
        can_create, can_temp = (bool(row[0]), bool(row[1])) if row else (False, False)
        findings.append(Finding(OK, "privileges", "CREATE on the schema, TEMP on the database")
                        if can_create and can_temp else Finding(
                            ERROR, "privileges",
                            f"CREATE {'yes' if can_create else 'no'}, TEMP {'yes' if can_temp else 'no'}",
                            "GRANT CREATE ON SCHEMA <schema> and GRANT TEMP ON DATABASE"
                            " <database> to the storage's user"))
        findings += self.pooler_findings() + self.replication_findings(conn)
        return findings + self.schema_findings(conn)

    def pooler_findings(self) -> list[Finding]:
        pooling = getattr(self.backend, "pooling", None)
        if pooling == "session":
            return [Finding(OK, "pooler", "a pooler or proxy keeps one server session per"
                                          " client session (pgbouncer pool_mode = session)")]
        if pooling == "direct":
            return [Finding(OK, "pooler", "none: sessions go straight to the server")]
        return []

    def replication_findings(self, conn: ConnectionRole) -> list[Finding]:
        """The standbys the primary streams to, and each of replica-dsns."""
        findings = []
        row = conn.fetchone(IN_RECOVERY)
        if row and row[0]:
            findings.append(Finding(ERROR, "primary", "the dsn names a standby (in recovery)",
                                    "name the primary in dsn; standbys go in replica-dsns"))
        streaming = conn.fetchall(REPLICATION)
        findings += [Finding(OK if state == "streaming" else WARNING, f"standby {name or addr}",
                             f"{state}, {sync} replication, replay lag {lag:.3f}s",
                             "" if state == "streaming" else "check the standby's log")
                     for name, addr, state, sync, lag in streaming]
        options = self.backend.options
        if not isinstance(options, PostgreSQLOptions):
            return findings
        bound = options.replica_max_lag
        for index, dsn in enumerate(options.replicas):
            where = mask_secrets(dsn)
            try:
                standby = self.backend.open_replica(index)
            except DatabaseError as exc:
                findings.append(Finding(WARNING, f"replica {where}", f"unreachable: {exc}",
                                        "its reads go to the primary until it is back"))
                continue
            try:
                lag = standby_lag(standby)
            except DatabaseError as exc:
                findings.append(Finding(WARNING, f"replica {where}", str(exc), ""))
                continue
            finally:
                standby.close()
            findings.append(Finding(OK, f"replica {where}", f"replay lag {lag:.3f}s") if lag <= bound
                            else Finding(WARNING, f"replica {where}", f"replay lag {lag:.1f}s",
                                         f"above replica-max-lag ({bound:g}s): skipped, its"
                                         " reads go to the primary"))
        return findings
