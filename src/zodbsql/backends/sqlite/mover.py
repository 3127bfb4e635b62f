"""SQLite stages commits in TEMP tables, which take no lock on the database file.

Its client picks what a miss brings along (``LOOKS_AHEAD``), from the cached states and
from a revision's references as text (``references_after``, ``load_and_references``),
so the storage never sends the prefetching statement here; ``load_with_references`` is
the portable one.
"""
import functools
import itertools
import operator
from typing import Any, Iterable, Sequence

from zodbsql.backends.base.contract import (STAGED_OID, STAGED_SIZE, ConnectionRole,
                                            LoadedState, StagedState, StateRow)
from zodbsql.backends.base.mover import REFERENCES_EACH, Mover, loaded_states, state_row

CREATE_TEMP_TABLES = (
    "CREATE TEMP TABLE IF NOT EXISTS temp_store (zoid INTEGER PRIMARY KEY,"
    " prev_tid INTEGER NOT NULL, data_tid INTEGER, checksum INTEGER,"
    " state_size INTEGER NOT NULL, state BLOB, refs TEXT)",
    "CREATE TEMP TABLE IF NOT EXISTS temp_blob (zoid INTEGER PRIMARY KEY, content_hash BLOB NOT NULL)",
)

# The references a miss's client looks ahead through (``Mover.LOOKS_AHEAD``) are read
# from a revision's JSON array text, ascending and without spaces: "[3,17,250]"
# (``records.references_text``; the version 2 migration's group_concat).  It is searched
# and cut, not parsed: json_each (or json.loads) parses all of it, 0.6 ms for the 48 KB
# of a 10,000-child container, where a load by oid takes 6 us.

#: The characters of one reference in the text at most: 19 digits (an oid is a
#: positive signed 64-bit integer) and its comma, with room to spare.
REFERENCE_CHARS = 21


def first_references(text: str | None, count: int) -> list[int]:
    """The first ``count`` references in a revision's JSON array text (None: none)."""
    if not text or count <= 0:
        return []
    return _whole_numbers(text[1:1 + (count + 1) * REFERENCE_CHARS], count)


def references_following(text: str | None, oid: int, count: int) -> list[int] | None:
    """Up to ``count`` references after ``oid`` in a revision's JSON array text; None
    when it does not hold ``oid``.  Found by searching the text, not parsing it: 3 us
    in the 48 KB of a 10,000-child container, whose parse takes 0.6 ms."""
    if not text:
        return None
    token = f",{oid},"
    at = text.find(token)
    if at >= 0:
        start = at + len(token)
    elif text.startswith(f"[{oid},"):
        start = len(token)
    elif text.endswith(f",{oid}]") or text == f"[{oid}]":
        return []                       # the last one: nothing comes after it
    else:
        return None
    return _whole_numbers(text[start:start + (count + 1) * REFERENCE_CHARS], count)


def oids_text(oids: Iterable[int]) -> str:
    """``oids`` as a JSON array's text, in their order: one parameter that ``json_each``
    reads whatever their number (a commit's current tids, its revisions made current,
    a walk's seeds)."""
    return "[" + ",".join(map(str, oids)) + "]"


def _whole_numbers(piece: str, count: int) -> list[int]:
    """The first ``count`` numbers of ``piece``, a JSON array text's elements from a
    boundary on, cut after them: to its "]", or to its last comma (what follows may be
    part of a number)."""
    if piece.endswith("]"):
        items = piece[:-1].split(",")
    else:
        items = piece.split(",")[:-1]
    return [int(item) for item in items[:count] if item]


# A revision's references as its text, for ``references_following``; a load with them.
HF_REFERENCES_TEXT = "SELECT refs FROM object_state WHERE zoid = %s"
HP_REFERENCES_TEXT = ("SELECT refs FROM object_state WHERE zoid = %s AND tid <= %s"
                      " ORDER BY tid DESC LIMIT 1")
HF_LOAD_WITH_TEXT = "SELECT tid, checksum, state, refs FROM object_state WHERE zoid = %s"
HP_LOAD_WITH_TEXT = ("SELECT tid, checksum, state, refs FROM object_state WHERE zoid = %s"
                     " AND tid <= %s ORDER BY tid DESC LIMIT 1")

