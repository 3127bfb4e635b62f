"""What a database holds, by class, by day and by size: ``zodbsql report``.

Everything is SQL on the server: a state's class is read from the first bytes of its
pickle (``InspectorRole.CLASS_OF_STATE``), where ZODB writes it, so no pickle is loaded
into Python.  Days come from tids: a ZODB tid's high 32 bits count minutes in a calendar
of 31-day months, so whole days group as integers.
"""
from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.storage.shared import HasShared

#: The largest objects listed.
LARGEST = 10


@dataclasses.dataclass
class ClassFigures:
    name: str
    objects: int = 0
    bytes: int = 0
    revisions: int = 0
    revision_bytes: int = 0


@dataclasses.dataclass
class DayFigures:
    day: datetime.date
    transactions: int
    revisions: int
    bytes: int


@dataclasses.dataclass
class Report:
    keep_history: bool
    objects: int = 0
    bytes: int = 0
    revisions: int = 0
    revision_bytes: int = 0
    classes: list[ClassFigures] = dataclasses.field(default_factory=list)
    largest: list[tuple[int, int, int, str]] = dataclasses.field(default_factory=list)
    days: list[DayFigures] = dataclasses.field(default_factory=list)
    blobs: int = 0
    blob_bytes: int = 0
    blob_references: int = 0

    def as_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["largest"] = [{"oid": f"0x{oid:016x}", "tid": f"0x{tid:016x}", "bytes": size,
                            "class": name} for oid, tid, size, name in self.largest]
        data["days"] = [{**dataclasses.asdict(day), "day": day.day.isoformat()}
                        for day in self.days]
        return data


def day_of(number: int) -> datetime.date:
    """The date of a day number of ZODB's time stamp calendar (31-day months)."""
    months, day = divmod(int(number), 31)
    years, month = divmod(months, 12)
    try:
        return datetime.date(1900 + years, month + 1, day + 1)
    except ValueError:  # the calendar's Feb 30: tids never fall there
        return datetime.date(1900 + years, month + 1, 1)


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def build(storage: HasShared) -> Report:
    """The report of ``storage``'s database, read in one read transaction."""
    shared = storage.shared
    backend = shared.backend
    keep_history = shared.options.keep_history
    conn = shared.connect()
    try:
        conn.begin_read()
        return _report(conn, backend.inspector.CLASS_OF_STATE, backend.inspector.DAY_OF_TID,
                       keep_history)
    finally:
        conn.rollback()
        conn.close()


def _report(conn: ConnectionRole, class_of: str, day_of_tid: str,
            keep_history: bool) -> Report:
    report = Report(keep_history)
    cls = class_of.format(state="s.state")
    current = ("current_object c JOIN object_state s ON s.zoid = c.zoid AND s.tid = c.tid"
               if keep_history else "object_state s")
    classes: dict[str, ClassFigures] = {}
    for name, count, size in conn.fetchall(
            f"SELECT {cls}, COUNT(*), COALESCE(SUM(s.state_size), 0) FROM {current}"
            " WHERE s.state IS NOT NULL GROUP BY 1"):
        figures = classes.setdefault(_text(name), ClassFigures(_text(name)))
        figures.objects, figures.bytes = int(count), int(size)
    if keep_history:
        for name, count, size in conn.fetchall(
                f"SELECT {cls}, COUNT(*), COALESCE(SUM(s.state_size), 0) FROM object_state s"
                " WHERE s.state IS NOT NULL GROUP BY 1"):
            figures = classes.setdefault(_text(name), ClassFigures(_text(name)))
            figures.revisions, figures.revision_bytes = int(count), int(size)
    else:
        for figures in classes.values():
            figures.revisions, figures.revision_bytes = figures.objects, figures.bytes
    report.classes = sorted(classes.values(), key=lambda c: (-c.bytes, -c.revision_bytes,
                                                             c.name))
    report.objects = sum(c.objects for c in report.classes)
    report.bytes = sum(c.bytes for c in report.classes)
    report.revisions = sum(c.revisions for c in report.classes)
    report.revision_bytes = sum(c.revision_bytes for c in report.classes)
    report.largest = [(int(oid), int(tid), int(size), _text(name)) for oid, tid, size, name in
                      conn.fetchall(f"SELECT s.zoid, s.tid, s.state_size, {cls} FROM {current}"
                                    f" WHERE s.state IS NOT NULL"
                                    f" ORDER BY s.state_size DESC, s.zoid LIMIT {LARGEST}")]
    report.days = _days(conn, day_of_tid, keep_history)
    row = conn.fetchone("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM blob_content")
    report.blobs, report.blob_bytes = (int(row[0]), int(row[1])) if row else (0, 0)
    row = conn.fetchone("SELECT COUNT(*) FROM blob_ref")
    report.blob_references = int(row[0]) if row else 0
    return report


def _days(conn: ConnectionRole, day_of_tid: str, keep_history: bool) -> list[DayFigures]:
    """Per day: transactions, revisions and bytes written (history-free: of the
    current states only, by the day they were last written)."""
    revisions = {int(day): (int(count), int(size)) for day, count, size in conn.fetchall(
        f"SELECT {day_of_tid} AS day, COUNT(*), COALESCE(SUM(state_size), 0)"
        " FROM object_state WHERE tid > 0 GROUP BY 1")}
    if keep_history:
        transactions = {int(day): int(count) for day, count in conn.fetchall(
            f"SELECT {day_of_tid} AS day, COUNT(*) FROM transactions WHERE tid > 0"
            " GROUP BY 1")}
    else:
        transactions = {int(day): int(count) for day, count in conn.fetchall(
            f"SELECT {day_of_tid} AS day, COUNT(DISTINCT tid) FROM object_state"
            " WHERE tid > 0 GROUP BY 1")}
    return [DayFigures(day_of(day), transactions.get(day, 0), *revisions.get(day, (0, 0)))
            for day in sorted(set(revisions) | set(transactions))]
