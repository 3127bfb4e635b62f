"""Verify a database: every state against its checksum, every reference resolvable.

Read-only.  Problems are collected, not raised, so one run reports all of them.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

from zodbsql.storage.records import checksum

if TYPE_CHECKING:
    from zodbsql.storage.storage import SQLStorage


@dataclasses.dataclass(frozen=True)
class Problem:
    kind: str          # "checksum" or "dangling-reference"
    oid: int
    tid: int
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: oid 0x{self.oid:016x} tid 0x{self.tid:016x}: {self.detail}"


@dataclasses.dataclass
class Report:
    states: int = 0
    bytes: int = 0
    problems: list[Problem] = dataclasses.field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems


def verify(storage: "SQLStorage", progress: Callable[[int, int], None] | None = None,
           ) -> Report:
    """Check every stored state and reference; ``progress(done, total)`` per batch."""
    backend = storage.backend
    checker = backend.checker
    report = Report()
    conn = backend.connect()
    try:
        total = checker.count_states(conn)
        for rows in checker.iter_states(conn):
            for oid, tid, stored, state in rows:
                report.states += 1
                if state is None:
                    continue
                state = bytes(state)
                report.bytes += len(state)
                if stored is not None and checksum(state) != stored:
                    report.problems.append(Problem(
                        "checksum", int(oid), int(tid),
                        f"state of {len(state)} bytes does not match its checksum"))
            if progress is not None:
                progress(report.states, total)
        for oid, tid, missing in checker.dangling_references(conn):
            report.problems.append(Problem(
                "dangling-reference", int(oid), int(tid),
                f"refers to oid 0x{int(missing):016x}, which does not exist"))
    finally:
        conn.close()
    return report
