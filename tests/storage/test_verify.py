"""verify reports corrupt states and dangling references, by oid and tid."""
from __future__ import annotations

from typing import Any

import ZODB
from persistent.mapping import PersistentMapping
from ZODB.Connection import TransactionMetaData
from ZODB.utils import p64, u64

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


def delete_objects(storage: Any, oids: list[int]) -> bytes:
    """Delete ``oids`` (``deleteObject``, whatever refers to them) in one transaction;
    its tid."""
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    for oid in oids:
        storage.deleteObject(p64(oid), storage.load(p64(oid))[1], txn)
    storage.tpc_vote(txn)
    storage.tpc_finish(txn)
    return bytes(storage.lastTransaction())


def dangling_of(report: Any) -> list[tuple[int, str]]:
    return [(p.oid, p.detail) for p in report.problems if p.kind == "dangling-reference"]


def test_dangling_references_are_reported_in_oid_order(storage_factory: Any) -> None:
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        for name in "ab":
            conn.root()[name] = PersistentMapping(child=PersistentMapping())
    with db.transaction() as conn:
        referrers = [conn.root()[name] for name in "ab"]
        pairs = sorted((u64(each._p_oid), u64(each["child"]._p_oid)) for each in referrers)
    delete_objects(storage, [child for _, child in pairs])
    assert dangling_of(verify(storage)) == [
        (oid, f"refers to oid 0x{child:016x}, which does not exist") for oid, child in pairs]


class TestAnObjectBroughtBack:
    history_modes = (True,)
    history_modes_reason = "history-free, a deleted object leaves no revision to undo"

    def test_an_object_deleted_then_undone_is_not_dangling(self, storage_factory: Any
                                                          ) -> None:
        """Its deletion stays in its history (a revision without a state); only its
        current revision tells whether it exists."""
        storage = storage_factory.open()
        child, _ = build(storage)
        deleted = delete_objects(storage, [child])
        assert [detail for _, detail in dangling_of(verify(storage))] == [
            f"refers to oid 0x{child:016x}, which does not exist"]    # from its referrer
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        storage.undo(deleted, txn)
        storage.tpc_vote(txn)
        storage.tpc_finish(txn)
        assert verify(storage).clean
