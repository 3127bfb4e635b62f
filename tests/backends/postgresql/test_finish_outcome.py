"""PostgreSQL's finish (``zodbsql_finish`` and COMMIT in one query) and the answer
``commit_outcome`` gives after a lost COMMIT, called on their own: what a finish leaves
on its connection for the lookup (nonce, floor, previous tid), the lookup finding a
commit by its nonce, not finding one that never committed, saying it can't know once
the floor has left commit_log's window, and never ending a session that can no longer
commit (a pooler's server session serving another client)."""
from __future__ import annotations

import time
from typing import Any, Iterator

import psycopg
import pytest
import ZODB
from persistent.mapping import PersistentMapping

from tests.databases import BACKENDS, Param, PostgreSQLFactory
from zodbsql.backends.postgresql import txncontrol as pg_txncontrol
from zodbsql.backends.postgresql.connections import SESSION_IDENTITY, PostgreSQLConnection
from zodbsql.storage.pack import time_to_tid

pytestmark = pytest.mark.skipif(
    "postgresql" not in BACKENDS,
    reason="postgresql is not in ZODBSQL_TEST_BACKENDS")

#: Well inside the lookup's grace (IN_PROGRESS_GRACE, a second) before it ends a session.
QUICK = 0.8


@pytest.fixture(params=[True, False], ids=["hp", "hf"])
def factory(request: Any) -> Iterator[PostgreSQLFactory]:
    made = PostgreSQLFactory(Param("postgresql", request.param))
    yield made
    made.cleanup()


class Finisher:
    """A storage's backend, its transaction control and fresh sessions."""

    def __init__(self, factory: PostgreSQLFactory, **options: Any) -> None:
        self.factory = factory
        self.storage = factory.open(**options)
        self.backend = self.storage.shared.backend
        self.control = self.backend.txncontrol
        self.opened: list[Any] = []

    def connect(self) -> PostgreSQLConnection:
        conn = self.storage.shared.connect()     # counted and traced as the storage's
        assert isinstance(conn, PostgreSQLConnection)
        self.opened.append(conn)
        return conn

    def last_tid(self) -> int:
        conn = self.connect()
        try:
            return int(self.backend.poller.last_tid(conn))
        finally:
            conn.rollback()

    def finish(self, conn: PostgreSQLConnection, commit: bool, clock_tid: int | None = None,
               requested_tid: int | None = None) -> int:
        clock = clock_tid if clock_tid is not None else time_to_tid(time.time())
        tid: int = self.control.finish(conn, clock, requested_tid, b"user", b"note", b"",
                                       5.0, False, check_blobs=False, blobs=False,
                                       commit=commit)
        return tid

    def outcome(self, old: PostgreSQLConnection, seconds: float = 10.0) -> bool | None:
        probe = self.connect()
        answer: bool | None = self.control.commit_outcome(
            probe, old, None, {}, time.monotonic() + seconds)
        return answer

    def bystander(self, in_transaction: bool) -> psycopg.Connection[Any]:
        """Another client's session: idle, or idle inside a transaction."""
        other = psycopg.connect(self.factory.dsn, autocommit=True)
        if in_transaction:
            other.execute("BEGIN")
            other.execute("SELECT 1")
        self.opened.append(other)
        return other

    def close(self) -> None:
        for conn in self.opened:
            try:
                conn.close()
            except Exception:
                pass
        self.storage.close()


@pytest.fixture
def finisher(factory: PostgreSQLFactory) -> Iterator[Finisher]:
    made = Finisher(factory)
    yield made
    made.close()


def as_session_of(old: PostgreSQLConnection, other: psycopg.Connection[Any]) -> None:
    """Make ``old`` name ``other``'s server session, as a pooler's reused session is."""
    row = other.execute(SESSION_IDENTITY).fetchone()
    assert row is not None
    pid, started = row
    old.session_id, old.session_started = int(pid), str(started)


