"""SQLite, PostgreSQL and MySQL read a poll's changed objects as an array a commit
(each backend's poller.py): they must name what the portable poll names, each object
once at its newest tid."""
from __future__ import annotations

import json
import random
from typing import Any

import pytest
import transaction
from persistent.mapping import PersistentMapping

from zodbsql.backends.base.poller import OVER_LIMIT, Poller, newest_each
from zodbsql.backends.mysql.poller import CUT_ARRAY, MySQLPoller
from zodbsql.backends.postgresql.poller import PostgreSQLPoller
from zodbsql.backends.sqlite.poller import SQLitePoller


@pytest.mark.parametrize("ascending", [False, True], ids=["shuffled", "tid-order"])
@pytest.mark.parametrize("seed", range(10))
def test_newest_each_keeps_each_objects_newest_tid_in_any_order(
        seed: int, ascending: bool) -> None:
    """The commits shuffled, and in tid order as the tid index's scan gives them;
    each oid comes at its newest tid, in the order of its first commit."""
    rng = random.Random(seed)
    tids = rng.sample(range(1, 1000), rng.randrange(1, 12))
    commits = [(tid, rng.sample(range(20), rng.randrange(1, 8))) for tid in tids]
    if ascending:
        commits.sort()
    expected: dict[int, int] = {}
    for tid, oids in sorted(commits):
        for oid in oids:
            expected[oid] = tid
    found = newest_each(commits)
    assert found == list(expected.items())


def test_newest_each_of_no_commit_is_nothing() -> None:
    assert newest_each([]) == []


def test_the_poll_names_what_the_portable_poll_names(storage_factory: Any) -> None:
    """Commits change random objects, some several times between two polls; from every
    tid on, the backend's poll gives the portable statement's result: the same last tid, the
    same objects, each once at its newest revision."""
    rng = random.Random(7)
    storage = storage_factory.open()
    import ZODB
    db = ZODB.DB(storage)
    try:
        conn = db.open()
        root = conn.root()
        children = [PersistentMapping() for _ in range(40)]
        root["children"] = children
        transaction.commit()
        tids = [storage.lastTransaction()]
        for step in range(12):
            for child in rng.sample(children, rng.randrange(1, 15)):
                child["step"] = step
            transaction.commit()
            tids.append(storage.lastTransaction())
        conn.close()
        backend = storage.shared.backend
        assert isinstance(backend.poller, (SQLitePoller, PostgreSQLPoller, MySQLPoller))
        portable = Poller(backend)
        read = storage.shared.pool.acquire()
        try:
            for since in [0] + [int.from_bytes(tid, "big") for tid in tids]:
                ours = backend.poller.poll(read, since, 0)
                theirs = portable.poll(read, since, 0)
                assert len({oid for oid, _ in ours.changes}) == len(ours.changes)
                assert (ours._replace(changes=sorted(ours.changes))
                        == theirs._replace(changes=sorted(theirs.changes)))
            newest = int.from_bytes(tids[-1], "big")
            assert backend.poller.poll(read, newest, 0).changes == []
            # From the first tid on, the later commits' objects: at least one came twice.
            first = backend.poller.poll(read, int.from_bytes(tids[0], "big"), 0)
            assert first.changes and first.upto == newest
        finally:
            read.rollback()
            storage.shared.pool.release(read)
    finally:
        db.close()


def sqlite_rows(markers: list[Any], commits: list[tuple[int, list[int]]]) -> list[Any]:
    """A poll's rows as SQLite sends them: the oids a JSON text."""
    return [markers[0], *((5, tid, json.dumps(oids)) for tid, oids in commits), *markers[1:]]


def postgresql_rows(markers: list[Any], commits: list[tuple[int, list[int]]]) -> list[Any]:
    """A poll's rows as PostgreSQL sends them: every third column an array, the
    deletions' none."""
    def arrayed(kind: int, value: int, tid: int) -> tuple[int, int, list[int] | None]:
        return kind, value, (None if kind == 4 else [tid])
    return [arrayed(*markers[0]), *((5, tid, oids) for tid, oids in commits),
            *(arrayed(*row) for row in markers[1:])]


def mysql_rows(markers: list[Any], commits: list[tuple[int, list[int]]]) -> list[Any]:
    """A poll's rows as MySQL sends them: every third column text (the arrays' type),
    the oids a JSON text."""
    def text(kind: int, value: int, tid: int) -> tuple[int, int, str]:
        return kind, value, str(tid)
    return [text(*markers[0]), *((5, tid, json.dumps(oids)) for tid, oids in commits),
            *(text(*row) for row in markers[1:])]


PARSERS = [pytest.param(SQLitePoller.parse_poll, sqlite_rows, id="sqlite"),
           pytest.param(PostgreSQLPoller.parse_poll, postgresql_rows, id="postgresql"),
           pytest.param(MySQLPoller.parse_poll, mysql_rows, id="mysql")]


