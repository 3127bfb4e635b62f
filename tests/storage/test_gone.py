"""Deleted objects are named by the polls of every process (backends/base/poller.py).

A pack, and a history-free ``deleteObject``, remove an object's rows; a poll reads the
rows committed since its last one, so without a record it could never name an object
whose newest revision went before it looked.  Each test keeps a state in one process's
cache (``reader``), deletes the object through another (``writer``), and checks that the
reader's next poll names it and its loads say it is gone instead of serving the state
it kept.
"""
from __future__ import annotations

import time
from typing import Any

import pytest
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import POSKeyError
from ZODB.utils import u64, z64

from tests.model.nodes import node_state
from zodbsql.storage import pack as packing

ROOT = z64


def _commit(instance: Any, states: dict[bytes, bytes], deleted: tuple[bytes, ...] = ()) -> bytes:
    """Commit ``states`` (and the deletion of ``deleted``) from ``instance``, at the
    current serials."""
    instance.poll_invalidations()
    txn = TransactionMetaData()
    instance.tpc_begin(txn)
    for oid, state in states.items():
        instance.store(oid, _serial(instance, oid), state, "", txn)
    for oid in deleted:
        instance.deleteObject(oid, _serial(instance, oid), txn)
    instance.tpc_vote(txn)
    tid: bytes = instance.tpc_finish(txn)
    return tid


def _serial(instance: Any, oid: bytes) -> bytes:
    try:
        serial: bytes = instance.load(oid)[1]
        return serial
    except POSKeyError:
        return z64


def _garbage(writer: Any, value: int) -> tuple[bytes, bytes]:
    """An object made and unlinked again from the root: garbage; and its state."""
    oid = writer.new_oid()
    _commit(writer, {ROOT: node_state(value, {u64(oid)}), oid: node_state(value + 1, set())})
    _commit(writer, {ROOT: node_state(value + 2, set())})
    return oid, writer.load(oid)[0]


def _kept_by(reader: Any, oid: bytes, state: bytes) -> None:
    """The reader's poll and load leave ``state`` in its process's cache."""
    reader.poll_invalidations()
    assert reader.load(oid)[0] == state
    assert reader.shared.cache.get(u64(oid), reader._snapshot) is not None


def _pack(storage: Any) -> None:
    time.sleep(0.01)    # the pack time after the last commit
    packing.pack(storage, time.time(), gc=True)


def _gone_for(reader: Any, oid: bytes) -> None:
    invalidated = reader.poll_invalidations()
    assert invalidated is None or oid in invalidated
    with pytest.raises(POSKeyError):
        reader.load(oid)


def _garbage_a_reader_keeps(storage_factory: Any) -> tuple[Any, Any, Any, Any, bytes, bytes]:
    """A writer's and a reader's storage (two processes) and an instance of each; a
    garbage object the writer committed and the reader keeps in its cache: (writer's
    storage, reader's storage, writer, reader, oid, state)."""
    writer_storage, reader_storage = storage_factory.open(), storage_factory.open()
    writer, reader = writer_storage.new_instance(), reader_storage.new_instance()
    _commit(writer, {ROOT: node_state(0, set())})
    oid, state = _garbage(writer, 1)
    _kept_by(reader, oid, state)
    return writer_storage, reader_storage, writer, reader, oid, state


def test_a_newer_revision_a_pack_removed_before_the_poll(storage_factory: Any) -> None:
    """The reader keeps revision 1; the writer commits revision 2 and packs it away (the
    object is garbage) before the reader polls: no poll can name revision 2 by its row."""
    writer_storage, reader_storage, writer, reader, oid, state = _garbage_a_reader_keeps(
        storage_factory)
    _commit(writer, {oid: node_state(10, set())})
    _pack(writer_storage)
    _gone_for(reader, oid)
    fresh = reader_storage.new_instance()
    fresh.poll_invalidations()
    with pytest.raises(POSKeyError):
        fresh.load(oid)


def test_an_object_a_pack_removed_is_named_once(storage_factory: Any) -> None:
    """The reader's poll names each removed object once: the next poll, with nothing
    deleted since, names none."""
    writer_storage, reader_storage, writer, reader, oid, state = _garbage_a_reader_keeps(
        storage_factory)
    _pack(writer_storage)
    _commit(writer, {ROOT: node_state(20, set())})
    assert reader.poll_invalidations() == [ROOT, oid]
    _commit(writer, {ROOT: node_state(21, set())})
    assert reader.poll_invalidations() == [ROOT]


