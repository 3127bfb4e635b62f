"""Does ZODB poll this storage instance right after its ``afterCompletion``?

ZODB calls ``afterCompletion`` from two places.  ``Connection.afterCompletion`` (the
end of every transaction) calls it and then, unless the connection's transaction
manager is explicit, ``newTransaction``: ``sync`` and ``poll_invalidations`` at once.
``Connection.close`` calls it with no poll after it; the connection then waits in
the pool, maybe for hours.  A history-free read transaction may be left open for the
poll to end (one round trip on PostgreSQL, ``ends_with_begin``) only in the first
case: left open in the second, a pooled connection would hold a snapshot, and the
share locks of what it read, until it is used again.

Nothing in the call says which it is, so the caller's frame does.  If ZODB changes
its code, the answer is False: the read transaction ends at once, as it always may.
"""
from __future__ import annotations

import sys

from ZODB.Connection import Connection

_POLLING_CALLER = Connection.afterCompletion.__code__


def zodb_polls_next(depth: int = 2) -> bool:
    """True when the frame ``depth`` levels up (the caller of the storage's
    ``afterCompletion`` for the default) is ZODB's ``Connection.afterCompletion`` of a
    connection whose transaction manager is not explicit."""
    try:
        caller = sys._getframe(depth)
    except ValueError:          # a shallower stack: not called by ZODB
        return False
    if caller.f_code is not _POLLING_CALLER:
        return False
    connection = caller.f_locals.get("self")
    return connection is not None and not getattr(connection, "explicit_transactions", True)