# A walk in one statement (``load_walked``): from the seeds, given as a JSON array's
# text (no limit on variables, one statement text), through each walked state's
# references, breadth first (SQLite's recursive queue is first in, first out; UNION
# adds an oid once, so a cycle ends), the LIMIT stopping the recursion.  Walking a
# cold OOBTree of 100,000 items took a statement a bucket, one step after another,
# because only a loaded bucket names the next one; here one statement brings the
# next 60 buckets and their items (1,000 states in ~2 ms).  The walk follows the
# references of current revisions; each state comes as of the snapshot.
HP_WALK = (
    "WITH RECURSIVE walk (zoid) AS (SELECT value FROM json_each(%s)"
    " UNION SELECT j.value FROM walk w JOIN current_object c ON c.zoid = w.zoid"
    " JOIN object_state r ON r.zoid = c.zoid AND r.tid = c.tid, json_each(r.refs) j"
    " WHERE r.state_size <= %s LIMIT %s)"
    " SELECT s.zoid, s.tid, s.checksum, s.state FROM walk w"
    " JOIN current_object c ON c.zoid = w.zoid JOIN object_state s ON s.zoid = c.zoid"
    " AND s.tid = CASE WHEN c.tid <= %s THEN c.tid ELSE (SELECT MAX(m.tid)"
    " FROM object_state m WHERE m.zoid = c.zoid AND m.tid <= %s) END")
HF_WALK = (
    "WITH RECURSIVE walk (zoid) AS (SELECT value FROM json_each(%s)"
    " UNION SELECT j.value FROM walk w JOIN object_state r ON r.zoid = w.zoid,"
    " json_each(r.refs) j WHERE r.state_size <= %s LIMIT %s)"
    " SELECT s.zoid, s.tid, s.checksum, s.state FROM walk w"
    " JOIN object_state s ON s.zoid = w.zoid")


# Staging: multi-row INSERTs, whose rows are bound together rather than stepped one by
# one (executemany: 1,000 rows took 1.4 ms, 0.56 ms here), and whose NULLs are not bound
# at all where a group of rows has them all: sqlite3 binds None through its adaptation
# lookup (two NULL columns cost 0.4 of those 1.4 ms).  The same lookup made each state,
# a ``bytes``, cost ~1.2 us to bind, against ~0.07 for an int: a statement's states go
# as one blob, which each row cuts with ``substr`` at its offset (the statement of
# 1,000 rows of 150 bytes, alone: 2.2 ms -> 0.7 ms; ``stage`` of 1,001 rows, building
# its values included: 2.8 -> 1.95 ms).
#: Rows one staging statement carries at most.
STAGED_PER_STATEMENT = 1024
#: The bytes of states one statement's blob carries at most (a larger state goes alone):
#: far below SQLite's limit on a value (1,000,000,000 bytes by default).
STAGED_BYTES_PER_STATEMENT = 16 << 20
#: A state without references, as most leaves are, and not a copy of an older one.
STAGE_PLAIN = "INSERT INTO temp_store (zoid, prev_tid, checksum, state_size, state)"
#: One with references.
STAGE_REFERRING = "INSERT INTO temp_store (zoid, prev_tid, checksum, state_size, state, refs)"
#: Any other (a deletion, a copy of an older revision's state, an empty state).
STAGE_ANY = ("INSERT INTO temp_store (zoid, prev_tid, data_tid, checksum, state_size,"
             " state, refs)")
# Written at vote (``write_states``: the commit holds SQLite's only write lock from
# there, ``SQLiteFeatures.writes_at_vote``), the same rows go into ``object_state``
# itself, the second value of each being the commit's tid: what staging cost twice
# (into temp_store, then moved by finish) costs once.
WRITE_PLAIN = "INSERT INTO object_state (zoid, tid, checksum, state_size, state)"
WRITE_REFERRING = "INSERT INTO object_state (zoid, tid, checksum, state_size, state, refs)"
#: History-free: a new revision replaces the row (``excluded.refs``: NULL where the
#: plain statement names no references).
HF_WRITE_REPLACES = (
    " ON CONFLICT (zoid) DO UPDATE SET tid = excluded.tid, checksum = excluded.checksum,"
    " state_size = excluded.state_size, refs = excluded.refs, state = excluded.state")
#: History-preserving: the revisions of ``tid`` become the current ones, their oids
#: given as a JSON array's text (1,000 rows: 0.4 ms; read back from object_state by
#: its tid index, 1.0).
HP_WRITE_CURRENT = (
    "INSERT INTO current_object (zoid, tid) SELECT value, %s FROM json_each(%s)"
    " WHERE true ON CONFLICT (zoid) DO UPDATE SET tid = excluded.tid")
#: A state of no bytes (``substr`` can't cut it from the blob), with its tid.
WRITE_ANY = ("INSERT INTO object_state (zoid, tid, checksum, state_size, state, refs)"
             " VALUES (%s, %s, %s, %s, %s, %s)")
