"""What doctor checks for PostgreSQL: version, settings that matter, privileges."""
from __future__ import annotations

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.base.inspector import ERROR, OK, WARNING, Finding, Inspector


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


class PostgreSQLInspector(Inspector):
    CREATE_SCRATCH = CREATE_SCRATCH
    DROP_SCRATCH = DROP_SCRATCH
    SCRATCH_FIELD = "schema"

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
        return findings + self.schema_findings(conn)
