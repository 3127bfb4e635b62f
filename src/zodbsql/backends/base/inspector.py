"""Inspector: what ``zodbsql doctor`` checks on a live database, each with a fix.

A backend lists the server settings that matter to it; the base checks the schema.
``scratch()`` gives backend options for a throw-away database next to the real one
(another file, schema or database), removed afterwards, where the storage's own checks
run without touching the user's data.
"""
from __future__ import annotations

import contextlib
import dataclasses
import uuid
from typing import Iterator

from zodbsql.backends.base.contract import (ERROR, OK, WARNING, BackendContract,
                                            BackendOptions, ConnectionRole, Finding)
from zodbsql.backends.base.poller import LAST_TID
from zodbsql.backends.base.schema import SCHEMA_VERSION

__all__ = ["ERROR", "OK", "WARNING", "Finding", "Inspector"]

HIGHEST_OID = "SELECT MAX(zoid) FROM object_state"
#: The newest transaction that wrote a state: where a lost commit_row restarts.
NEWEST_STORED_TID = "SELECT MAX(tid) FROM object_state"


def highest_or_zero(conn: ConnectionRole, sql: str) -> int:
    """The ``MAX`` that ``sql`` reads, 0 when the table is empty (NULL)."""
    row = conn.fetchone(sql)
    return int(row[0]) if row and row[0] is not None else 0


class Inspector:
    """The schema's findings and a scratch database (an ``InspectorRole``)."""

    def __init__(self, backend: BackendContract) -> None:
        self.backend = backend

    def inspect(self, conn: ConnectionRole, clients: int) -> list[Finding]:
        """Findings about the server and the schema; ``clients`` is the expected
        number of processes using the database."""
        return self.schema_findings(conn)

    def schema_findings(self, conn: ConnectionRole) -> list[Finding]:
        meta = self.backend.schema.read_meta(conn)
        if meta is None:
            return [Finding(WARNING, "schema", "no zodbsql schema yet",
                            "it is created when the storage first opens (create-schema true)")]
        version = meta.get("schema_version")
        mode = "history-preserving" if meta.get("keep_history") == "true" else "history-free"
        if version != str(SCHEMA_VERSION):
            return [Finding(ERROR, "schema", f"version {version}",
                            f"this zodbsql needs schema version {SCHEMA_VERSION}")]
        findings = [Finding(OK, "schema", f"version {version}, {mode}")]
        findings += self.counter_findings(conn)
        if meta.get("keep_history") == "true" and conn.fetchone(
                self.HAS_INDEX, ("current_object_tid",)) is not None:
            findings.append(Finding(
                WARNING, "current_object_tid",
                "an index no statement reads any more (polls read object_state's since"
                " 2026-11-27), which every commit updates",
                "drop it: " + self.DROP_OLD_POLL_INDEX))
        return findings

    def counter_findings(self, conn: ConnectionRole) -> list[Finding]:
        """The one-row tables every commit relies on hold their row, and the oid counter
        is at or above every oid stored: below it (a partial restore, a row edited by
        hand), new objects would get oids in use and be written over existing ones."""
        findings = []
        if conn.fetchone(LAST_TID) is None:
            tid = highest_or_zero(conn, NEWEST_STORED_TID)
            findings.append(Finding(
                ERROR, "commit_row", "no row: commits can't be numbered and no process"
                " sees them", "put it back with the newest tid the database holds:"
                f" INSERT INTO commit_row (id, last_tid) VALUES (0, {tid})"))
        row = conn.fetchone(self.LAST_OID)
        highest = highest_or_zero(conn, HIGHEST_OID)
        if row is None:
            return findings + [Finding(
                ERROR, "oid counter", "gone: no new oid can be handed out",
                "put it back above every oid stored: "
                + self.RESTORE_OID_COUNTER.format(oid=highest))]
        counter = int(row[0]) if row[0] is not None else 0
        if counter < highest:
            return findings + [Finding(
                ERROR, "oid counter", f"at {counter}, below the highest oid stored"
                f" ({highest}): new objects would be written over existing ones",
                "raise it: " + self.RAISE_OID_COUNTER.format(oid=highest))]
        return findings + [Finding(OK, "oid counter",
                                   f"at {counter}, the highest oid stored {highest}")]

    #: The highest oid the counter has handed out: one row, none when the counter is
    #: gone (NULL: none handed out yet).
    LAST_OID = "SELECT last_oid FROM oid_counter"
    #: The statements that raise the counter to ``{oid}`` and put it back.
    RAISE_OID_COUNTER = "UPDATE oid_counter SET last_oid = {oid}"
    RESTORE_OID_COUNTER = "INSERT INTO oid_counter (id, last_oid) VALUES (0, {oid})"

    #: One row if the index named by the parameter exists (the backend's catalog).
    HAS_INDEX = ""
    #: The statement that drops the index databases made before 2026-11-27 keep on
    #: current_object (tid), which the poll no longer reads.
    DROP_OLD_POLL_INDEX = "DROP INDEX current_object_tid"

    CLASS_OF_STATE = "'(other)'"
    # Integer division on SQLite and PostgreSQL ('%' would be a placeholder).
    DAY_OF_TID = "(tid >> 32) / 1440"

    #: A server backend's scratch: statements creating and dropping a schema or database
    #: named ``{name}`` (generated, never from input), and the options field naming it.
    CREATE_SCRATCH = ""
    DROP_SCRATCH = ""
    SCRATCH_FIELD = ""

    @contextlib.contextmanager
    def scratch(self) -> Iterator[BackendOptions]:
        """Backend options for a scratch database beside this one, removed afterwards."""
        name = f"zodbsql_doctor_{uuid.uuid4().hex[:12]}"
        conn = self.backend.connect()
        try:
            conn.execute(self.CREATE_SCRATCH.format(name=name))
            yield dataclasses.replace(self.backend.options, **{self.SCRATCH_FIELD: name})
        finally:
            conn.execute(self.DROP_SCRATCH.format(name=name))
            conn.close()
