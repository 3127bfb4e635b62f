"""Statements per commit, counted (not timed): the figures the design notes quote.

A commit here is what ZODB does for one transaction: the poll at its start, vote and
finish.  Each backend's expected counts are data; a change that adds a round trip to
the commit path fails this test and must update the design note.
"""
from __future__ import annotations

import time
from typing import Any

import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.Connection import TransactionMetaData

# (backend, keep_history) -> (one changed object, 1,000 new objects).  SQLite's include
# the ``PRAGMA data_version`` that tells whether the poll after the commit may be skipped
# (backends/sqlite/wakeup.py); PostgreSQL sends a small commit's BEGIN with its vote's
# call (the states inline) and finish with COMMIT, each as one query, its
# history-preserving start after a commit made alone needs no poll (storage.py,
# _moved_past_own_commit) and its watch reads no statement, and a history-free
# PostgreSQL start polls, its read transaction's ROLLBACK, BEGIN and the poll in one
# query (backends/postgresql/poller.py; afterCompletion leaves the ROLLBACK to that
# poll, storage/next_poll.py), so it adds that one statement.  MySQL's include
# the share lock of the pack gate (backends/mysql/locker.py); PostgreSQL takes its gate
# inside the vote's one call, which also stages the states (zodbsql_stage_and_lock).
# The 1,000 new objects take two oid blocks (16, then 1,024: base/oidalloc.py).  SQLite
# writes at vote (features.py): the current tids of the stored objects in one
# statement, then each group of rows (leaves; states with references) in one multi-row
# INSERT per 1,024 into object_state itself (backends/sqlite/mover.py): the root and
# the new leaves are two; history-preserving adds the transaction's row and one
# statement that makes the new revisions current.
EXPECTED = {
    ("sqlite", True): (10, 19),
    ("sqlite", False): (10, 19),
    ("postgresql", True): (2, 5),
    ("postgresql", False): (3, 6),
    ("mysql", True): (12, 14),
    ("mysql", False): (13, 15),
}


def test_statements_per_commit(storage_factory: Any) -> None:
    param = storage_factory.param
    db = ZODB.DB(storage_factory.open())
    try:
        conn = db.open()
        root = conn.root()
        root["x"] = PersistentMapping()
        transaction.commit()
        for i in range(3):  # warm up: oid blocks, prepared statements, the pool
            root["x"][i] = i
            transaction.commit()
        storage = conn._storage
        before = storage.statement_count()
        root["x"]["one"] = 1
        transaction.commit()
        one = storage.statement_count() - before
        # Oid blocks grow when oids run out within a second of the last block: after a
        # pause the 1,000 new objects take the same blocks however slow the machine.
        time.sleep(1.1)
        before = storage.statement_count()
        for i in range(1000):
            root[f"new{i}"] = PersistentMapping()
        transaction.commit()
        thousand = storage.statement_count() - before
        conn.close()
    finally:
        db.close()
    assert (one, thousand) == EXPECTED[(param.backend, param.keep_history)]


# (backend, keep_history) -> statements of a commit that stores nothing (tpc_begin,
# tpc_vote, tpc_finish with no object: an undo of nothing, a note-only transaction).
# Vote locks nothing for it, except on MySQL, where its conflict query is Galera's causal
# read before the tid is allocated and the pack gate comes with it (locker.py).
EXPECTED_EMPTY = {
    ("sqlite", True): 6,
    ("sqlite", False): 5,
    ("postgresql", True): 1,
    ("postgresql", False): 1,
    ("mysql", True): 8,
    ("mysql", False): 7,
}


def test_statements_of_an_empty_commit(storage_factory: Any) -> None:
    param = storage_factory.param
    storage = storage_factory.open()
    for _ in range(2):      # warm up: the pool, prepared statements
        txn = TransactionMetaData()
        storage.tpc_begin(txn)
        storage.tpc_vote(txn)
        storage.tpc_finish(txn)
    before = storage.statement_count()
    txn = TransactionMetaData(description=b"nothing stored")
    storage.tpc_begin(txn)
    storage.tpc_vote(txn)
    tid = storage.tpc_finish(txn)
    empty = storage.statement_count() - before
    assert tid == storage.lastTransaction()
    assert empty == EXPECTED_EMPTY[(param.backend, param.keep_history)]
