"""Prefetch: states loaded ahead into the shared cache, in one statement, never outside
the snapshot of the instance that loads them.

``prefetch(oids)`` (ZODB's ``Connection.prefetch``) loads the states it is given.
Statements are counted with ``statement_count()``; "another process" is a second storage
opened on the same database, with its own cache.
"""
from __future__ import annotations

import io
import pickle
from typing import Any, Iterator

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB import POSException

CHILDREN = 500


def fill(db: Any, count: int = CHILDREN) -> list[bytes]:
    """A mapping of ``count`` small mappings under the root; their oids."""
    with db.transaction() as conn:
        conn.root()["items"] = items = PersistentMapping()
        for i in range(count):
            items[i] = PersistentMapping(v=0)
    with db.transaction() as conn:
        return [child._p_oid for child in conn.root()["items"].values()]


def change_all(db: Any, value: int) -> None:
    with db.transaction() as conn:
        for child in conn.root()["items"].values():
            child["v"] = value


def polled(storage: Any) -> Any:
    """A new instance of ``storage`` at the newest commit."""
    instance = storage.new_instance()
    instance.poll_invalidations()
    return instance


def value_of(instance: Any, oid: bytes) -> int:
    """The ``v`` of the child mapping ``oid`` as ``instance`` loads it."""
    state, _ = instance.load(oid)
    unpickler = pickle.Unpickler(io.BytesIO(state))
    unpickler.load()                 # the class
    return int(unpickler.load()["data"]["v"])


@pytest.fixture
def storage_and_db(storage_factory: Any) -> Iterator[tuple[Any, Any]]:
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    yield storage, db
    db.close()
    transaction.abort()


def test_prefetch_is_one_statement_and_serves_the_loads(storage_and_db: Any) -> None:
    storage, db = storage_and_db
    oids = fill(db)
    storage.shared.cache.clear()
    instance = polled(storage)
    before = storage.statement_count()
    instance.prefetch(oids)
    assert storage.statement_count() - before == 1
    before = storage.statement_count()
    assert [value_of(instance, oid) for oid in oids] == [0] * CHILDREN
    assert storage.statement_count() - before == 0
    before = storage.statement_count()
    instance.prefetch(oids)              # all cached: nothing to ask
    assert storage.statement_count() - before == 0
    instance.release()


def test_prefetch_skips_what_does_not_exist(storage_and_db: Any) -> None:
    storage, db = storage_and_db
    oids = fill(db, 3)
    instance = polled(storage)
    missing = b"\x00" * 7 + b"\x7f"
    instance.prefetch(oids + [missing])
    assert [value_of(instance, oid) for oid in oids] == [0, 0, 0]
    with pytest.raises(POSException.POSKeyError):
        instance.load(missing)
    instance.release()


def test_prefetch_at_an_old_snapshot_reads_that_snapshot(storage_factory: Any,
                                                         storage_and_db: Any) -> None:
    storage, db = storage_and_db
    other = storage_factory.open(storage_factory.path)   # another process
    oids = fill(db)
    storage.shared.cache.clear()
    old = polled(storage)
    change_all(ZODB.DB(other), 1)    # committed after old's snapshot
    new = polled(storage)
    new.prefetch(oids)               # newer revisions in the shared cache
    old.prefetch(oids)               # old's own revisions, from the database
    assert {value_of(old, oid) for oid in oids} == {0}
    assert {value_of(new, oid) for oid in oids} == {1}
    third = polled(storage)          # a newer snapshot reads the newest from the cache
    before = storage.statement_count()
    assert {value_of(third, oid) for oid in oids} == {1}
    assert storage.statement_count() - before == 0
    for instance in (old, new, third):
        instance.release()
