"""After a lost COMMIT: the portable ``commit_outcome``'s answer for each thing the
database can show (SQLite and MySQL/MariaDB; PostgreSQL looks the commit up in its own
log instead, tests/backends/postgresql).

Each case is the database as real commits left it, and a question as a lost commit
would ask it: its tid, and the checksum of each state it wrote (None: a deletion).
True makes the storage report the commit as done, False lets the application retry
it, None refuses both (``CommitOutcomeUnknown``).  A wrong True loses a transaction; a
wrong False applies it twice.
"""
from __future__ import annotations

import time
from typing import Any, Mapping

import pytest
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.Connection import TransactionMetaData
from ZODB.utils import u64

from zodbsql.backends.base.txncontrol import TransactionControl
from zodbsql.storage import SQLStorage
from zodbsql.storage.records import checksum


def portable(storage: SQLStorage) -> Any:
    txncontrol = storage.shared.backend.txncontrol
    if type(txncontrol).commit_outcome is not TransactionControl.commit_outcome:
        pytest.skip("this backend looks a lost commit up in its own log")
    return txncontrol


def ask(storage: SQLStorage, tid: int | None, written: Mapping[int, int | None]) -> Any:
    """``commit_outcome`` as the storage asks it: on a new connection, the old one
    settled first."""
    shared = storage.shared
    conn, old = shared.connect(), shared.connect()
    try:
        return portable(storage).commit_outcome(conn, old, tid, written,
                                                time.monotonic() + 30)
    finally:
        conn.close()


class Commits:
    """A database where T1 wrote objects a, b, c (new, in that oid order), T2 changed
    c, T3 deleted a, and nothing after; with each state's checksum as its commit wrote
    it."""

    def __init__(self, storage_factory: Any) -> None:
        self.storage = storage_factory.open()
        portable(self.storage)
        db = ZODB.DB(storage_factory.open())
        with db.transaction() as conn:
            root = conn.root()
            for name in "abc":
                root[name] = PersistentMapping(name=name)
        conn = db.open()
        self.oids = {name: u64(conn.root()[name]._p_oid) for name in "abc"}
        conn.close()
        assert self.oids["a"] < self.oids["b"] < self.oids["c"]
        self.tid1 = self.last()
        self.checksums1 = self.checksums("abc")
        with db.transaction() as conn:
            conn.root()["c"]["name"] = "changed"
        db.close()
        self.tid2 = self.last()
        self.checksum_c2 = self.checksums("c")["c"]
        writer = storage_factory.open()
        txn = TransactionMetaData()
        writer.tpc_begin(txn)
        a = self.oids["a"].to_bytes(8, "big")
        writer.deleteObject(a, writer.load(a)[1], txn)
        writer.tpc_vote(txn)
        writer.tpc_finish(txn)
        writer.close()
        self.tid3 = self.last()

    def last(self) -> int:
        shared = self.storage.shared
        conn = shared.connect()
        try:
            return shared.backend.poller.last_tid(conn)
        finally:
            conn.close()

    def checksums(self, names: str) -> dict[str, int]:
        instance = self.storage.new_instance()
        instance.poll_invalidations()
        try:
            found = {name: checksum(instance.load(self.oids[name].to_bytes(8, "big"))[0])
                     for name in names}
            return {name: value for name, value in found.items() if value is not None}
        finally:
            instance.release()

    def written(self, *more: tuple[int, int | None], **by_name: int | None
                ) -> dict[int, int | None]:
        """oid -> checksum, by name (and ``more`` pairs of oids nobody wrote)."""
        return {**{self.oids[name]: value for name, value in by_name.items()}, **dict(more)}


#: An oid no object has: a state asked there was never written.
NOBODY = 10 ** 12


@pytest.fixture
def commits(storage_factory: Any) -> Any:
    made = Commits(storage_factory)
    yield made
    made.storage.close()


def test_an_unknown_tid_or_no_settled_session_cannot_be_told(commits):
    """The COMMIT was lost before finish gave a tid: nothing to look for."""
    assert ask(commits.storage, None, commits.written(a=1)) is None
    assert ask(commits.storage, None, {}) is None