def test_a_deletion_is_named_once_though_no_commit_came_after_it(storage_factory: Any) -> None:
    """A pack stamps its record with the last tid, which the reader has polled already:
    the reader's polls after it (the first may be skipped where the commit watch heard
    of no commit: the pack commits none) name the object once, the one after a later
    commit too (records are asked for by number, not by the tid they are stamped with)."""
    writer_storage, reader_storage, writer, reader, oid, state = _garbage_a_reader_keeps(
        storage_factory)
    _pack(writer_storage)
    first = reader.poll_invalidations()
    assert first is not None
    _commit(writer, {ROOT: node_state(20, set())})
    second = reader.poll_invalidations()
    assert second is not None and ROOT in second
    assert (first + second).count(oid) == 1
    with pytest.raises(POSKeyError):
        reader.load(oid)


def test_a_deletion_named_before_an_own_commit_is_not_named_again(
        storage_factory: Any) -> None:
    """The reader's next start after its own commit, made alone, takes the commit for a
    poll's changes; the poll after that one asks for the deletion records from where
    the reader's last poll read them, so an object it named gone is not named again."""
    writer_storage, reader_storage, writer, reader, oid, state = _garbage_a_reader_keeps(
        storage_factory)
    _pack(writer_storage)
    _commit(writer, {ROOT: node_state(20, set())})
    assert reader.poll_invalidations() == [ROOT, oid]
    _commit(reader, {ROOT: node_state(21, set())})   # alone: polled just before
    assert reader.poll_invalidations() == []          # its own commit, no statement
    _commit(writer, {ROOT: node_state(22, set())})
    assert reader.poll_invalidations() == [ROOT]


def test_a_deletion_is_named_by_another_process(storage_factory: Any) -> None:
    """``deleteObject`` (IExternalGC): history-preserving a revision says so; history-
    free the row goes at once, and the record names it."""
    writer_storage, reader_storage, writer, reader, oid, state = _garbage_a_reader_keeps(
        storage_factory)
    _commit(writer, {}, deleted=(oid,))
    _gone_for(reader, oid)


def test_an_instance_that_missed_pruned_records_forgets_everything(
        storage_factory: Any) -> None:
    """Records live until the pack after next: an instance that did not poll across
    three packs that deleted can't be told what went, so its poll invalidates
    everything (None), and its process's cache drops what it kept."""
    writer_storage, reader_storage, writer, reader, oid, state = _garbage_a_reader_keeps(
        storage_factory)
    for value in (100, 200, 300):
        _garbage(writer, value)
        _pack(writer_storage)
    assert reader.poll_invalidations() is None
    with pytest.raises(POSKeyError):
        reader.load(oid)
    assert reader.poll_invalidations() == []    # and then it is up to date again
    conn = writer_storage.shared.connect()
    try:    # the records at or below the floor went (the first pack's)
        floor, oldest = conn.fetchone(
            "SELECT floor_seq, (SELECT MIN(seq) FROM object_gone) FROM gone_row")
        conn.rollback()
    finally:
        conn.close()
    assert 0 < floor < oldest


def test_a_database_made_before_the_record_gets_it(storage_factory: Any) -> None:
    """Opened read-only it polls without the record; opened for writing it is added,
    and deletions are named from then on."""
    made = storage_factory.open()
    _commit(made.new_instance(), {ROOT: node_state(0, set())})
    conn = made.shared.connect()
    try:
        conn.begin_write()
        conn.execute("DROP VIEW gone_oids")
        for table in ("object_gone", "gone_row"):
            conn.execute(f"DROP TABLE {table}")
        conn.commit()
    finally:
        conn.close()
    made.close()
    read_only = storage_factory.open(read_only=True)
    assert read_only.shared.backend.poller.reads_gone is False
    # PostgreSQL's listener reads the last tid without the record too: it listens.
    assert getattr(read_only.shared.watch, "listening", True) is True
    looking = read_only.new_instance()
    looking.poll_invalidations()
    assert looking.load(ROOT)[0] == node_state(0, set())
    # Its poll statement without the record: the last tid, no change, no record, no floor.
    last = u64(looking.lastTransaction())
    conn = read_only.shared.connect()
    try:
        polled = read_only.shared.backend.poller.poll(conn, last, 0)
    finally:
        conn.close()
    assert tuple(polled) == (last, [], [], 0, 0, True, False)
    writer_storage = storage_factory.open()
    assert writer_storage.shared.backend.poller.reads_gone is True
    reader = storage_factory.open().new_instance()
    writer = writer_storage.new_instance()
    oid, state = _garbage(writer, 1)
    _kept_by(reader, oid, state)
    _commit(writer, {oid: node_state(10, set())})
    _pack(writer_storage)
    _gone_for(reader, oid)
    assert u64(reader.lastTransaction()) == u64(writer.lastTransaction())
    # Their sessions (history-free: a read transaction each) end now, not when the
    # collector finds them: the factory drops the schema next.
    for instance in (looking, reader, writer):
        instance.release()


