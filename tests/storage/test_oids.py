"""Oid allocation: an oid handed out twice is a new object written over an old one.

* A block holds exactly the oids asked for, after the last block handed out.
* Instances of one database (each its own process in production) never get the same
  oid, however their blocks grow.
* A database whose counter is gone refuses to hand out oids, naming the problem,
  instead of starting again from 1 (the root's neighbours).
"""
from __future__ import annotations

from typing import Any

import pytest
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.utils import u64

from tests.storage.test_verify import run_sql
from zodbsql.errors import SchemaError, ZodbsqlError


def allocated(storage: Any, count: int) -> list[int]:
    conn = storage.backend.connect()
    try:
        return storage.backend.oids.allocate(conn, count)
    finally:
        conn.close()


def remove_oid_counter(storage_factory: Any, storage: Any) -> None:
    """Take away the database's oid counter: its row, PostgreSQL's sequence."""
    run_sql(storage, "DROP SEQUENCE zoid_seq" if storage_factory.param.backend == "postgresql"
            else "DELETE FROM oid_counter", ())


def test_a_block_holds_the_oids_asked_for_after_the_last_block(storage_factory: Any) -> None:
    storage = storage_factory.open()
    first = allocated(storage, 16)
    second = allocated(storage, 5)
    assert first == list(range(first[0], first[0] + 16))
    assert second == list(range(first[-1] + 1, first[-1] + 6))
    assert first[0] >= 1                 # 0 is the root's


def test_instances_of_one_database_never_share_an_oid(storage_factory: Any) -> None:
    """Two instances take turns, in runs long enough for their blocks to grow (16,
    then 1,024, then the allocator's largest within a second), and a third database's
    instance opened later starts above them all."""
    one, two = storage_factory.open(), storage_factory.open()
    handed: list[int] = []
    for run in (1, 20, 1500, 3, 5000):
        for storage in (one, two):
            handed.extend(u64(storage.new_oid()) for _ in range(run))
    assert len(set(handed)) == len(handed)
    later = storage_factory.open()
    assert u64(later.new_oid()) > max(handed)


def test_a_database_without_its_oid_counter_refuses_new_oids(storage_factory: Any) -> None:
    storage = storage_factory.open()
    db = ZODB.DB(storage)         # the root exists: oid 0
    try:
        where = storage.backend.describe()
        remove_oid_counter(storage_factory, storage)
        if storage_factory.param.backend == "postgresql":
            with pytest.raises(ZodbsqlError, match="zoid_seq") as raised:
                storage.new_oid()
            assert where in str(raised.value)
        else:
            with pytest.raises(SchemaError) as refused:
                storage.new_oid()
            assert str(refused.value) == (
                f"{where}: the schema is damaged: the oid counter (table oid_counter) has"
                " no row, so no new oid can be handed out without the risk of reusing one"
                " in use")
        with db.transaction() as conn:       # what exists is still there
            assert conn.root() == {}
    finally:
        db.close()


def raised_to(storage: Any, oid: int) -> None:
    """``ensure_above(oid)`` as a commit that restores ``oid`` calls it."""
    conn = storage.backend.connect()
    try:
        conn.begin_write()
        storage.backend.oids.ensure_above(conn, oid)
        conn.commit()
    finally:
        conn.close()


def test_a_restored_oid_below_the_counter_leaves_it_where_it_is(
        storage_factory: Any) -> None:
    """A copy restoring an object whose oid is below the counter never lowers it: the
    oids handed out before are not handed out again."""
    one = storage_factory.open()
    handed = [u64(one.new_oid()) for _ in range(40)]
    raised_to(storage_factory.open(), 5)
    assert u64(storage_factory.open().new_oid()) > max(handed)
    # (Blocks took the counter past ``handed``.)  Above it, it is raised.
    raised_to(storage_factory.open(), 10 ** 6)
    assert u64(storage_factory.open().new_oid()) == 10 ** 6 + 1


def test_a_new_databases_counter_raised_to_its_first_oid(storage_factory: Any) -> None:
    """A new database (PostgreSQL: a sequence never called, whose next value is its
    last) restoring oid 1 hands out 2 next."""
    storage = storage_factory.open()
    raised_to(storage, 1)
    assert u64(storage_factory.open().new_oid()) == 2


def test_blocks_grow_to_the_allocators_largest_while_oids_run_out(
        storage_factory: Any) -> None:
    """Within a second, 16, then 1,024, then the largest block the allocator gives:
    16,384 from a counter row (one statement whatever the count; on SQLite each
    allocation outside a commit is an fsync), 4,096 from PostgreSQL's sequence (a row
    of ``nextval`` an oid).  The oids handed out follow each other all along."""
    storage = storage_factory.open()
    largest = storage.backend.oids.largest_block
    expected = 4096 if storage_factory.param.backend == "postgresql" else 16384
    assert largest == expected
    first = u64(storage.new_oid())
    handed = [first] + [u64(storage.new_oid()) for _ in range(16 + 1024)]
    assert storage.shared.oid_block == largest
    assert handed == list(range(first, first + len(handed)))
    # The block just taken is all this process's: the counter moved past it whole.
    assert allocated(storage, 1)[0] == first + 16 + 1024 + largest


def test_after_a_pause_a_commit_asks_for_what_the_last_one_that_ran_out_took(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that commits 1,000 new objects now and then: the first such commit
    after a pause takes a block of 16, then one of 1,024; the next, after a pause too,
    one block of what the first took (each ask on SQLite a write transaction and an
    fsync of its own).  After a block taken outside a commit, the next pause starts at
    16 again."""
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    blocks: list[int] = []
    oids = storage.shared.backend.oids
    allocate = oids.allocate

    def noted(conn: Any, count: int = 16) -> list[int]:
        blocks.append(count)
        return allocate(conn, count)
    monkeypatch.setattr(oids, "allocate", noted)

    def commit_after_a_pause(count: int) -> list[int]:
        storage.shared.last_allocation = 0.0         # long ago
        del blocks[:]
        with db.transaction() as conn:
            for i in range(count):
                conn.root()[f"{len(conn.root())}"] = PersistentMapping()
        return list(blocks)
    try:
        with db.transaction() as conn:
            conn.root()["x"] = 1                     # the root's first commit
        storage.shared.free_oids.clear()             # none left over from before
        assert commit_after_a_pause(1000) == [16, 1024]
        assert commit_after_a_pause(1000) == [16 + 1024]
        assert commit_after_a_pause(1000) == [16 + 1024]
        # Oids asked for outside a commit after a pause: the same; the block they took
        # was no commit's, so a commit after the next pause starts at 16.
        storage.shared.free_oids.clear()
        storage.shared.last_allocation = 0.0
        del blocks[:]
        storage.new_oid()
        assert blocks == [16 + 1024]
        storage.shared.free_oids.clear()
        assert commit_after_a_pause(3) == [16]
    finally:
        db.close()
