"""verify reports corrupt states and dangling references, by oid and tid."""
from __future__ import annotations

from typing import Any

import ZODB
from persistent.mapping import PersistentMapping
from ZODB.utils import u64

from zodbsql.storage.verify import verify

CORRUPT = "UPDATE object_state SET state = %s WHERE zoid = %s"
DELETE_STATES = "DELETE FROM object_state WHERE zoid = %s"
DELETE_CURRENT = "DELETE FROM current_object WHERE zoid = %s"


def build(storage: Any) -> tuple[int, int]:
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        conn.root()["a"] = PersistentMapping(child=PersistentMapping(x=1))
        conn.root()["b"] = PersistentMapping(y=2)
    with db.transaction() as conn:
        return u64(conn.root()["a"]["child"]._p_oid), u64(conn.root()["b"]._p_oid)


def run_sql(storage: Any, sql: str, params: tuple[Any, ...]) -> None:
    conn = storage.backend.connect()
    try:
        conn.begin_write()
        conn.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


def test_clean_database(storage_factory: Any) -> None:
    storage = storage_factory.open()
    build(storage)
    report = verify(storage)
    assert report.clean and report.states >= 4


def test_corrupt_state_and_missing_object_are_reported(storage_factory: Any) -> None:
    storage = storage_factory.open()
    child, b = build(storage)
    run_sql(storage, CORRUPT, (b"not what was stored", b))
    run_sql(storage, DELETE_STATES, (child,))
    if storage_factory.param.keep_history:
        run_sql(storage, DELETE_CURRENT, (child,))
    report = verify(storage)
    kinds = {(p.kind, p.oid) for p in report.problems}
    assert ("checksum", b) in kinds
    dangling = [p for p in report.problems if p.kind == "dangling-reference"]
    assert [f"0x{child:016x}" in p.detail for p in dangling] == [True]
    assert not report.clean