def test_a_poll_by_tid_lists_what_went_since_and_says_when_it_cannot(
        storage_factory: Any) -> None:
    """A caller with a tid and no record number (the persistent and Redis caches'
    checks): the records stamped from its tid on, and ``complete`` False once those
    made after it may have been pruned."""
    writer_storage = storage_factory.open()
    writer = writer_storage.new_instance()
    _commit(writer, {ROOT: node_state(0, set())})
    oid, _ = _garbage(writer, 1)
    since = u64(writer.lastTransaction())
    _pack(writer_storage)
    poller = writer_storage.shared.backend.poller
    conn = writer_storage.shared.connect()
    try:
        polled = poller.poll(conn, since)
        assert (polled.gone, polled.complete) == ([u64(oid)], True)
        assert polled.gone_seq == 1 and polled.gone_floor == 0
        assert poller.poll(conn, since, polled.gone_seq).gone == []
        first = poller.poll(conn, None)
        assert (first.upto, first.changes, first.gone, first.gone_seq) == (since, [], [], 1)
        conn.rollback()
        for value in (100, 200):
            _garbage(writer, value)
            _pack(writer_storage)
        later = poller.poll(conn, since)     # the first pack's record is pruned
        assert later.gone_floor == 1 and later.complete is False
        assert u64(oid) not in later.gone and len(later.gone) == 2   # the later two
        conn.rollback()
        # The same poll as a snapshot's start (PostgreSQL sends it with its BEGIN,
        # as one query): the same answer, incomplete too.
        started = poller.begin_and_poll(conn, since, None, False, 0)
        assert (started.gone_floor, started.complete, started.gone) == (
            1, False, later.gone)
        # From the last tid of the prune on (not at it: a deletion there may come
        # before or after a poll of that tid), nothing pruned is missed.
        conn.rollback()
        _commit(writer, {ROOT: node_state(300, set())})
        assert poller.poll(conn, u64(writer.lastTransaction())).complete is True
        conn.rollback()
        # Packs that delete nothing: once the records before them are pruned (two
        # packs), a pack that prunes none leaves the floor where it was, and a poll
        # from a tid after the floor is still complete.  (A commit before each: a
        # history-preserving pack to the packed tid again does nothing.)
        for value in (310, 320):
            _commit(writer, {ROOT: node_state(value, set())})
            _pack(writer_storage)
        _commit(writer, {ROOT: node_state(400, set())})
        after = u64(writer.lastTransaction())
        _commit(writer, {ROOT: node_state(410, set())})
        _pack(writer_storage)
        assert poller.poll(conn, after).complete is True
        conn.rollback()
    finally:
        conn.close()


def test_a_poll_of_the_last_tid_alone_is_read_as_such() -> None:
    """A database opened read-only without the record: the first poll reads one column."""
    from zodbsql.backends.base.poller import Poller
    assert Poller.parse_poll([(7,)]) == (7, [], [], 0, 0, True, False)
    assert Poller.parse_poll([(0, 0, 7), (2, 3, 5), (3, 0, 6), (4, 11, 4), (1, 12, 7)],
                             6, None) == (7, [(12, 7)], [11], 5, 3, False, False)
    assert Poller.parse_poll([(0, 0, 7), (2, 3, 5), (3, 0, 6)], 7, None).complete is True
    assert Poller.parse_poll([(0, 0, 7), (2, 3, 5), (3, 0, 6)], 6, 4).complete is True


def test_a_commit_records_only_the_objects_it_deleted(storage_factory: Any,
                                                      tmp_path: Any) -> None:
    """History-free, a commit that changes one object and deletes another records the
    deleted one alone; a commit with a blob (which runs the same steps) and no
    deletion records nothing.  (History-preserving, a deletion is a revision: no
    record.)"""
    keep_history = storage_factory.param.keep_history
    storage = storage_factory.open(blob_dir=str(tmp_path / "blobs"))
    writer = storage.new_instance()
    _commit(writer, {ROOT: node_state(0, set())})
    kept, gone = writer.new_oid(), writer.new_oid()
    _commit(writer, {kept: node_state(1, set()), gone: node_state(2, set())})
    poller = storage.shared.backend.poller
    conn = storage.shared.connect()
    try:
        first = poller.poll(conn, None)
        conn.rollback()
        _commit(writer, {kept: node_state(3, set())}, deleted=(gone,))
        polled = poller.poll(conn, first.upto, first.gone_seq)
        conn.rollback()
        assert polled.gone == ([] if keep_history else [u64(gone)])
        assert polled.gone_seq == first.gone_seq + (0 if keep_history else 1)
        blob_file = tmp_path / "content"
        blob_file.write_bytes(b"a blob, nothing deleted")
        txn = TransactionMetaData()
        writer.tpc_begin(txn)
        writer.storeBlob(writer.new_oid(), z64, node_state(4, set()), str(blob_file), "",
                         txn)
        writer.tpc_vote(txn)
        writer.tpc_finish(txn)
        after = poller.poll(conn, polled.upto, polled.gone_seq)
        assert (after.gone, after.gone_seq) == ([], polled.gone_seq)
    finally:
        conn.rollback()
        conn.close()
        writer.release()
