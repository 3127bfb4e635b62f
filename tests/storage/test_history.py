"""history(), undoLog() and undo() as ZODB applications call them, and the iterator.

* ``history`` gives each revision's transaction metadata, newest first, ``size`` at most.
* ``undoLog(first, last, filter)`` pages through the undoable transactions, newest
  first, however many the filter drops; a negative ``last`` is a count from ``first``.
* ``undo`` accepts the ids undoLog gives and their base64 form (older ZODB), and refuses
  what it cannot undo: an unknown id, a packed transaction, a history-free storage.
* The iterator lists every transaction once, also across its batches.
"""
from __future__ import annotations

import base64
import pickle
import re
from typing import Any

import pytest
import transaction
from persistent.mapping import PersistentMapping
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import ConflictError, POSKeyError, UndoError
from ZODB.TimeStamp import TimeStamp
from ZODB.utils import oid_repr, p64, u64, z64

from tests.storage.restoring import restore_consecutive
from tests.storage.test_verify import CORRUPT, DELETE_CURRENT, run_sql
from zodbsql.errors import CorruptRecordError
from zodbsql.storage import pack

HP_ONLY = (True,)
NO_UNDO = "a history-free storage keeps no transactions to undo"


def _commit_numbered(db: Any, count: int) -> tuple[bytes, list[bytes]]:
    """``count`` transactions described "t0", "t1", ... changing one object; returns
    its oid and the tids, oldest first."""
    tids = []
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    conn.root()["x"] = PersistentMapping(v=-1)
    tm.commit()
    for i in range(count):
        conn.root()["x"]["v"] = i
        tm.get().note(f"t{i}")
        tm.commit()
        tids.append(conn.root()["x"]._p_serial)
    oid = conn.root()["x"]._p_oid
    conn.close()
    return oid, tids


def test_history_gives_each_revision_with_its_transaction(storage_factory: Any,
                                                           storage_and_db: Any) -> None:
    storage, db = storage_and_db
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    conn.root()["x"] = PersistentMapping(v=1)
    tm.commit()
    x = conn.root()["x"]
    x["v"] = "two"
    txn = tm.get()
    txn.setUser("alice")
    txn.note("second")
    txn.setExtendedInfo("reason", "test")
    tm.commit()
    state, serial = storage.load(x._p_oid)
    newest = storage.history(x._p_oid, 10)[0]
    assert {key: newest[key] for key in ("tid", "serial", "size", "time")} == {
        "tid": serial, "serial": serial, "size": len(state),
        "time": TimeStamp(serial).timeTime()}
    if storage_factory.param.keep_history:
        assert (newest["user_name"], newest["description"], newest["reason"]) == (
            b"/ alice", b"second", "test")
        assert len(storage.history(x._p_oid, 10)) == 2
        assert [h["tid"] for h in storage.history(x._p_oid, 1)] == [serial]
        assert [h["tid"] for h in storage.history(x._p_oid)] == [serial]   # size 1
    else:
        assert (newest["user_name"], newest["description"]) == (b"", b"")
        assert len(storage.history(x._p_oid, 10)) == 1
    missing = p64(u64(x._p_oid) + 1000)
    with pytest.raises(POSKeyError) as raised:
        storage.history(missing)
    assert raised.value.args == (missing,)
    conn.close()


