"""A transaction start reads at most ``poll-changes-limit`` changes (backends/base/poller.py).

Past the limit the poll is truncated: it reads one change more than the limit at most,
lists none, and the instance is told everything changed (``poll_invalidations`` returns
None), its process's state cache starting afresh, so no state it kept from before is
served.  The model test (``tests/model``) runs with a limit of four changes too.
"""
from __future__ import annotations

import json
import uuid
from typing import Any

from ZODB.Connection import TransactionMetaData
from ZODB.utils import u64, z64

from tests.model.nodes import node_state
from tests.storage.test_wakeup import wait_until_heard
from zodbsql.backends.base.poller import OVER_LIMIT, REVISIONS, Poller
from zodbsql.backends.sqlite.poller import SQLitePoller


def _commit(instance: Any, states: dict[bytes, bytes]) -> bytes:
    """Commit ``states`` from ``instance`` at their current serials; the tid."""
    instance.poll_invalidations()
    txn = TransactionMetaData()
    instance.tpc_begin(txn)
    for oid, state in states.items():
        try:
            serial = instance.load(oid)[1]
        except KeyError:
            serial = z64
        instance.store(oid, serial, state, "", txn)
    instance.tpc_vote(txn)
    tid: bytes = instance.tpc_finish(txn)
    return tid


def _changes_read(rows: list[Any]) -> int:
    """The revisions a poll's rows carry (each backend's: an array a commit), or the
    changed objects of the portable rows."""
    arrays = [row[2] for row in rows if row[0] == REVISIONS]
    if arrays:   # SQLite's and MySQL's a JSON text, PostgreSQL's a list
        return sum(len(json.loads(oids) if isinstance(oids, str) else oids)
                   for oids in arrays)
    return sum(1 for row in rows if len(row) == 3 and row[0] == 1)


def test_a_poll_reads_one_change_past_its_limit_at_most(storage_factory: Any) -> None:
    storage = storage_factory.open()
    since = u64(storage.lastTransaction())
    oids = [storage.new_oid() for _ in range(5)]
    tid = u64(_commit(storage, {oid: node_state(i, set()) for i, oid in enumerate(oids)}))
    poller = storage.shared.backend.poller
    conn = storage.shared.connect()
    read: list[int] = []
    fetchall = conn.fetchall

    def counted(sql: str, params: Any = ()) -> Any:
        rows = fetchall(sql, params)
        read.append(_changes_read(rows))
        return rows
    conn.fetchall = counted
    try:
        everything = sorted((u64(oid), tid) for oid in oids)
        for limit in (0, 5, 6):
            polled = poller.poll(conn, since, limit=limit)
            assert sorted(polled.changes) == everything and not polled.truncated, limit
            assert polled.upto == tid
        assert read == [5, 5, 5]
        # SQLite counts the revisions up to one past the limit and sends none past
        # it; the others send one row past it.
        counted_only = isinstance(poller, SQLitePoller)
        for limit in (1, 2, 4):
            polled = poller.poll(conn, since, limit=limit)
            assert polled.truncated and polled.changes == [], limit
            assert polled.upto == tid and polled.complete
            assert read[-1] == (0 if counted_only else limit + 1)
            assert f" LIMIT {limit + 1})" in poller.limited(poller.sql.poll, limit)
        # The first poll (no ``since``) reads the last tid alone, whatever the limit.
        assert poller.poll(conn, None, limit=1) == (tid, [], [], 0, 0, True, False)
        conn.rollback()
    finally:
        conn.close()