_PLAIN_COLUMNS = "column1, column2, column3, column5, substr(?1, column4, column5)"
#: What the plain and referring groups select from their rows' values (zoid, prev_tid
#: or tid, checksum, the state's offset in the blob, its length[, refs]): the blob is
#: ``?1``.
SLICED_COLUMNS = {
    STAGE_PLAIN: _PLAIN_COLUMNS,
    STAGE_REFERRING: _PLAIN_COLUMNS + ", column6",
    WRITE_PLAIN: _PLAIN_COLUMNS,
    WRITE_REFERRING: _PLAIN_COLUMNS + ", column6",
}


def staging_groups(states: Sequence[StagedState],
                   ) -> list[tuple[str, int, list[StagedState]]]:
    """``states`` as (statement head, values per row, rows): a group's rows all have
    NULL where its statement names no column.  The plain and referring groups hold
    states of one byte or more (``substr`` of an empty blob is NULL)."""
    plain: list[StagedState] = []
    referring: list[StagedState] = []
    other: list[StagedState] = []
    for row in states:
        if row[2] is not None or row[3] is None or not row[5]:
            other.append(row)
        elif row[6] is None:
            plain.append(row)
        else:
            referring.append(row)
    return [(STAGE_PLAIN, 5, plain), (STAGE_REFERRING, 6, referring), (STAGE_ANY, 7, other)]


#: A staged row's stored size (``STAGED_SIZE``) and its oid, read in C.
_stored_size = operator.itemgetter(STAGED_SIZE)
_oid_of = operator.itemgetter(STAGED_OID)


@functools.lru_cache(maxsize=64)
def staging_statement(head: str, width: int, rows: int, tail: str = "") -> str:
    """``head`` with ``rows`` rows of ``width`` values, of which those whose first value
    (the oid) is NULL are padding, not inserted: a statement's rows are a power of two,
    so that the connection prepares a few texts once each (preparing the text of 1,000
    rows took 0.75 ms).  The plain and referring heads take their states from the blob
    bound first (``SLICED_COLUMNS``); ``tail`` follows the rows (an upsert's clause)."""
    values = ",".join(["(" + ",".join(["%s"] * width) + ")"] * rows)
    columns = SLICED_COLUMNS.get(head, "*")
    return (f"{head} SELECT {columns} FROM (VALUES {values}) WHERE column1 IS NOT NULL"
            + tail)


def row_spans(count: int, largest: int) -> list[tuple[int, int]]:
    """(start, end) of ``count`` rows in statements of ``largest`` rows at most."""
    return [(start, min(start + largest, count)) for start in range(0, count, largest)]


def statement_spans(sizes: Sequence[int], largest: int, most_bytes: int,
                    ) -> list[tuple[int, int]]:
    """(start, end) of the rows of each statement: ``largest`` rows at most, and states
    of ``most_bytes`` at most in all unless one state alone is larger."""
    if sum(sizes) <= most_bytes:      # the usual case, without a step per row
        return row_spans(len(sizes), largest)
    spans = []
    start = total = 0
    for at, size in enumerate(sizes):
        if at > start and (at - start == largest or total + size > most_bytes):
            spans.append((start, at))
            start, total = at, 0
        total += size
    spans.append((start, len(sizes)))     # not empty: its sizes passed most_bytes
    return spans


def sliced_values(rows: Sequence[StagedState], referring: bool,
                  tid: int | None = None) -> list[Any]:
    """The values of a plain or referring statement's ``rows``: their states joined in
    one blob, first, then each row's zoid, prev_tid (or ``tid`` when given), checksum,
    offset, length[, refs]."""
    columns = list(zip(*rows))
    states = columns[5]
    lengths = list(map(len, states))
    offsets = itertools.accumulate(lengths, initial=1)
    second = columns[1] if tid is None else itertools.repeat(tid, len(rows))
    picked = [columns[0], second, columns[3], offsets, lengths]
    if referring:
        picked.append(columns[6])
    values: list[Any] = [b"".join(states)]
    values += itertools.chain.from_iterable(zip(*picked))
    return values


