"""Standbys: how far behind the primary one is, and what the primary says of its own.

The lag is measured on the standby itself, so choosing one costs no round trip to the
primary; ``pg_stat_replication`` (on the primary) is for ``zodbsql doctor``.
"""
from __future__ import annotations

from zodbsql.backends.base.contract import ConnectionRole

#: A standby's replay lag in seconds: 0 while it streams and has applied all it
#: received (an idle primary sends nothing, so the age of the last replayed commit would
#: look like lag), else the age of the last commit it replayed.  A server that is not in
#: recovery (a promoted standby) has none.  (pg_stat_wal_receiver shows its status only
#: to superusers and pg_read_all_stats; for others the age counts.)
STANDBY_LAG = (
    "SELECT CASE WHEN NOT pg_is_in_recovery() THEN 0"
    " WHEN (SELECT status FROM pg_stat_wal_receiver) = 'streaming'"
    " AND pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0"
    " ELSE COALESCE(EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()), 1e9)"
    " END::float8")


def standby_lag(conn: ConnectionRole) -> float:
    """Seconds the standby ``conn`` is behind (see STANDBY_LAG)."""
    row = conn.fetchone(STANDBY_LAG)
    return float(row[0]) if row else float("inf")


#: The standbys streaming from this primary, with their state and replay lag.
REPLICATION = (
    "SELECT COALESCE(application_name, ''), COALESCE(client_addr::text, 'local'), state,"
    " sync_state, COALESCE(EXTRACT(EPOCH FROM replay_lag), 0)::float8"
    " FROM pg_stat_replication ORDER BY application_name")
IN_RECOVERY = "SELECT pg_is_in_recovery()"