class TestUndoLog:
    history_modes = HP_ONLY
    history_modes_reason = NO_UNDO

    def test_undo_info_keeps_the_entries_its_specification_matches(
            self, storage_and_db: Any) -> None:
        """``undoInfo(first, last, specification)``: only the entries whose every key
        the specification names holds its value; without one, every entry."""
        storage, db = storage_and_db
        _commit_numbered(db, 6)

        def info(*args: Any) -> list[bytes]:
            return [entry["description"] for entry in storage.undoInfo(*args)]
        assert info(0, 3) == [b"t5", b"t4", b"t3"]
        assert info(0, 3, {}) == [b"t5", b"t4", b"t3"]
        assert info(0, 20, {"description": b"t2"}) == [b"t2"]
        assert info(0, 20, {"description": b"t2", "user_name": b"nobody"}) == []

    def test_pages_newest_first_across_batches_and_filters(self, storage_and_db: Any) -> None:
        storage, db = storage_and_db
        _, tids = _commit_numbered(db, 45)
        newest = [f"t{i}".encode() for i in reversed(range(45))]

        def log(*args: Any) -> list[bytes]:
            return [entry["description"] for entry in storage.undoLog(*args)]
        assert log(0, 45) == newest
        assert log(3, 8) == newest[3:8]
        assert log(0, -4) == newest[:4]
        assert log(2, -3) == newest[2:5]

        def tenth(entry: dict[str, Any]) -> bool:
            text = entry["description"]
            return text.startswith(b"t") and int(text[1:]) % 10 == 0
        # Three batches of the log to find all five (t40 ... t0), each once.
        assert log(0, 5, tenth) == [b"t40", b"t30", b"t20", b"t10", b"t0"]
        assert log(1, 3, tenth) == [b"t30", b"t20"]
        entry = storage.undoLog(0, 1)[0]
        assert entry["id"] == tids[-1]
        assert entry["time"] == TimeStamp(tids[-1]).timeTime()

    def test_packed_transactions_leave_the_log_and_cannot_be_undone(
            self, storage_and_db: Any) -> None:
        storage, db = storage_and_db
        _, tids = _commit_numbered(db, 3)
        pack.pack(storage, TimeStamp(tids[-1]).timeTime() + 1)   # now: all packed
        assert storage.undoLog(0, 10) == []
        for tid in (tids[-1], tids[0]):
            with pytest.raises(UndoError):
                db.undo(tid)
                transaction.commit()
            transaction.abort()


class TestUndoIds:
    history_modes = HP_ONLY
    history_modes_reason = NO_UNDO

    @pytest.mark.parametrize("form", ["bytes", "base64-bytes", "base64-str"])
    def test_undo_accepts_the_id_and_its_base64_form(self, storage_and_db: Any,
                                                     form: str) -> None:
        storage, db = storage_and_db
        oid, tids = _commit_numbered(db, 2)
        encoded = base64.encodebytes(tids[-1]).rstrip(b"\n")
        given = {"bytes": tids[-1], "base64-bytes": encoded,
                 "base64-str": encoded.decode()}[form]
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        assert storage.undo(given, txn) == (tids[-1], [oid])
        storage.tpc_vote(txn)
        storage.tpc_finish(txn)
        with db.transaction() as conn:
            assert conn.root()["x"]["v"] == 0

    @pytest.mark.parametrize("bad", [b"\0" * 7, b"not base64!", "AAAAAAAAAAAAAAA=", b""])
    def test_undo_refuses_an_id_that_names_no_transaction(self, storage_and_db: Any,
                                                          bad: Any) -> None:
        storage, db = storage_and_db
        _commit_numbered(db, 1)
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        as_bytes = bad.encode() if isinstance(bad, str) else bad
        with pytest.raises(UndoError, match=re.escape(f"invalid transaction id {as_bytes!r}")):
            storage.undo(bad, txn)
        with pytest.raises(UndoError) as unknown:
            storage.undo(p64(u64(storage.lastTransaction()) + 1), txn)
        assert str(unknown.value) == "Undo error None: Invalid transaction id"
        storage.tpc_abort(txn)