@pytest.mark.parametrize("parse, rows_of", PARSERS)
@pytest.mark.parametrize("gone_since", [None, 0, 6])
@pytest.mark.parametrize("since", [None, 3, 40, 60])
def test_the_arrays_parse_as_the_portable_rows(parse: Any, rows_of: Any, since: int | None,
                                               gone_since: int | None) -> None:
    """The same poll as the portable statement's rows and as a row a commit: the same
    Polled, the deletion records' floor and completeness included (kinds 2 to 4)."""
    markers = [(0, 0, 90), (2, 4, 9), (3, 0, 50), (4, 77, 7), (4, 78, 8)]
    portable = [markers[0], (1, 12, 70), (1, 11, 88), (1, 13, 61), *markers[1:]]
    arrays = rows_of(markers, [(88, [11]), (61, [13]), (70, [12]), (80, [11])])
    expected = Poller.parse_poll(portable, since, gone_since)
    found = parse(arrays, since, gone_since)
    assert found._replace(changes=sorted(found.changes)) == expected._replace(
        changes=sorted(expected.changes))
    if since is not None and gone_since is None:
        assert found.complete == (since > 50)
    # Nothing changed: no commit's row, the markers are all there is.
    empty = parse(rows_of(markers[:1], []), since, gone_since)
    assert (empty.upto, empty.changes, empty.gone) == (90, [], [])


@pytest.mark.parametrize("parse", [SQLitePoller.parse_poll, PostgreSQLPoller.parse_poll,
                                   MySQLPoller.parse_poll],
                         ids=["sqlite", "postgresql", "mysql"])
@pytest.mark.parametrize("last_tid", [5, 6, 90])
def test_the_last_tid_alone_parses_whatever_its_value(parse: Any, last_tid: int) -> None:
    """A database without the record of deletions, first polled: one row, one
    column, which no kind number is taken for."""
    assert parse([(last_tid,)]) == Poller.parse_poll([(last_tid,)])
    assert parse([(last_tid,)]).upto == last_tid


@pytest.mark.parametrize("parse, rows_of", PARSERS[1:])
def test_commits_past_the_limit_are_not_listed(parse: Any, rows_of: Any) -> None:
    """PostgreSQL and MySQL read at most one revision past the limit (their statement's
    ``LIMIT``): more revisions than the limit, in however many commits, make the poll
    truncated; as many, and it lists them."""
    markers = [(0, 0, 90), (2, 4, 9), (3, 0, 50)]
    rows = rows_of(markers, [(70, [12, 13]), (80, [12])])
    listed = parse(rows, 60, 4, 3)
    assert listed == (90, [(12, 80), (13, 70)], [], 9, 4, True, False)
    assert parse(rows, 60, 4, 0) == listed
    for limit in (1, 2):
        assert parse(rows, 60, 4, limit) == (90, [], [], 9, 4, True, True)


@pytest.mark.parametrize("since, gone_since, complete", [(60, 4, True), (40, None, False),
                                                        (40, 4, True)])
@pytest.mark.parametrize("cut", [None, '[12,13', b'[12,1'])
def test_an_array_mysql_cut_takes_everything_as_changed(
        cut: Any, since: int, gone_since: int | None, complete: bool,
        caplog: pytest.LogCaptureFixture) -> None:
    """An array longer than the server's packet comes as NULL, one longer than
    group_concat_max_len cut short: neither is read as the objects it lists; the poll
    is truncated, with a warning that names the setting, and its deletion records read
    as ever (from tid 40, without a number, those pruned up to tid 50 may be missed)."""
    markers = [(0, 0, "90"), (2, 4, "9"), (3, 0, "50")]
    rows = [markers[0], (5, 70, "[11]"), (5, 80, cut), *markers[1:]]
    with caplog.at_level("WARNING", logger="zodbsql.backends.mysql.poller"):
        polled = MySQLPoller.parse_poll(rows, since, gone_since)
    assert polled == (90, [], [], 9, 4, complete, True)
    assert caplog.messages == [CUT_ARRAY]
    assert CUT_ARRAY == (
        "a poll's list of changed objects came back cut or empty (longer than the server's"
        " max_allowed_packet or group_concat_max_len): every object is taken as changed;"
        " raise max_allowed_packet")


@pytest.mark.parametrize("parse, rows_of", PARSERS)
def test_a_commit_newer_than_the_marker_moves_the_last_tid(parse: Any, rows_of: Any) -> None:
    """One statement sees one snapshot, so no commit's row is newer than the marker's
    last tid; were one, the poll would end at it, as the portable parse's does."""
    markers = [(0, 0, 60), (2, 4, 9), (3, 0, 50)]
    portable = Poller.parse_poll([markers[0], (1, 12, 70), *markers[1:]], 55, 4)
    found = parse(rows_of(markers, [(70, [12])]), 55, 4)
    assert found == portable and found.upto == 70
    # Truncated, the last tid still moves (and no change is listed).  SQLite's
    # statement says it went past in a row of its own; PostgreSQL's reads one past.
    said = [(OVER_LIMIT, 0, 0)] if parse is SQLitePoller.parse_poll else []
    past = parse(rows_of(markers + said, [(70, [12, 13])]), 55, 4, 1)
    assert (past.upto, past.changes, past.truncated) == (70, [], True)
