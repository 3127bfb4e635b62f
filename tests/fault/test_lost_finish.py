"""PostgreSQL: the client loses its connection while the server still runs the commit.

Finish and COMMIT travel as one query (backends/postgresql/txncontrol.py).  Here that
query waits for the commit lock, which another session holds, when the client's socket
is shut down: the server's session does not notice (it is waiting for a lock, not
reading), so the lookup that follows finds it still running.

* ``released``: the lock is let go a moment after the cut; the old session commits.
  The lookup must wait for it, find the commit in ``commit_log`` and return its tid:
  ``tpc_finish`` returns normally, the withdrawal applied once.
* ``held``: the lock stays held past the lookup's grace (a second); the lookup ends the
  old session (``pg_terminate_backend``), then finds no commit: a retryable
  ``ConnectionLost``, the withdrawal applied by the retry only.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Any, Iterator

import psycopg
import pytest
import transaction
import ZODB

import zodbsql
from tests.fault.conftest import MakeScratch
from zodbsql.backends.postgresql.connections import PostgreSQLConnection

pytestmark = pytest.mark.fault

OPENING, WITHDRAWAL = 100, 30
#: Seconds the lock holder keeps the commit lock after the cut.
HOLD = {"released": 0.3, "held": 3.0}


class CommitLockHolder:
    """Another session holding ``commit_row`` (the commit lock) until ``release``."""

    def __init__(self, scratch: Any) -> None:
        server = scratch.server
        self.conn = psycopg.connect(host=server.host, port=server.port, user=server.user,
                                    password=server.password or None,
                                    dbname=server.dbname, autocommit=True)
        self.conn.execute("BEGIN")
        self.conn.execute(
            f'SELECT last_tid FROM "{scratch.name}".commit_row FOR UPDATE')

    def waiting_pids(self) -> set[int]:
        with psycopg.connect(self.conn.info.dsn, password=self.conn.info.password,
                             autocommit=True) as other:
            rows = other.execute("SELECT pid FROM pg_stat_activity WHERE wait_event_type"
                                 " = 'Lock' AND %s = ANY(pg_blocking_pids(pid))",
                                 (self.conn.info.backend_pid,)).fetchall()
        return {int(row[0]) for row in rows}

    def release(self) -> None:
        self.conn.execute("ROLLBACK")
        self.conn.close()


@pytest.fixture
def scratch(make_scratch: MakeScratch) -> Any:
    return make_scratch("postgresql")


@pytest.fixture
def finishing(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[PostgreSQLConnection]]:
    """The connections that sent finish and COMMIT as one query, in order."""
    sent: list[PostgreSQLConnection] = []
    real = PostgreSQLConnection.fetch_and_commit

    def record(self: PostgreSQLConnection, sql: str, shown: str, count: int) -> Any:
        sent.append(self)
        return real(self, sql, shown, count)
    monkeypatch.setattr(PostgreSQLConnection, "fetch_and_commit", record)
    yield sent


def cut_when_waiting(holder: CommitLockHolder, sent: list[PostgreSQLConnection],
                     hold: float, problems: list[BaseException]) -> None:
    """Shut the committing client's socket once its session waits for the lock, then
    let the lock go ``hold`` seconds later."""
    try:
        deadline = time.monotonic() + 10
        while not (sent and sent[-1].session_id in holder.waiting_pids()):
            if time.monotonic() > deadline:
                raise AssertionError("the commit never waited for the commit lock")
            time.sleep(0.02)
        fd = sent[-1].raw.pgconn.socket
        cut = socket.socket(fileno=socket.dup(fd))
        cut.shutdown(socket.SHUT_RDWR)
        cut.close()
        time.sleep(hold)
    except BaseException as exc:
        problems.append(exc)
    finally:
        holder.release()


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
@pytest.mark.parametrize("case", sorted(HOLD))
def test_a_commit_cut_while_it_waits_for_the_commit_lock(
        scratch: Any, finishing: list[PostgreSQLConnection], keep_history: bool,
        case: str) -> None:
    db = ZODB.DB(zodbsql.open_storage(scratch.url(keep_history)))
    try:
        with db.transaction() as conn:
            conn.root()["balance"] = OPENING
        problems: list[BaseException] = []
        attempts = 0
        errors: list[BaseException] = []
        for attempt in transaction.manager.attempts(3):
            with attempt:
                attempts += 1
                conn = db.open()
                try:
                    conn.root()["balance"] -= WITHDRAWAL
                    if attempts == 1:
                        holder = CommitLockHolder(scratch)
                        cutter = threading.Thread(target=cut_when_waiting, args=(
                            holder, finishing, HOLD[case], problems))
                        cutter.start()
                    try:
                        transaction.commit()
                    except BaseException as exc:
                        errors.append(exc)
                        raise
                    finally:
                        if attempts == 1:
                            cutter.join()
                finally:
                    conn.close()
        assert not problems, problems
        with db.transaction() as conn:
            balance = conn.root()["balance"]
        assert balance == OPENING - WITHDRAWAL, f"{case}: {balance} after {errors!r}"
        if case == "released":
            assert (attempts, errors) == (1, []), "a commit that happened was retried"
        else:
            assert attempts == 2 and "confirms was not committed" in str(errors[0])
    finally:
        db.close()
