"""SQLStorage.statement_count(): every statement of every instance, kept after close.

A poll is one statement, a load the cache can't answer one more, a cache hit none; a
commit's count is the same every time for the same work (the bench reports it per
backend); pack adds its own.
"""
from __future__ import annotations

import pathlib

import transaction
from persistent.mapping import PersistentMapping

import zodbsql


def test_statement_count_covers_loads_and_commits(tmp_path: pathlib.Path) -> None:
    db = zodbsql.open_db(f"sqlite://{tmp_path}/Data.sqlite")
    storage = db.storage
    try:
        with db.transaction() as conn:
            conn.root.items = PersistentMapping(a=0)
        with db.transaction() as conn:
            oid = conn.root.items._p_oid
        costs = []
        for value in (1, 2):
            before = storage.statement_count()
            with db.transaction() as conn:
                conn.root.items["a"] = value
            costs.append(storage.statement_count() - before)
        assert costs[0] == costs[1] > 0      # the same work costs the same statements

        storage.shared.cache.clear()         # nothing cached, the index starts afresh
        instance = storage.new_instance()
        before = storage.statement_count()
        instance.poll_invalidations()         # PRAGMA data_version, then the poll
        assert storage.statement_count() - before == 2
        before = storage.statement_count()
        instance.poll_invalidations()         # nothing committed: the PRAGMA alone
        assert storage.statement_count() - before == 1
        before = storage.statement_count()
        instance.load(oid)                    # not cached: one statement, in the read
        assert storage.statement_count() - before == 2   # transaction it begins
        other = storage.new_instance()
        before = storage.statement_count()
        other.poll_invalidations()
        assert storage.statement_count() - before == 2
        before = storage.statement_count()
        other.load(oid)                       # the same snapshot's state, cached
        assert storage.statement_count() - before == 0
        for each in (instance, other):
            each.release()
        transaction.abort()

        before = storage.statement_count()
        db.pack()
        assert storage.statement_count() > before
    finally:
        db.close()
    after_close = storage.statement_count()
    assert after_close > 0 and storage.statement_count() == after_close