def test_history_preserving_answers(commits):
    storage = commits.storage
    if not storage.shared.options.keep_history:
        pytest.skip("history-preserving: the transaction's own row and revisions")
    c1, tid1, tid3 = commits.checksums1, commits.tid1, commits.tid3
    # Its transaction row and the very states it wrote: it landed.
    assert ask(storage, tid1, commits.written(a=c1["a"], b=c1["b"], c=c1["c"])) is True
    # Later commits changed or deleted some of them: its revisions are still there.
    assert ask(storage, tid1, commits.written(a=c1["a"])) is True
    # A transaction that changed nothing has its row alone.
    assert ask(storage, tid1, {}) is True
    # No transaction at that tid: it never landed, whatever it wrote.
    assert ask(storage, tid1 + 1, commits.written(a=c1["a"])) is False
    assert ask(storage, tid1 + 1, {}) is False
    # A transaction at that tid with other states: another commit's, not ours.
    assert ask(storage, tid1, commits.written(a=c1["a"], b=c1["b"] + 1)) is False
    assert ask(storage, tid1, commits.written(a=c1["b"])) is False
    # One of its objects has no revision at that tid: not ours either.
    assert ask(storage, tid3, commits.written(a=None, b=c1["b"])) is False
    # A deletion is a revision without a state: asked as None, it matches; a state
    # asked where a deletion stands does not, nor a deletion where a state stands.
    assert ask(storage, tid3, commits.written(a=None)) is True
    assert ask(storage, tid3, commits.written(a=c1["a"])) is False
    assert ask(storage, tid1, commits.written(a=None)) is False


def test_history_free_answers(commits):
    storage = commits.storage
    if storage.shared.options.keep_history:
        pytest.skip("history-free: only the current states tell")
    c1, tid1, tid2, tid3 = commits.checksums1, commits.tid1, commits.tid2, commits.tid3
    c2 = commits.checksum_c2
    # An object still holds the state it wrote, at its tid: it landed; also when an
    # object before it (a, deleted since) holds nothing.
    assert ask(storage, tid1, commits.written(b=c1["b"])) is True
    assert ask(storage, tid1, commits.written(a=c1["a"], b=c1["b"])) is True
    assert ask(storage, tid2, commits.written(c=c2)) is True
    assert ask(storage, tid2, commits.written(a=None, c=c2)) is True
    assert ask(storage, tid1, {}) is True           # it changed nothing
    # An object it wrote holds a state older than it: it never landed (it would have
    # replaced that state, and later commits only raise the tid).
    assert ask(storage, tid1 + 1, commits.written(b=c1["b"])) is False
    assert ask(storage, tid3 + 5, commits.written(b=c1["b"], c=c2)) is False
    # None of the objects it wrote a state of exists (their states would be there, or
    # later ones): it never landed.
    assert ask(storage, tid3 + 5, commits.written(a=c1["a"])) is False
    assert ask(storage, tid3 + 5, commits.written((NOBODY, 5), a=c1["a"])) is False
    # Its tid, but another state than it wrote: nothing tells whose; unknown.
    assert ask(storage, tid1, commits.written(b=c1["b"] + 1)) is None
    # What it wrote was changed after it: replaced, or never there; unknown.
    assert ask(storage, tid1, commits.written(c=c1["c"])) is None
    assert ask(storage, tid1, commits.written((NOBODY, 5), c=c1["c"])) is None
    # A deletion of an object now gone: ours or a later one's; unknown.
    assert ask(storage, tid3, commits.written(a=None)) is None
    assert ask(storage, tid3, commits.written((NOBODY, None), a=None)) is None


def test_a_lingering_mysql_session_is_killed_before_the_question(storage_factory,
                                                                 monkeypatch):
    """MySQL: the old session is still there after its connection was closed (here its
    close does nothing, as when the server has not noticed yet): it is killed, then
    the question is answered; past the deadline it is not waited for."""
    storage = storage_factory.open()
    try:
        if storage.shared.backend.name != "mysql":
            pytest.skip("MySQL's settling of a session (KILL)")
        shared = storage.shared
        txncontrol = shared.backend.txncontrol

        def lingering() -> Any:
            old = shared.connect()
            old.fetchone("SELECT 1")
            monkeypatch.setattr(old, "close", lambda: None)
            return old
        conn = shared.connect()
        try:
            old = lingering()
            assert txncontrol.commit_outcome(conn, old, None, {}, time.monotonic() + 30) is None
            with pytest.raises(Exception):
                old.raw.cursor().execute("SELECT 1")    # killed
            old = lingering()
            assert txncontrol.settle_session(conn, old, time.monotonic() - 1) is False
            assert old.fetchone("SELECT 1")[0] == 1     # not waited for, not killed
            assert txncontrol.settle_session(conn, old, time.monotonic() + 30) is True
        finally:
            conn.close()
    finally:
        storage.close()
