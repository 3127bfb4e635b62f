"""SQLStorage.statement_count(): every statement of every instance, kept after close."""
from __future__ import annotations

import pathlib

import transaction
from persistent.mapping import PersistentMapping

import zodbsql


def test_statement_count_covers_loads_and_commits(tmp_path: pathlib.Path) -> None:
    db = zodbsql.open_db(f"sqlite://{tmp_path}/Data.sqlite")
    storage = db.storage
    try:
        before = storage.statement_count()
        with db.transaction() as conn:
            conn.root.items = PersistentMapping(a=1)
        committed = storage.statement_count()
        assert committed > before
        db.cacheMinimize()
        conn = db.open()
        conn.root.items["a"]   # a load over the instance's own connection
        conn.close()
        transaction.abort()
        assert storage.statement_count() > committed
        db.pack()
        assert storage.statement_count() > committed
    finally:
        db.close()
