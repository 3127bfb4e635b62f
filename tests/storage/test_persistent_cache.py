"""The state cache saved to cache-persistent-dir and read back after a restart.

A restart here is a storage closed and another opened on the same database, in this
process (``tests/cli/test_bench.py`` runs the bench's ``restart`` test, a new process).
"""
from __future__ import annotations

import logging
import pathlib
from typing import Any

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping

from zodbsql.cache import cachefile
from zodbsql.storage import SQLStorage

COUNT = 300


def open_cached(factory: Any, directory: pathlib.Path, **options: Any) -> SQLStorage:
    return factory.open(cache_persistent_dir=str(directory), **options)


def loaded(storage: SQLStorage) -> SQLStorage:
    """``storage`` once its cache file was read back."""
    persistent = storage.shared.persistent
    assert persistent is not None
    assert persistent.loaded.wait(60)
    return storage


def fill(storage: SQLStorage, count: int = COUNT) -> None:
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        root = conn.root()
        for i in range(count):
            root[i] = PersistentMapping(value=i)
    db.close()


def filled_and_saved(factory: Any, tmp_path: pathlib.Path) -> pathlib.Path:
    """A directory holding the cache file of a process that read every object."""
    fill(factory.open())
    directory = tmp_path / "cache"
    first = loaded(open_cached(factory, directory))
    read_all(first)
    first.close()
    return directory


def read_all(storage: SQLStorage, count: int = COUNT) -> tuple[dict[int, Any], int]:
    """The value of every object, and the statements the reads took (the first poll
    included)."""
    db = ZODB.DB(storage)
    try:
        before = storage.statement_count()
        conn = db.open()
        root = conn.root()
        values = {i: root[i]["value"] for i in range(count)}
        used = storage.statement_count() - before
        conn.close()
        return values, used
    finally:
        db.close()


def test_a_restart_reads_what_the_last_process_read_from_the_file(storage_factory,
                                                                   tmp_path):
    fill(storage_factory.open())
    directory = tmp_path / "cache"
    first = open_cached(storage_factory, directory, prefetch_count=0)
    loaded(first)
    values, used_cold = read_all(first)
    assert values == {i: i for i in range(COUNT)}
    assert used_cold >= COUNT         # one load per object (prefetch off)
    first.close()
    files = list(directory.glob("*.states"))
    assert len(files) == 1

    second = loaded(open_cached(storage_factory, directory, prefetch_count=0))
    persistent = second.shared.persistent
    assert persistent is not None
    assert persistent.adopted >= COUNT
    values, used_warm = read_all(second)
    assert values == {i: i for i in range(COUNT)}
    assert used_warm <= 3               # the polls; no object load
    second.close()


def test_objects_changed_while_the_process_was_down_are_not_served_stale(
        storage_factory, tmp_path):
    directory = filled_and_saved(storage_factory, tmp_path)
    # While it is down, another process changes a third of the objects, deletes
    # one from the root (and adds new ones).
    other = storage_factory.open()
    db = ZODB.DB(other)
    with db.transaction() as conn:
        root = conn.root()
        for i in range(0, COUNT, 3):
            root[i]["value"] = -i
        root[COUNT] = PersistentMapping(value=COUNT)
    db.close()

    second = loaded(open_cached(storage_factory, directory))
    persistent = second.shared.persistent
    assert persistent is not None and persistent.changes >= COUNT // 3
    values, _ = read_all(second, COUNT + 1)
    assert values == {i: (-i if i % 3 == 0 and i < COUNT else i) for i in range(COUNT + 1)}
    second.close()


def test_changes_after_the_read_back_are_seen(storage_factory, tmp_path):
    """The index the read-back extended goes on with the polls of the instances."""
    directory = filled_and_saved(storage_factory, tmp_path)
    second = loaded(open_cached(storage_factory, directory))
    db = ZODB.DB(second)
    with db.transaction() as conn:
        conn.root()[5]["value"] = "new"
    writer = ZODB.DB(storage_factory.open())
    with writer.transaction() as conn:
        conn.root()[7]["value"] = "other"
    writer.close()
    conn = db.open()
    assert conn.root()[5]["value"] == "new"
    assert conn.root()[7]["value"] == "other"
    conn.close()
    db.close()


