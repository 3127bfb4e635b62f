"""``zodbsql report``: its per-class figures, computed in SQL from the first bytes of
each pickle, equal those of a full scan that loads every state and asks ZODB for its
class; and the tool prints, writes JSON and draws its chart."""
from __future__ import annotations

import collections
import json
from typing import Any

import transaction
import ZODB
from BTrees.Length import Length
from BTrees.OOBTree import OOBTree
from persistent.list import PersistentList
from persistent.mapping import PersistentMapping
from ZODB.utils import get_pickle_metadata, p64

from tests.cli.urls import url_for
from zodbsql.cli.main import main as zodbsql_main
from zodbsql.storage.report import build, day_of


def fill(db: Any) -> None:
    with db.transaction() as conn:
        root = conn.root()
        root["tree"] = OOBTree()
        root["count"] = Length()
        root["lists"] = PersistentList()
        for i in range(30):
            root["tree"][f"k{i}"] = PersistentMapping(n=i, blob=b"x" * (i * 50))
    for i in range(5):                                   # more revisions
        with db.transaction() as conn:
            root = conn.root()
            root["count"].change(1)
            root["lists"].append(PersistentList([i] * 100))
            root["tree"]["k1"]["n"] = i


def scanned(storage: Any, keep_history: bool) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Per class, [objects, bytes] of current states, and revisions per class, by
    loading every state."""
    current: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    revisions: collections.Counter[str] = collections.Counter()
    for record_txn in storage.iterator():
        for record in record_txn:
            if record.data is not None:
                revisions[".".join(get_pickle_metadata(record.data))] += 1
    oid = 0
    while True:
        try:
            data, _ = storage.load(p64(oid))
        except Exception:
            break
        figures = current[".".join(get_pickle_metadata(data))]
        figures[0] += 1
        figures[1] += len(data)
        oid += 1
    return dict(current), dict(revisions)


def test_the_report_equals_a_scan_of_the_pickles(storage_factory: Any) -> None:
    keep_history = storage_factory.param.keep_history
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    fill(db)
    report = build(storage)
    current, revisions = scanned(storage, keep_history)
    db.close()
    assert {c.name: [c.objects, c.bytes] for c in report.classes} == current
    assert report.objects == sum(figures[0] for figures in current.values())
    if keep_history:
        assert {c.name: c.revisions for c in report.classes} == revisions
        assert report.revisions > report.objects
        assert sum(day.transactions for day in report.days) == 7   # root + fill's six
    assert report.largest[0][3] == "persistent.mapping.PersistentMapping"   # n=29's
    assert report.largest == sorted(report.largest, key=lambda row: (-row[2], row[0]))
    assert all(day.day.year >= 2020 for day in report.days)


def test_the_tool_prints_json_and_draws(storage_factory: Any, tmp_path: Any, capsys: Any) -> None:
    db = ZODB.DB(storage_factory.open())
    fill(db)
    db.close()
    param = storage_factory.param
    url = url_for(param.backend, storage_factory.path, keep_history=param.keep_history)
    chart = tmp_path / "report.png"
    assert zodbsql_main(["report", url, "--chart", str(chart), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "persistent.mapping.PersistentMapping" in out and "largest objects" in out
    assert chart.stat().st_size > 10_000
    assert zodbsql_main(["report", url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {c["name"] for c in data["classes"]} >= {"BTrees.OOBTree.OOBTree",
                                                    "BTrees.Length.Length"}
    assert data["largest"][0]["oid"].startswith("0x")


def test_days_of_the_time_stamp_calendar() -> None:
    from ZODB.TimeStamp import TimeStamp
    stamp = TimeStamp(2026, 11, 23, 22, 43, 5.0)
    tid = int.from_bytes(stamp.raw(), "big")
    assert day_of((tid >> 32) // (24 * 60)).isoformat() == "2026-11-23"
    transaction.abort()
