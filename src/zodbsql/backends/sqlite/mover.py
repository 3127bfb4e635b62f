"""SQLite stages commits in TEMP tables, which take no lock on the database file.

Prefetch takes references by their position in the revision's array (``json_each``'s
``key``, from 0; the oids are ascending), where the ``object_ref`` view's rows needed
a sort: a load of one child of a 1,000-child container found its 999 siblings in 0.4 ms
of the statement's time.
"""
import dataclasses
import functools
import itertools
import operator
from typing import Any, Sequence

from zodbsql.backends.base.contract import ConnectionRole, StagedState
from zodbsql.backends.base.mover import (HF_KEPT, HF_LOAD_WITH_REFS, HP_KEPT,
                                        HP_LOAD_WITH_REFS, HP_PARENT, HP_REVISIONS_PORTABLE,
                                        REFERENCES_EACH, Mover, prefetching)

CREATE_TEMP_TABLES = (
    "CREATE TEMP TABLE IF NOT EXISTS temp_store (zoid INTEGER PRIMARY KEY,"
    " prev_tid INTEGER NOT NULL, data_tid INTEGER, checksum INTEGER,"
    " state_size INTEGER NOT NULL, state BLOB, refs TEXT)",
    "CREATE TEMP TABLE IF NOT EXISTS temp_blob (zoid INTEGER PRIMARY KEY, content_hash BLOB NOT NULL)",
)

HF_OWN = (" own AS (SELECT s.zoid AS parent, j.value AS zoid FROM object_state s,"
          " json_each(s.refs) j WHERE s.zoid = %s AND j.key < %s),")
# The parent and the object's position in it, then the references after that position.
HF_SIBLINGS = (
    " siblings AS (SELECT p.zoid AS parent, j.value AS zoid FROM (SELECT s.zoid, s.refs,"
    " f.key AS at FROM object_state s, json_each(s.refs) f WHERE s.zoid IN ({parents})"
    " AND f.value = %s LIMIT 1) p, json_each(p.refs) j WHERE j.value > %s"
    " AND j.key <= p.at + %s),")
HP_OWN = (" own AS (SELECT s.zoid AS parent, j.value AS zoid FROM object_state s,"
          " json_each(s.refs) j WHERE s.zoid = %s AND s.tid = (SELECT tid FROM target)"
          " AND j.key < %s),")
HP_SIBLINGS = (
    " siblings AS (SELECT s.zoid AS parent, j.value AS zoid FROM object_state s,"
    " json_each(s.refs) f, json_each(s.refs) j WHERE s.zoid = (SELECT zoid FROM parent)"
    " AND s.tid = (SELECT MAX(tid) FROM object_state WHERE zoid = (SELECT zoid FROM parent)"
    " AND tid <= %s) AND f.value = %s AND j.key > f.key AND j.key <= f.key + %s),")


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
    HISTORY_PRESERVING = dataclasses.replace(
        Mover.HISTORY_PRESERVING, load_with_refs=prefetching(
            HP_LOAD_WITH_REFS, own=HP_OWN, parent=HP_PARENT, siblings=HP_SIBLINGS,
            kept=HP_KEPT, revisions=HP_REVISIONS_PORTABLE))
    HISTORY_FREE = dataclasses.replace(Mover.HISTORY_FREE, load_with_refs=prefetching(
        HF_LOAD_WITH_REFS, own=HF_OWN, siblings=HF_SIBLINGS, kept=HF_KEPT))
    # Under the oldest default limit on a statement's variables (999), with room for
    # the other parameters of a prefetch.
    MAX_LISTED_OIDS = 990
    LOOKS_AHEAD = True
    # A large container's misses are left to the statement's choice (its siblings),
    # which read a mapping of 1,000 children warm in 5 statements at 31,000 objects/s,
    # where the lookahead took 14 at 27,000; it pays in BTrees, whose buckets are small.
    LOOKAHEAD_LARGEST = 4096

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