class SQLiteMover(Mover):
    CREATE_TEMP_TABLES = CREATE_TEMP_TABLES
    # Under the oldest default limit on a statement's variables (999), with room for
    # the other parameters of a prefetch.
    MAX_LISTED_OIDS = 990
    LOOKS_AHEAD = True
    # A container larger than this is asked for its references after a miss
    # (``references_after``: its text searched, 3 us) rather than read with ZODB's
    # pickle reader (7 ms for 10,000 children); a BTree's buckets are read.
    LOOKAHEAD_LARGEST = 4096

    def _at_snapshot(self, oid: int, snapshot_tid: int) -> tuple[int, ...]:
        return (oid, snapshot_tid) if self.keep_history else (oid,)

    def references_after(self, conn: ConnectionRole, parent: int, oid: int,
                         snapshot_tid: int, count: int) -> list[int] | None:
        """As the portable version, from the revision's text (``references_following``)."""
        sql = HP_REFERENCES_TEXT if self.keep_history else HF_REFERENCES_TEXT
        row = conn.fetchone(sql, self._at_snapshot(parent, snapshot_tid))
        return references_following(row[0] if row else None, oid, count)

    def load_and_references(self, conn: ConnectionRole, oid: int, snapshot_tid: int,
                            count: int) -> tuple[StateRow | None, list[int]]:
        """As the portable version, in one statement (``first_references``)."""
        sql = HP_LOAD_WITH_TEXT if self.keep_history else HF_LOAD_WITH_TEXT
        row = conn.fetchone(sql, self._at_snapshot(oid, snapshot_tid))
        if row is None:
            return None, []
        loaded = state_row(row[:3], oid, self.backend.codec)
        return loaded, first_references(row[3], count)

    def load_walked(self, conn: ConnectionRole, seeds: Sequence[int], snapshot_tid: int,
                    limit: int, largest: int) -> list[LoadedState]:
        """As the contract says, in one recursive statement (``HP_WALK``)."""
        if not seeds or limit <= 0:
            return []
        start = oids_text(seeds)
        params: tuple[Any, ...]
        if self.keep_history:
            sql, params = HP_WALK, (start, largest, limit, snapshot_tid, snapshot_tid)
        else:
            sql, params = HF_WALK, (start, largest, limit)
        return loaded_states(conn.fetchall(sql, params), self.backend.codec)

    def stage(self, conn: ConnectionRole, states: Sequence[StagedState]) -> None:
        """As the portable staging, in a few multi-row INSERTs (see ``staging_groups``)."""
        for head, width, rows in staging_groups(states):
            if rows:
                self._insert(conn, head, width, rows)

    def write_states(self, conn: ConnectionRole, tid: int,
                     states: Sequence[StagedState]) -> None:
        """The states as the revisions of ``tid``, in the staging's multi-row INSERTs
        aimed at ``object_state`` (then, history-preserving, one statement makes them
        current).  ``states`` holds no deletion and no copy (``data_tid``).

        In oid order: ZODB stores a commit's new objects last found first, and rows
        inserted in descending order split the table's pages half full (a 1,000-object
        commit wrote 137 pages of log instead of 81, its COMMIT 3.2 ms instead of 2.3);
        ascending, they fill each page as they append.  (Staging had the order of
        ``temp_store``'s key.)"""
        tail = "" if self.keep_history else HF_WRITE_REPLACES
        states = sorted(states, key=operator.itemgetter(0))
        for head, width, rows in staging_groups(states):
            if not rows:
                continue
            if head == STAGE_ANY:            # states of no bytes: rare, one by one
                conn.executemany(WRITE_ANY + tail, [
                    (oid, tid, check, size, state, refs)
                    for oid, _, _, check, size, state, refs in rows])
            else:
                write = WRITE_PLAIN if head == STAGE_PLAIN else WRITE_REFERRING
                self._insert(conn, write, width, rows, tid, tail)
        if self.keep_history:
            conn.execute(HP_WRITE_CURRENT, (tid, oids_text(map(_oid_of, states))))

    def _insert(self, conn: ConnectionRole, head: str, width: int,
                rows: Sequence[StagedState], tid: int | None = None, tail: str = "",
                ) -> None:
        """``rows`` (one group of ``staging_groups``) in statements of ``head``."""
        variables: int = getattr(conn, "max_variables")    # an SQLiteConnection's
        sliced = head in SLICED_COLUMNS
        largest = STAGED_PER_STATEMENT
        while largest * width + sliced > variables:    # the blob is one more
            largest //= 2
        if sliced:
            # A sliced row's state is stored as it is: its size is its length.
            spans = statement_spans(list(map(_stored_size, rows)), largest,
                                    STAGED_BYTES_PER_STATEMENT)
        else:
            spans = row_spans(len(rows), largest)
        referring = head in (STAGE_REFERRING, WRITE_REFERRING)
        for start, end in spans:
            chunk = rows[start:end]
            size = 1 << (len(chunk) - 1).bit_length()
            values = (sliced_values(chunk, referring, tid) if sliced
                      else list(itertools.chain.from_iterable(chunk)))
            values += [None] * (width * (size - len(chunk)))
            conn.execute(staging_statement(head, width, size, tail), values)

    # json_each numbers an array's elements from 0 (``key``) and goes through them in
    # order, so the condition on the position needs no sort.
    FIRST_REFERENCES = ("SELECT k.zoid, j.value AS to_zoid FROM kept k, json_each(k.refs) j"
                        f" WHERE j.key < {REFERENCES_EACH}")
