"""SQLite's poll: the changed objects as a JSON array a commit, not a row each.

The portable poll (``base/poller.py``) names each changed object in a row of its own,
and history-preserving, newest per object through ``GROUP BY zoid``.  After another
process's large commits that is the whole cost of a transaction's start: a poll of
11,000 objects changed in 12,000 revisions took 11.8 ms here, 3.5 of them the
grouping (a temporary B-tree) and most of the rest the driver building a tuple of three
ints per row.  SQLite hands the same revisions over as a ``json_group_array`` text a
commit (``GROUP BY tid``, in the order of the tid index: no sort), which ``json.loads``
reads in C, and each commit's tid once.  A bench reader's start after another process
wrote two commits of 1,000 objects each: 1.0 ms of statement and 0.5 of parsing when
it sent an array of oids and one of tids for all, 0.76 and 0.23 now (profiled, with
the two-column tid index of ``schema.py``).

An object changed in two commits comes in both arrays; ``newest_each`` keeps its
newest tid.  The markers and the deletions stay rows of their own (kinds 0, 2 to 4),
as in the portable statement.  A caller's limit (base/poller.py) counts the revisions
in the range, not the objects (a poll of objects changed twice is truncated sooner):
counted by a subquery that stops one past it; past it the range is made empty, so that
no array is built, and a row of its own (kind 6) says so.  A ``LIMIT`` on the revisions
themselves would keep SQLite from reading them in the index's order, and grouping them
would sort them (1.05 ms against 0.53 for the poll above, unprofiled).
"""
from __future__ import annotations

import json
from typing import Any, ClassVar

from zodbsql.backends.base.contract import Polled
from zodbsql.backends.base.poller import (GONE_SINCE, OVER_LIMIT, REVISIONS, Poller,
                                          PollerStatements, with_commits)

#: ``{counted}``: the count of the revisions (limited) or nothing; ``{upper}``: the
#: range's end, the last tid (``CHANGED_SINCE``'s), or -1 past the limit; ``{over}``:
#: the row that says it went past.  ``?1`` is the poll's first parameter, its ``since``,
#: written so where the count comes first in the text: a ``?`` after it is the second.
CHANGED_BY_COMMIT = (
    "{counted}SELECT 0, 0, last_tid FROM commit_row"
    f" UNION ALL SELECT {REVISIONS}, tid, json_group_array(zoid) FROM object_state"
    " WHERE tid > ?1 AND tid <= (SELECT {upper}) GROUP BY tid{over}")
#: The revisions in the range, counted up to one past the limit, once (a CTE read
#: twice, which SQLite materializes: 0.47 -> 0.37 ms for the poll of two commits of
#: 1,000 objects, where the range's end and the marker each counted).
COUNTED = ("WITH counted(n) AS (SELECT count(*) FROM (SELECT 1 FROM object_state"
           " WHERE tid > ?1 AND tid <= (SELECT last_tid FROM commit_row) LIMIT {past})) ")
#: Past the limit the range is empty: SQLite computes its end once, before it seeks
#: the index (a test of the count beside the range would be made at every revision of
#: it: 68 to 110 ms for a poll of 1,000,000 revisions against 11 to 12).
WITHIN_LIMIT = "CASE WHEN n <= {limit} THEN last_tid ELSE -1 END FROM commit_row, counted"
MARK_OVER = f" UNION ALL SELECT {OVER_LIMIT}, 0, 0 FROM counted WHERE n > {{limit}}"


class SQLitePoller(Poller):
    """The portable poll, its changed objects read as arrays (the module says why)."""

    HISTORY_PRESERVING: ClassVar[PollerStatements] = PollerStatements(
        changed=CHANGED_BY_COMMIT, poll=CHANGED_BY_COMMIT + GONE_SINCE)
    HISTORY_FREE: ClassVar[PollerStatements] = HISTORY_PRESERVING

    def limited(self, template: str, limit: int) -> str:
        key = (template, limit)
        text = self._texts.get(key)
        if text is None:
            bounds = {"past": int(limit) + 1, "limit": int(limit)}
            limited = limit > 0
            text = self._texts[key] = template.format(
                counted=COUNTED.format(**bounds) if limited else "",
                upper=(WITHIN_LIMIT.format(**bounds) if limited
                       else "last_tid FROM commit_row"),
                over=MARK_OVER.format(**bounds) if limited else "")
        return text

    @staticmethod
    def parse_poll(rows: list[Any], since: int | None = None,
                   gone_since: int | None = None, limit: int = 0) -> Polled:
        # (A one-column row is the last tid alone, whatever its value.)
        ours = [len(row) == 3 and row[0] == REVISIONS for row in rows]
        commits = [(int(row[1]), json.loads(row[2]))
                   for row, mine in zip(rows, ours) if mine]
        # (A row of kind 6, OVER_LIMIT, makes it truncated.)
        return with_commits(
            Poller.parse_poll([row for row, mine in zip(rows, ours) if not mine],
                              since, gone_since), commits)
