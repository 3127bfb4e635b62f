"""What doctor checks for SQLite: journal, sync level, file system, free space."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from typing import Any, Iterator

from zodbsql.backends.base.contract import BackendOptions, ConnectionRole
from zodbsql.backends.base.inspector import ERROR, OK, WARNING, Finding, Inspector


# File systems on which SQLite's locking (and so WAL) is not reliable.
NETWORK_FILE_SYSTEMS = ("nfs", "nfs4", "cifs", "smbfs", "smb3", "fuse.sshfs", "9p", "afs")


def file_system(path: str) -> str:
    """The type of the file system holding ``path`` (from /proc/mounts), or 'unknown'."""
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                parts = line.split()
                if len(parts) >= 3 and path.startswith(parts[1]) and len(parts[1]) > len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def _sqlite_class_from(offset: int) -> str:
    head = f"CAST(substr({{state}}, {offset}, 256) AS TEXT)"
    rest = f"substr({head}, instr({head}, char(10)) + 1)"
    return (f"substr({head}, 1, instr({head}, char(10)) - 1) || '.' ||"
            f" substr({rest}, 1, instr({rest}, char(10)) - 1)")


#: ZODB pickles a state's class first: protocol 2+ as 0x80, the protocol, then GLOBAL
#: ('c' module LF name LF); protocol 1 (old databases) as GLOBAL at once.
CLASS_OF_STATE = (
    "CASE WHEN length({state}) > 4 AND substr({state}, 1, 1) = X'80'"
    " AND substr({state}, 3, 1) = X'63' THEN " + _sqlite_class_from(4) +
    " WHEN length({state}) > 2 AND substr({state}, 1, 1) = X'63' THEN " + _sqlite_class_from(2) +
    " ELSE '(other)' END")


class SQLiteInspector(Inspector):
    HAS_INDEX = "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = %s"
    CLASS_OF_STATE = CLASS_OF_STATE

    def inspect(self, conn: ConnectionRole, clients: int) -> list[Finding]:
        backend: Any = self.backend
        findings = []
        mode = str((conn.fetchone("PRAGMA journal_mode") or ("?",))[0]).lower()
        findings.append(Finding(OK, "journal_mode", mode) if mode == "wal" else Finding(
            ERROR, "journal_mode", mode,
            "zodbsql switches zodbsql databases to WAL when it opens them; open the storage"
            " once read-write, or run PRAGMA journal_mode=WAL"))
        sync = backend.options.synchronous.lower()
        findings.append(Finding(OK, "synchronous", sync) if sync in ("full", "extra") else
                        Finding(WARNING, "synchronous", sync,
                                "commits may be lost on power failure; use synchronous full"))
        kind = file_system(backend.path)
        findings.append(Finding(ERROR, "file system", kind,
                                "SQLite's locking is unreliable on network file systems:"
                                " keep the file on a local disk, or use PostgreSQL")
                        if kind in NETWORK_FILE_SYSTEMS else Finding(OK, "file system", kind))
        free = shutil.disk_usage(os.path.dirname(backend.path)).free
        findings.append(Finding(OK, "free space", f"{free / 2**30:.1f} GiB") if free > 2**30
                        else Finding(WARNING, "free space", f"{free / 2**20:.0f} MiB",
                                     "less than 1 GiB free beside the database"))
        return findings + self.schema_findings(conn)

    @contextlib.contextmanager
    def scratch(self) -> Iterator[BackendOptions]:
        backend: Any = self.backend
        # Beside the real file, so the check runs on the same file system.
        directory = tempfile.mkdtemp(prefix=".zodbsql-doctor-", dir=os.path.dirname(backend.path))
        try:
            yield dataclasses.replace(backend.options, path=os.path.join(directory, "check.sqlite"))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