def alive(other: psycopg.Connection[Any]) -> bool:
    try:
        other.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def test_a_finish_with_commit_is_found_by_its_nonce(finisher: Finisher) -> None:
    before = finisher.last_tid()
    old = finisher.connect()
    old.begin_write()
    clock = time_to_tid(time.time())
    tid = finisher.finish(old, commit=True, clock_tid=clock)
    assert not old.in_transaction and tid > before
    assert old.commit_nonce is not None and old.commit_floor == clock
    # The tid committed before this one (both modes: the finish query reads it back).
    assert old.commit_previous == before
    assert finisher.last_tid() == tid
    assert finisher.outcome(old) is True
    assert old.commit_tid == tid


def test_a_finish_never_committed_is_not_found(finisher: Finisher) -> None:
    before = finisher.last_tid()
    old = finisher.connect()
    old.begin_write()
    tid = finisher.finish(old, commit=False)
    assert old.in_transaction and tid > before          # the COMMIT is the caller's
    assert finisher.outcome(old) is False                # closing it rolled it back
    assert old.commit_tid is None
    assert finisher.last_tid() == before


def test_an_empty_finish_commits_alone_without_a_warning(finisher: Finisher) -> None:
    """Outside a transaction (nothing staged), the call runs alone in autocommit: no
    COMMIT after it, which the server would answer with a warning."""
    old = finisher.connect()
    notices: list[str] = []
    old.raw.add_notice_handler(lambda diag: notices.append(str(diag.message_primary)))
    assert not old.in_transaction
    tid = finisher.finish(old, commit=True)
    assert notices == []
    assert not old.in_transaction and finisher.last_tid() == tid
    assert finisher.outcome(old) is True and old.commit_tid == tid


def test_a_restores_floor_is_its_own_tid(finisher: Finisher) -> None:
    """The lookup's floor is the tid a restore asks for, not the clock's: once later
    commits have moved commit_log's window past it, a lost restore can't be known."""
    before = finisher.last_tid()
    old = finisher.connect()
    old.begin_write()
    requested = before + 1
    later_clock = time_to_tid(time.time() + 3 * 3600)
    assert finisher.finish(old, commit=False, clock_tid=later_clock,
                           requested_tid=requested) == requested
    assert old.commit_floor == requested
    old.rollback()                        # its COMMIT never ran; the commit lock is free
    other = finisher.connect()
    other.begin_write()
    finisher.finish(other, commit=True, requested_tid=time_to_tid(time.time() + 2 * 3600))
    # Not in the log, and its floor two hours before the last tid: maybe pruned.
    assert finisher.outcome(old) is None


def test_an_idle_session_is_not_ended(finisher: Finisher) -> None:
    """The old session's pid and start now name a session that is idle outside a
    transaction: it can't commit, so the answer is final at once, and it goes on."""
    old = finisher.connect()
    old.begin_write()
    finisher.finish(old, commit=False)
    bystander = finisher.bystander(in_transaction=False)
    as_session_of(old, bystander)
    probe = finisher.connect()
    assert probe.fetchone(pg_txncontrol.OLD_SESSION, (old.session_id, old.session_started)
                          ) == ("idle",)      # the lookup finds the session, idle
    probe.rollback()
    started = time.monotonic()
    assert finisher.outcome(old) is False
    assert time.monotonic() - started < QUICK
    assert alive(bystander)


def test_a_logged_commit_is_answered_without_waiting_for_its_session(
        finisher: Finisher) -> None:
    """Found in commit_log, the commit is durable: the session (busy in a transaction,
    as a pooler's may be for another client) is neither waited for nor ended."""
    old = finisher.connect()
    old.begin_write()
    tid = finisher.finish(old, commit=True)
    bystander = finisher.bystander(in_transaction=True)
    as_session_of(old, bystander)
    probe = finisher.connect()
    assert getattr(finisher.control, "_may_still_commit")(probe, old)  # looks as if it might
    probe.rollback()
    started = time.monotonic()
    assert finisher.outcome(old) is True and old.commit_tid == tid
    assert time.monotonic() - started < QUICK
    assert alive(bystander)


