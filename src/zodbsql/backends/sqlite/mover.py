"""SQLite stages commits in TEMP tables, which take no lock on the database file.

Its client picks what a miss brings along (``LOOKS_AHEAD``), from the cached states and
from a revision's references as text (``references_after``, ``load_and_references``),
so the storage never sends the prefetching statement here; ``load_with_references`` is
the portable one.
"""
import functools
import itertools
import operator
from typing import Any, Sequence

from zodbsql.backends.base.contract import ConnectionRole, StagedState, StateRow
from zodbsql.backends.base.mover import REFERENCES_EACH, Mover, state_row

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


# Staging: multi-row INSERTs, whose rows are bound together rather than stepped one by
# one (executemany: 1,000 rows took 1.4 ms, 0.56 ms here), and whose NULLs are not bound
# at all where a group of rows has them all: sqlite3 binds None through its adaptation
# lookup (two NULL columns cost 0.4 of those 1.4 ms).
#: Rows one staging statement carries at most.
STAGED_PER_STATEMENT = 1024
#: A state without references, as most leaves are, and not a copy of an older one.
STAGE_PLAIN = "INSERT INTO temp_store (zoid, prev_tid, checksum, state_size, state)"
#: One with references.
STAGE_REFERRING = "INSERT INTO temp_store (zoid, prev_tid, checksum, state_size, state, refs)"
#: Any other (a deletion, a copy of an older revision's state).
STAGE_ANY = ("INSERT INTO temp_store (zoid, prev_tid, data_tid, checksum, state_size,"
             " state, refs)")
_plain = operator.itemgetter(0, 1, 3, 4, 5)
_referring = operator.itemgetter(0, 1, 3, 4, 5, 6)


def staging_groups(states: Sequence[StagedState],
                   ) -> list[tuple[str, int, list[tuple[Any, ...]]]]:
    """``states`` as (statement head, values per row, rows) without the NULL values
    that the rows of a group all have."""
    plain: list[StagedState] = []
    referring: list[StagedState] = []
    other: list[StagedState] = []
    for row in states:
        if row[2] is not None or row[3] is None or row[5] is None:
            other.append(row)
        elif row[6] is None:
            plain.append(row)
        else:
            referring.append(row)
    return [(STAGE_PLAIN, 5, list(map(_plain, plain))),
            (STAGE_REFERRING, 6, list(map(_referring, referring))),
            (STAGE_ANY, 7, other)]


@functools.lru_cache(maxsize=64)
def staging_statement(head: str, width: int, rows: int) -> str:
    """``head`` with ``rows`` rows of ``width`` values, of which those whose first value
    (the oid) is NULL are padding, not inserted: a statement's rows are a power of two,
    so that the connection prepares a few texts once each (preparing the text of 1,000
    rows took 0.75 ms)."""
    values = ",".join(["(" + ",".join(["%s"] * width) + ")"] * rows)
    return f"{head} SELECT * FROM (VALUES {values}) WHERE column1 IS NOT NULL"


def statement_rows(count: int, largest: int) -> list[int]:
    """The rows of the statements that stage ``count`` rows, ``largest`` at most each:
    full statements, then the rest padded to a power of two."""
    full, rest = divmod(count, largest)
    return [largest] * full + ([1 << (rest - 1).bit_length()] if rest else [])


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

    def stage(self, conn: ConnectionRole, states: Sequence[StagedState]) -> None:
        """As the portable staging, in a few multi-row INSERTs (see ``staging_groups``)."""
        variables: int = getattr(conn, "max_variables")    # an SQLiteConnection's
        for head, width, rows in staging_groups(states):
            largest = STAGED_PER_STATEMENT
            while largest * width > variables:
                largest //= 2
            start = 0
            for size in statement_rows(len(rows), largest):
                chunk = rows[start:start + size]
                start += size
                values = list(itertools.chain.from_iterable(chunk))
                values += [None] * (width * (size - len(chunk)))
                conn.execute(staging_statement(head, width, size), values)

    # json_each numbers an array's elements from 0 (``key``) and goes through them in
    # order, so the condition on the position needs no sort.
    FIRST_REFERENCES = ("SELECT k.zoid, j.value AS to_zoid FROM kept k, json_each(k.refs) j"
                        f" WHERE j.key < {REFERENCES_EACH}")
