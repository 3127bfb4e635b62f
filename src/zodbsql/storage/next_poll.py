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
#: Frames looked at above the storage's ``afterCompletion``: a wrapping storage or a
#: decorator (mutation testing's trampolines) may stand between it and ZODB's caller.
_FRAMES_LOOKED_AT = 4


def zodb_polls_next() -> bool:
    """True when the storage's ``afterCompletion`` that calls this was called by ZODB's
    ``Connection.afterCompletion`` of a connection whose transaction manager is not
    explicit."""
    frame = sys._getframe(1).f_back
    for _ in range(_FRAMES_LOOKED_AT):
        if frame is None:
            return False
        if frame.f_code is _POLLING_CALLER:
            connection = frame.f_locals.get("self")
            return connection is not None and not getattr(
                connection, "explicit_transactions", True)
        frame = frame.f_back
    return False