class TestUndoEdges:
    history_modes = HP_ONLY
    history_modes_reason = NO_UNDO

    def test_undoing_a_change_and_the_creation_at_once_removes_the_object(
            self, storage_and_db: Any) -> None:
        """Both undone in one transaction: the object's record there is a deletion that
        copies no earlier revision (a copy of the database must delete it too)."""
        storage, db = storage_and_db
        with db.transaction() as conn:
            conn.root()["y"] = PersistentMapping(v=1)
        created = storage.lastTransaction()
        with db.transaction() as conn:
            y = conn.root()["y"]._p_oid
            conn.root()["y"]["v"] = 2
        changed = storage.lastTransaction()
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        storage.undo(changed, txn)
        storage.undo(created, txn)
        storage.tpc_vote(txn)
        storage.tpc_finish(txn)
        last = list(storage.iterator(storage.lastTransaction()))[0]
        assert {r.oid: (r.data, r.data_txn) for r in last}[y] == (None, None)
        with pytest.raises(POSKeyError):
            storage.load(y)

    def test_a_stale_store_then_undo_of_the_same_object_still_conflicts(
            self, storage_and_db: Any) -> None:
        storage, db = storage_and_db
        oid, tids = _commit_numbered(db, 2)
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        storage.store(oid, tids[0], storage.load(oid)[0], "", txn)  # not the current
        storage.undo(tids[-1], txn)
        with pytest.raises(ConflictError):
            storage.tpc_vote(txn)
        storage.tpc_abort(txn)

    @pytest.mark.parametrize("undone", ["creation", "change", "change-then-deleted"])
    def test_undo_of_what_a_later_transaction_changed_is_refused(self, storage_and_db: Any,
                                                                 undone: str) -> None:
        """Undoing the creation, or a change, of an object a later transaction changed
        again (and that cannot merge the two) or deleted fails with UndoError naming it."""
        storage, db = storage_and_db
        oid, tids = _commit_numbered(db, 2)
        created = storage.history(oid, 10)[-1]["tid"]
        if undone == "change-then-deleted":
            txn = TransactionMetaData()
            storage.tpc_begin(txn)
            storage.deleteObject(oid, tids[-1], txn)
            storage.tpc_vote(txn)
            storage.tpc_finish(txn)
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        with pytest.raises(UndoError) as refused:
            storage.undo(created if undone == "creation" else tids[0], txn)
        assert str(refused.value) == (
            f"Undo error {oid_repr(oid)}: Some data were modified by a later transaction")
        storage.tpc_abort(txn)

    @pytest.mark.parametrize("damage", ["corrupt", "current-row-gone"])
    def test_undo_in_a_damaged_database_names_the_object(self, storage_and_db: Any,
                                                         damage: str) -> None:
        storage, db = storage_and_db
        oid, tids = _commit_numbered(db, 2)
        if damage == "corrupt":
            run_sql(storage, CORRUPT, (b"not what was stored", u64(oid)))
        else:
            run_sql(storage, DELETE_CURRENT, (u64(oid),))
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        if damage == "corrupt":
            with pytest.raises(CorruptRecordError) as corrupt:
                storage.undo(tids[0], txn)
            assert (corrupt.value.oid, corrupt.value.tid) == (u64(oid), u64(tids[-1]))
        else:
            with pytest.raises(UndoError) as gone:
                storage.undo(tids[0], txn)
            assert str(gone.value) == f"Undo error {oid_repr(oid)}: the object no longer exists"
        storage.tpc_abort(txn)


class TestNoUndoWithoutHistory:
    history_modes = (False,)
    history_modes_reason = "checks that a history-free storage refuses undo (TestUndoIds undoes)"

    def test_undo_log_is_empty_and_undo_refused(self, storage_and_db: Any) -> None:
        storage, db = storage_and_db
        _, tids = _commit_numbered(db, 2)
        assert storage.undoLog(0, 10) == []
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        with pytest.raises(UndoError) as refused:
            storage.undo(tids[-1], txn)
        assert str(refused.value) == "Undo error None: undo needs a history-preserving storage"
        storage.tpc_abort(txn)


def test_iterator_lists_consecutive_tids_across_batches(storage_factory: Any) -> None:
    """Transactions with consecutive tids (as a copy may restore them), more than one
    batch of the iterator: each listed once, in order, and ranges cut exactly."""
    storage = storage_factory.open()
    tids = restore_consecutive(storage, 105)
    listed = list(storage.iterator())
    assert [t.tid for t in listed][-105:] == tids
    # Not packed, no user, no description: as restored, in both modes.
    assert {(t.status, t.user, t.description) for t in listed} == {(" ", b"", b"")}
    assert [t.tid for t in storage.iterator(tids[99], tids[101])] == tids[99:102]
    assert [t.tid for t in storage.iterator(tids[50], tids[50])] == [tids[50]]
    assert [[r.oid for r in t] for t in storage.iterator(tids[7], tids[7])] == [[p64(8)]]


