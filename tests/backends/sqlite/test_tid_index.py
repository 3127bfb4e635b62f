"""History-preserving, SQLite's tid index names each revision's object (``(tid,
zoid)``, backends/sqlite/schema.py), so that a poll reads the index alone.  A database
made with the one-column index before gets the new one when first opened for writing;
opened read-only it is left as it is and polls as before."""
from __future__ import annotations

from typing import Any

import transaction
import ZODB
from persistent.mapping import PersistentMapping

storage_backends = ("sqlite",)
storage_backends_reason = "SQLite's own index"

INDEX_COLUMNS = "SELECT name FROM pragma_index_info('object_state_tid') ORDER BY seqno"
POLL_PLAN = ("EXPLAIN QUERY PLAN SELECT zoid, tid FROM object_state WHERE tid > 0"
             " AND tid <= (SELECT last_tid FROM commit_row)")


def _read(storage: Any, sql: str) -> list[Any]:
    conn = storage.shared.pool.acquire()
    try:
        rows = conn.fetchall(sql)
        conn.rollback()
        return [tuple(row) for row in rows]
    finally:
        storage.shared.pool.release(conn)


def _index_columns(storage: Any) -> list[str]:
    return [row[0] for row in _read(storage, INDEX_COLUMNS)]


def _make_one_column_index(storage: Any) -> None:
    conn = storage.shared.pool.acquire()
    try:
        conn.begin_write()
        conn.execute("DROP INDEX object_state_tid")
        conn.execute("CREATE INDEX object_state_tid ON object_state (tid)")
        conn.commit()
    finally:
        storage.shared.pool.release(conn)


def _changes_seen_by_a_reader(storage_factory: Any, writer_db: Any, read_only: bool
                              ) -> list[Any]:
    """A reader opened (``read_only`` or not) polls past ``writer_db``'s commit: what
    it reads of the mapping before and after, and the index's columns it found."""
    reader_db = ZODB.DB(storage_factory.open(read_only=read_only))
    try:
        columns = _index_columns(reader_db.storage)
        tm = transaction.TransactionManager()
        conn = reader_db.open(transaction_manager=tm)
        before = dict(conn.root()["mapping"])
        with writer_db.transaction() as wconn:
            wconn.root()["mapping"][f"after-{len(before)}"] = len(before)
        tm.begin()
        after = dict(conn.root()["mapping"])
        tm.abort()
        return [before, after, columns]
    finally:
        reader_db.close()


def _opened_index(storage_factory: Any) -> tuple[list[str], str]:
    """A storage opened for writing: its tid index's columns and the poll's plan."""
    storage = storage_factory.open()
    try:
        plan = " ".join(str(row[-1]) for row in _read(storage, POLL_PLAN))
        return _index_columns(storage), plan
    finally:
        storage.close()


class TestTidIndex:
    history_modes = (True,)
    history_modes_reason = "history-free, the rowid is the oid: every index holds it"

    def test_a_new_database_has_the_two_column_index_and_the_poll_reads_it_alone(
            self, storage_factory: Any) -> None:
        columns, plan = _opened_index(storage_factory)
        assert columns == ["tid", "zoid"]
        assert "COVERING INDEX object_state_tid" in plan


    def test_an_older_database_gets_the_index_when_opened_for_writing(
            self, storage_factory: Any) -> None:
        # The writer is opened before the index is made one column as before: an open
        # storage does not look at the index again.
        writer_db = ZODB.DB(storage_factory.open())
        try:
            with writer_db.transaction() as conn:
                conn.root()["mapping"] = PersistentMapping(a=1)
            _make_one_column_index(writer_db.storage)
            assert _index_columns(writer_db.storage) == ["tid"]

            # Read-only, left as it was; its polls still name the change.
            before, after, columns = _changes_seen_by_a_reader(
                storage_factory, writer_db, read_only=True)
            assert (before, after, columns) == ({"a": 1}, {"a": 1, "after-1": 1}, ["tid"])
            assert _index_columns(writer_db.storage) == ["tid"]

            # Opened for writing: widened, then polls the same.
            before, after, columns = _changes_seen_by_a_reader(
                storage_factory, writer_db, read_only=False)
            assert columns == ["tid", "zoid"]
            assert (before, after) == ({"a": 1, "after-1": 1},
                                       {"a": 1, "after-1": 1, "after-2": 2})
        finally:
            writer_db.close()
        # Opened again, the index stays as it is.
        assert _opened_index(storage_factory)[0] == ["tid", "zoid"]


class TestHistoryFreeTidIndex:
    history_modes = (False,)
    history_modes_reason = "history-preserving: the class above"

    def test_a_history_free_database_keeps_its_one_column_index(
            self, storage_factory: Any) -> None:
        """Its rowid is the oid: the one column covers a poll already, nothing is
        widened when it is opened for writing."""
        storage_factory.open().close()
        columns, plan = _opened_index(storage_factory)
        assert columns == ["tid"]
        assert "COVERING INDEX object_state_tid" in plan
