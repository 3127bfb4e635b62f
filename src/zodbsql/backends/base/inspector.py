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
from zodbsql.backends.base.schema import SCHEMA_VERSION

__all__ = ["ERROR", "OK", "WARNING", "Finding", "Inspector"]


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
        if meta.get("keep_history") == "true" and conn.fetchone(
                self.HAS_INDEX, ("current_object_tid",)) is not None:
            findings.append(Finding(
                WARNING, "current_object_tid",
                "an index no statement reads any more (polls read object_state's since"
                " 2026-11-27), which every commit updates",
                "drop it: " + self.DROP_OLD_POLL_INDEX))
        return findings

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
