"""The statements PostgreSQL itself logs for a commit equal those the storage counts.

``statement_count()`` (the bench's ``sql/txn`` column, test_round_trips.py) is counted
on the client; a pipelined or multi-statement round trip could make it disagree with
what the server runs.  A private server logs every statement (``log_statement = all``)
and the two counts are compared for the commits test_round_trips.py counts: one changed
object, 1,000 new objects and an empty commit, each with the next transaction's start.
"""
from __future__ import annotations

import pathlib
import time
from typing import Any, Callable

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.Connection import TransactionMetaData

from tests.databases import Param, PostgreSQLFactory
# The module's private server that logs every statement, shared with test_wakeup.py.
from tests.storage.test_wakeup import logged, logging_server, wait_until, watch_of  # noqa: F401

APPLICATION = "zodbsql-count"


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
def test_server_and_client_count_the_same_statements(
        logging_server: tuple[str, pathlib.Path], keep_history: bool) -> None:
    dsn, log = logging_server
    factory = PostgreSQLFactory(Param("postgresql", keep_history),
                                dsn=f"{dsn} application_name={APPLICATION}")
    try:
        storage = factory.open()
        db = ZODB.DB(storage)
    except BaseException:
        factory.cleanup()
        raise
    try:
        tm = transaction.TransactionManager()
        conn = db.open(tm)
        root = conn.root()
        root["x"] = PersistentMapping()
        tm.commit()
        for i in range(3):      # warm up: oid blocks, prepared statements, the pool
            root["x"][i] = i
            tm.commit()
        instance = conn._storage    # the connection's own instance counts its statements
        # The commit listener's heartbeat is not the commit's (both modes listen).
        listener = watch_of(storage).session_pid
        admin = factory.admin.info.backend_pid      # it sends the markers

        def count(name: str, work: Callable[[], Any]) -> tuple[int, int]:
            # Markers unique in the log the two modes share.
            mode = "hp" if keep_history else "hf"
            start, end = f"zodbsql-{name}-{mode}-start", f"zodbsql-{name}-{mode}-end"
            factory.admin.execute(f"SELECT '{start}'")
            before = instance.statement_count()
            work()
            tm.begin()          # the next transaction's poll is part of the cost
            client = instance.statement_count() - before
            factory.admin.execute(f"SELECT '{end}'")
            wait_until(lambda: end in log.read_text(errors="replace"))
            server = [line for line in logged(log, start, end)
                      if line.startswith(f"{APPLICATION}|")
                      and not line.startswith((f"{APPLICATION}|{admin}|",
                                               f"{APPLICATION}|{listener}|"))]
            return client, len(server)

        def one() -> None:
            root["x"]["one"] = 1
            tm.commit()

        def thousand() -> None:
            time.sleep(1.1)     # oid blocks grow when used up within a second
            for i in range(1000):
                root["x"][f"new{i}"] = PersistentMapping()
            tm.commit()

        def empty() -> None:    # ZODB sends nothing to a storage for an empty commit
            txn = TransactionMetaData(description=b"nothing stored")
            instance.tpc_begin(txn)
            instance.tpc_vote(txn)
            instance.tpc_finish(txn)

        for name, work in (("one", one), ("thousand", thousand), ("empty", empty)):
            client, server = count(name, work)
            assert server == client, (name, server, client)
            assert server > 0, name
    finally:
        db.close()      # before the schema is dropped: open sessions would block it
        factory.cleanup()