def test_a_start_past_the_limit_takes_everything_as_changed(storage_factory: Any) -> None:
    """The reader's process kept the objects' states; another process changes more of
    them than the reader's limit: its next start is told everything changed and reads
    every new state.  One change fewer and it is told which.  Each poll is counted
    (metrics), with the changes it listed."""
    from tests.storage.test_metrics import value
    name = f"poll-limit-{uuid.uuid4().hex[:8]}"
    writer = storage_factory.open()
    reader = storage_factory.open(poll_changes_limit=3, metrics=True, name=name)
    oids = [writer.new_oid() for _ in range(4)]
    _commit(writer, {oid: node_state(1, set()) for oid in oids})
    instance = reader.new_instance()
    try:
        instance.poll_invalidations()
        assert [instance.load(oid)[0] for oid in oids] == [node_state(1, set())] * 4
        cache = reader.shared.cache
        assert all(cache.get(u64(oid), u64(instance.lastTransaction())) for oid in oids)

        serial = _commit(writer, {oid: node_state(2, set()) for oid in oids})
        wait_until_heard(reader, serial)
        counted = (value("zodbsql_polls_total", name),
                   value("zodbsql_invalidations_total", name))
        assert instance.poll_invalidations() is None
        assert (value("zodbsql_polls_total", name),
                value("zodbsql_invalidations_total", name)) == (counted[0] + 1, counted[1])
        assert u64(instance.lastTransaction()) == u64(serial)
        assert [instance.load(oid)[0] for oid in oids] == [node_state(2, set())] * 4

        serial = _commit(writer, {oid: node_state(3, set()) for oid in oids[:3]})
        wait_until_heard(reader, serial)
        assert sorted(instance.poll_invalidations()) == sorted(oids[:3])
        assert (value("zodbsql_polls_total", name),
                value("zodbsql_invalidations_total", name)) == (counted[0] + 2,
                                                                counted[1] + 3)
        assert [instance.load(oid)[0] for oid in oids] == [node_state(3, set())] * 3 + [
            node_state(2, set())]
    finally:
        instance.release()


#: A poll's rows: the markers (kinds 0, 2, 3), a deletion (kind 4), three changes (1).
ROWS = [(0, 0, 9), (2, 3, 5), (3, 0, 6), (4, 11, 4), (1, 12, 7), (1, 13, 8), (1, 14, 9)]


def test_the_portable_rows_past_the_limit_list_no_change() -> None:
    full = Poller.parse_poll(ROWS, 6, 4)
    assert full == (9, [(12, 7), (13, 8), (14, 9)], [11], 5, 3, True, False)
    assert Poller.parse_poll(ROWS, 6, 4, 3) == full
    for limit in (1, 2):
        assert Poller.parse_poll(ROWS, 6, 4, limit) == (9, [], [11], 5, 3, True, True)
    # A statement that counted first says it went past (kind 6) and sends no change.
    past = [row for row in ROWS if row[0] != 1] + [(OVER_LIMIT, 0, 4)]
    for limit in (1, 2):
        assert Poller.parse_poll(past, 6, 4, limit) == (9, [], [11], 5, 3, True, True)
    # Without a record number, from tid 6, the records pruned up to tid 6 (kind 3) may
    # have named deletions after it: incomplete, and truncated too.
    assert Poller.parse_poll(ROWS, 6, None, 1) == (9, [], [11], 5, 3, False, True)


def test_sqlites_rows_past_the_limit_list_no_change() -> None:
    """SQLite's statement says it went past the limit (a row of kind 6, and no commit's
    row); a commit's rows are all it sent otherwise."""
    markers = [row for row in ROWS if row[0] != 1]
    rows = markers + [(REVISIONS, 8, "[13]"), (REVISIONS, 7, "[12]"), (REVISIONS, 9, "[14]")]
    full = SQLitePoller.parse_poll(rows, 6, 4)
    assert full == (9, [(12, 7), (13, 8), (14, 9)], [11], 5, 3, True, False)
    assert SQLitePoller.parse_poll(rows, 6, 4, 3) == full
    past = markers + [(OVER_LIMIT, 0, 0)]
    for limit in (1, 2):
        assert SQLitePoller.parse_poll(past, 6, 4, limit) == (9, [], [11], 5, 3, True, True)


def test_a_limited_statement_is_written_once(storage_factory: Any) -> None:
    """Each start asks for the statement of its limit: the text is made once."""
    poller = storage_factory.open().shared.backend.poller
    template = poller.sql.poll
    assert poller.limited(template, 7) is poller.limited(template, 7)
    assert " LIMIT 8" in poller.limited(template, 7)
    if isinstance(poller, SQLitePoller):
        # Counted once (a CTE), read by the range's end and by the marker.
        assert poller.limited(template, 7).count(" LIMIT 8)) ") == 1
        assert "n <= 7 " in poller.limited(template, 7) and "n > 7 " in poller.limited(template, 7)
    assert "LIMIT" not in poller.limited(template, 0) and "{" not in poller.limited(template, 0)
