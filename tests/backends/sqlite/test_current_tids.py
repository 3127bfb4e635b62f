"""SQLite reads a commit's current tids by runs of oids where they are few (a commit's
new objects, a container's children) and one by one where they are scattered
(backends/sqlite/locker.py): the same tids either way, none of an oid between two
asked for, none of an oid not stored."""
from __future__ import annotations

from typing import Any

import pytest
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.utils import u64

from zodbsql.backends.sqlite.locker import RUN_GAP, oid_runs

storage_backends = ("sqlite",)
storage_backends_reason = "SQLite's own statement"


def test_runs_go_on_while_the_gap_is_small() -> None:
    assert RUN_GAP == 4
    assert oid_runs([7]) == [(7, 7)]
    assert oid_runs([1, 2, 3, 10, 11, 20]) == [(1, 3), (10, 11), (20, 20)]
    assert oid_runs([1, 5, 9, 14, 15]) == [(1, 9), (14, 15)]
    assert oid_runs([3, 3, 4]) == [(3, 4)]


@pytest.fixture
def stored(storage_factory: Any) -> Any:
    """A storage holding 60 children committed together, every seventh changed in a
    second commit: their oids and tids, and the storage."""
    db = ZODB.DB(storage_factory.open())
    with db.transaction() as conn:
        conn.root()["children"] = children = PersistentMapping()
        for number in range(60):
            children[number] = PersistentMapping()
    with db.transaction() as conn:
        for number, child in conn.root()["children"].items():
            if number % 7 == 0:
                child["changed"] = True
    conn = db.open()
    tids = {u64(child._p_oid): u64(child._p_serial)
            for child in conn.root()["children"].values()}
    conn.close()
    assert len(set(tids.values())) == 2
    yield tids, db.storage
    db.close()


def _current_tids(storage: Any, oids: list[int]) -> tuple[dict[int, int], list[str]]:
    """The locker's answer for ``oids`` and the statements it sent."""
    conn = storage.shared.pool.acquire()
    sent: list[str] = []
    fetchall = conn.fetchall

    def recording(sql: str, *args: Any, **kw: Any) -> Any:
        sent.append(sql)
        return fetchall(sql, *args, **kw)
    conn.fetchall = recording
    try:
        return storage.shared.backend.locker.current_tids(conn, oids), sent
    finally:
        del conn.fetchall
        conn.rollback()
        storage.shared.pool.release(conn)


def test_by_runs_and_one_by_one_the_same_tids(stored: Any) -> None:
    tids, storage = stored
    oids = sorted(tids)
    assert oids == list(range(oids[0], oids[0] + 60))   # one run of new objects
    missing = oids[-1] + 1000
    cases = {
        "every one": oids,                                  # by runs: one
        "every third": oids[::3],                           # by runs, others between
        "every fifth": oids[::5],                           # one by one: gaps of 5
        "unsorted, and one never stored": [*oids[::-2], missing],
        "a few runs and one apart": [*oids[:20], *oids[40:], missing],
        "a run for each four": [*oids[:4], *oids[10:14]],  # just by runs: 2 runs, 8 oids
    }
    by_runs = {"every one": True, "every third": True, "every fifth": False,
               "unsorted, and one never stored": True, "a few runs and one apart": True,
               "a run for each four": True}
    for name, asked in cases.items():
        found, sent = _current_tids(storage, asked)
        assert found == {oid: tids[oid] for oid in asked if oid in tids}, name
        assert len(sent) == 1 and ("BETWEEN" in sent[0]) == by_runs[name], name
    assert _current_tids(storage, []) == ({}, [])