def test_a_commit_logged_as_its_session_ends_is_found(finisher: Finisher,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit lands between the lookup's first look at commit_log and its look at
    the session (gone by then): the final look must find it."""
    old = finisher.connect()
    old.begin_write()
    tid = finisher.finish(old, commit=True)
    real = pg_txncontrol.PostgreSQLTransactionControl._logged
    looks: list[int] = []

    def first_too_early(conn: Any, old_conn: Any, nonce: int) -> bool | None:
        looks.append(nonce)
        return False if len(looks) == 1 else real(conn, old_conn, nonce)

    monkeypatch.setattr(pg_txncontrol.PostgreSQLTransactionControl, "_logged",
                        staticmethod(first_too_early))
    assert finisher.outcome(old) is True and old.commit_tid == tid
    assert looks == [old.commit_nonce, old.commit_nonce]


def test_a_finish_that_never_ran_has_no_outcome(finisher: Finisher) -> None:
    old = finisher.connect()
    assert old.commit_nonce is None
    assert finisher.outcome(old) is None


def test_the_trace_shows_the_finish_with_its_parameters_counted(
        factory: PostgreSQLFactory, caplog: pytest.LogCaptureFixture) -> None:
    """One query carries the call and COMMIT with its values inline: the trace shows
    the call's text and counts its nine parameters, never their values."""
    import logging
    finisher = Finisher(factory, sql_trace=True)
    try:
        old = finisher.connect()
        old.begin_write()
        with caplog.at_level(logging.DEBUG, logger="zodbsql.sql"):
            finisher.finish(old, commit=True)
        lines = [r.getMessage() for r in caplog.records if "zodbsql_finish" in r.getMessage()]
        assert len(lines) == 1, lines
        assert lines[0].endswith(" FROM zodbsql_finish(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                                 " AS f; COMMIT (9 parameters)")
        assert "user" not in lines[0] and "note" not in lines[0]
    finally:
        finisher.close()


def test_a_finish_vote_did_not_lock_for_replaces_and_creates(finisher: Finisher) -> None:
    """The finish of states staged without ``zodbsql_lock_objects`` (an older zodbsql's
    vote, which did not leave the locked oids on the session): it finds the existing
    objects itself, replaces them and creates the others (not an insert of an oid
    that exists, nor an update of none); history-free, the blob reference of the
    object it replaces goes and no other."""
    with ZODB.DB(finisher.storage).transaction() as zconn:   # the DB stays open
        zconn.root()["child"] = child = PersistentMapping(v=1)
    unrelated = int.from_bytes(child._p_oid, "big")     # an object the commit leaves
    existing, new = 0, unrelated + 1000
    current = "current_object" if finisher.storage.shared.options.keep_history else "object_state"
    conn = finisher.connect()
    finisher.backend.mover.prepare_connection(conn)
    conn.begin_write()
    row = conn.fetchone(
        f"SELECT c.tid, s.state, s.checksum, s.state_size FROM {current} c JOIN object_state s"
        " ON s.zoid = c.zoid AND s.tid = c.tid WHERE c.zoid = %s", (existing,))
    assert row is not None
    prev_tid, state, checksum, size = row
    for zoid, prev in ((existing, prev_tid), (new, 0)):
        conn.execute("INSERT INTO temp_store (zoid, prev_tid, data_tid, checksum, state_size,"
                     " state, refs) VALUES (%s, %s, NULL, %s, %s, %s, NULL)",
                     (zoid, prev, checksum, size, bytes(state)))
    for zoid in (existing, unrelated):
        conn.execute("INSERT INTO blob_ref (zoid, tid, content_hash) VALUES (%s, %s, %s)",
                     (zoid, prev_tid, b"not a blob's hash"))
    tid = finisher.control.finish(conn, time_to_tid(time.time()), None, b"", b"", b"", 5.0,
                                  True, check_blobs=False, blobs=False, commit=True)
    check = finisher.connect()
    rows = check.fetchall(f"SELECT zoid, tid FROM {current} WHERE zoid IN (%s, %s)"
                          " ORDER BY zoid", (existing, new))
    blob_refs = check.fetchall("SELECT zoid FROM blob_ref ORDER BY zoid")
    check.rollback()
    assert [tuple(row) for row in rows] == [(existing, tid), (new, tid)]
    kept = [existing, unrelated] if finisher.storage.shared.options.keep_history else [
        unrelated]
    assert [row[0] for row in blob_refs] == kept
