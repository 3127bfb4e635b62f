"""The cluster fixture itself: the standby streams, replays and is read-only."""
from __future__ import annotations

import pytest

from tests.replica.cluster import ReplicatedPostgreSQL

pytestmark = pytest.mark.replica


def test_standby_streams_and_replays(replicated: ReplicatedPostgreSQL) -> None:
    import psycopg
    assert replicated.standby is not None
    with psycopg.connect(replicated.primary.dsn(), autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS cluster_check (n int)")
        conn.execute("INSERT INTO cluster_check VALUES (42)")
    replicated.standby.wait_replayed()
    with psycopg.connect(replicated.standby.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        assert conn.execute("SELECT n FROM cluster_check").fetchall() == [(42,)]
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("INSERT INTO cluster_check VALUES (1)")
    with psycopg.connect(replicated.primary.dsn(), autocommit=True) as conn:
        conn.execute("DROP TABLE cluster_check")


def test_pgbouncer_forwards_to_the_primary(pgbouncer_session) -> None:
    import psycopg
    with psycopg.connect(pgbouncer_session.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