def test_processes_sharing_the_directory_merge_their_states(storage_factory, tmp_path):
    fill(storage_factory.open())
    directory = tmp_path / "cache"
    one = loaded(open_cached(storage_factory, directory))
    two = loaded(open_cached(storage_factory, directory))
    for storage, part in ((one, range(0, COUNT // 2)), (two, range(COUNT // 2, COUNT))):
        db = ZODB.DB(storage)
        conn = db.open()
        for i in part:
            conn.root()[i]["value"]
        conn.close()
        db.close()
    (path,) = directory.glob("*.states")
    _, segments = cachefile.decode(path.read_bytes())
    oids = [oid for segment in segments for oid, _, _ in segment.entries]
    assert len(oids) == len(set(oids)) >= COUNT + 1      # the root too


def test_a_pack_since_the_save_drops_the_file(storage_factory, tmp_path):
    directory = filled_and_saved(storage_factory, tmp_path)
    packer = storage_factory.open()
    from ZODB.serialize import referencesf
    import time
    packer.pack(time.time(), referencesf)
    packer.close()
    second = loaded(open_cached(storage_factory, directory))
    assert second.shared.persistent is not None
    assert second.shared.persistent.found == 0
    assert read_all(second)[0] == {i: i for i in range(COUNT)}
    second.close()


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "garbage"])
def test_a_damaged_file_is_ignored_with_a_warning(storage_factory, tmp_path, caplog,
                                                  damage):
    directory = filled_and_saved(storage_factory, tmp_path)
    (path,) = directory.glob("*.states")
    data = path.read_bytes()
    if damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "corrupt":
        data = data[:200] + bytes([data[200] ^ 0xFF]) + data[201:]
    else:
        data = b"not a cache file at all"
    path.write_bytes(data)
    with caplog.at_level(logging.WARNING, logger="zodbsql"):
        second = loaded(open_cached(storage_factory, directory))
    assert "ignoring the state cache file" in caplog.text
    assert read_all(second)[0] == {i: i for i in range(COUNT)}
    second.close()
    # The next save replaced it with a whole file.
    cachefile.decode(path.read_bytes())


def test_the_file_stays_within_the_cache_size(storage_factory, tmp_path):
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        for i in range(200):
            conn.root()[i] = PersistentMapping(value=i, blob=b"x" * 20_000)
    db.close()
    directory = tmp_path / "cache"
    small = loaded(open_cached(storage_factory, directory, cache_size_mb=1))
    read_all(small, 200)
    small.close()
    (path,) = directory.glob("*.states")
    assert path.stat().st_size <= 1024 * 1024 + 4096


def test_a_file_of_another_database_or_mode_is_not_read(tmp_path):
    identity = cachefile.Identity("a" * 32, True, None)
    segment = cachefile.Segment(5, [(1, 4, b"state")])
    cachefile.save(tmp_path, identity, segment, 1 << 20)
    path = tmp_path / identity.file_name
    assert cachefile.read(path, identity)[0].entries == [(1, 4, b"state")]
    for other in (cachefile.Identity("b" * 32, True, None),
                  cachefile.Identity("a" * 32, False, None),
                  cachefile.Identity("a" * 32, True, "17")):
        assert cachefile.read(path, other) == []


def test_a_read_only_storage_without_an_identity_runs_without_the_file(storage_factory,
                                                                        tmp_path, caplog):
    fill(storage_factory.open())
    with caplog.at_level(logging.WARNING, logger="zodbsql"):
        storage = open_cached(storage_factory, tmp_path / "cache", read_only=True)
    assert storage.shared.persistent is None
    assert "no database_id" in caplog.text
    assert read_all(storage)[0][3] == 3
    transaction.abort()


def test_a_check_overtaken_by_a_first_poll_is_refused():
    """The read-back's poll ended at tid 10; an instance's first poll, later, started
    the index at 20: what changed in (10, 20] is known to neither, so the index must
    not reach back to the file's tid."""
    from zodbsql.cache import StateCache
    cache = StateCache(1 << 20)
    cache.after_poll(20, 20, [])
    assert not cache.cover(5, 10, [(1, 7)])
    assert cache.base == 20
    def value(tid: int, state: bytes) -> bytes:
        return tid.to_bytes(8, "big") + state
    assert cache.adopt([(2, 3, value(3, b"old"))], 5) == (0, False)
    assert cache.cover(5, 25, [(1, 7), (3, 22)])
    assert (cache.base, cache.polled) == (5, 25)
    assert cache.adopt([(1, 4, value(4, b"stale")), (2, 3, value(3, b"kept")),
                        (3, 3, value(3, b"stale"))], 5) == (1, True)
    assert cache.get(2, 25) == (b"kept", 3)
    assert cache.get(1, 25) is None and cache.get(3, 25) is None