def test_record_iternext_visits_every_current_record_once(storage_and_db: Any) -> None:
    """Each existing object once, in oid order, with its current serial and state; an
    object deleted (deleteObject) is not among them."""
    storage, db = storage_and_db
    oid, tids = _commit_numbered(db, 2)
    with db.transaction() as conn:
        conn.root()["gone"] = PersistentMapping()
    with db.transaction() as conn:
        gone = conn.root()["gone"]._p_oid
        del conn.root()["gone"]
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    storage.deleteObject(gone, storage.load(gone)[1], txn)
    storage.tpc_vote(txn)
    storage.tpc_finish(txn)
    seen = []
    following = None
    while True:
        found, serial, state, following = storage.record_iternext(following)
        assert storage.load(found) == (state, serial)
        seen.append(found)
        if following is None:
            break
    assert seen == [p64(0), oid]


def test_record_iternext_of_objects_one_transaction_wrote(storage_and_db: Any) -> None:
    """Objects whose current revisions one commit wrote, with the root: each once, with
    its own state (a record is found by its oid and tid together)."""
    storage, db = storage_and_db
    with db.transaction() as conn:
        for name in "abc":
            conn.root()[name] = PersistentMapping(name=name)
    with db.transaction() as conn:
        expected = sorted([p64(0), *(conn.root()[name]._p_oid for name in "abc")])
    seen = []
    following = None
    for _ in range(len(expected) + 1):      # a repeated oid must not loop for ever
        found, serial, state, following = storage.record_iternext(following)
        assert storage.load(found) == (state, serial)
        seen.append(found)
        if following is None:
            break
    assert seen == expected


def test_record_iternext_of_a_database_without_records_says_so(storage_factory: Any) -> None:
    """As FileStorage's, a ValueError: zodbupdate's walk ends there."""
    storage = storage_factory.open()
    with pytest.raises(ValueError, match="^no more records$"):
        storage.record_iternext()


def test_an_iterator_closed_before_its_end_gives_nothing_more(storage_and_db: Any) -> None:
    """``close`` (a copy stopped early) releases the iterator's own connection; the
    iterator then ends instead of reading through a closed connection."""
    storage, db = storage_and_db
    _commit_numbered(db, 3)
    listed = [txn.tid for txn in storage.iterator()]
    assert len(listed) >= 2      # history-free too: root's and x's current revisions
    iterator = storage.iterator()
    assert next(iterator).tid == listed[0]
    iterator.close()
    with pytest.raises(StopIteration):
        next(iterator)
    iterator.close()          # twice: nothing happens


class _ForeignMetadata:
    """Transaction metadata as another tool may have written it: its extension a
    pickled list, not the dict ZODB writes."""
    user = b""
    description = b"foreign"
    extension_bytes = pickle.dumps(["not", "a", "dict"], 3)


def test_an_extension_that_is_not_a_dict_reads_as_empty(storage_factory: Any) -> None:
    storage = storage_factory.open()
    txn = _ForeignMetadata()
    storage.tpc_begin(txn)
    storage.store(p64(0), z64, pickle.dumps({"root": 1}, 3), "", txn)
    storage.tpc_vote(txn)
    storage.tpc_finish(txn)
    entry = storage.history(p64(0), 1)[0]
    assert entry["description"] == (b"foreign" if storage.options.keep_history else b"")
    assert set(entry) == {"time", "tid", "serial", "user_name", "description", "size"}


def test_copy_transactions_from_copies_every_transaction_quietly(
        storage_and_db: Any, storage_factory: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``copyTransactionsFrom`` without a blob-dir (ZODB's copy): every transaction at its
    tid, the states the same, and nothing printed (ZODB's copy prints each record only
    when asked to be verbose)."""
    storage, db = storage_and_db
    oid, tids = _commit_numbered(db, 3)
    copy = storage_factory.open_other()
    capsys.readouterr()
    copy.copyTransactionsFrom(storage)
    assert capsys.readouterr().out == ""
    assert [txn.tid for txn in copy.iterator()] == [txn.tid for txn in storage.iterator()]
    assert copy.load(oid) == storage.load(oid)
