"""When a MySQL server started, as an interval: how a lost COMMIT tells a restart.

``Uptime`` counts the whole seconds a server has been up; read between two readings of
the client's clock, it places the start in an interval a second or so wide, wider when
the client stalled meanwhile.  Two starts are different only when one interval lies
wholly after the other (txncontrol.py says why a false restart is the dangerous error).
"""
from __future__ import annotations

import dataclasses
import math
import time

from zodbsql.backends.base.contract import ConnectionRole

UPTIME = "SHOW GLOBAL STATUS LIKE 'Uptime'"
#: Seconds a server's start must follow the start seen before to count as a restart,
#: beyond what the readings leave open (the client's clock may be stepped meanwhile).
RESTART_MARGIN = 1.0


@dataclasses.dataclass(frozen=True)
class ServerStart:
    """When a server started: between ``earliest`` and ``latest`` (Unix time)."""

    earliest: float
    latest: float

    def certainly_before(self, other: "ServerStart") -> bool:
        """Did ``other`` start after this start, whatever the readings left open?"""
        return self.latest + RESTART_MARGIN < other.earliest


def wall_clock() -> float:
    """Unix time, not through ``time.time``: ZODB's pack tests replace that with a clock
    that moves a second at each call (``time_monotonically_increases``), under which
    two readings of one server's start moved 4 s apart and passed for a restart."""
    return time.clock_gettime(time.CLOCK_REALTIME)


def server_started(conn: ConnectionRole) -> ServerStart:
    """When the server started, from its ``Uptime`` (whole seconds up, read between
    two readings of this client's clock)."""
    asked = wall_clock()
    row = conn.fetchone(UPTIME)
    answered = wall_clock()
    if not row:
        return ServerStart(-math.inf, math.inf)    # unknown: never a restart
    up = float(row[1])
    return ServerStart(asked - up - 1.0, answered - up)
