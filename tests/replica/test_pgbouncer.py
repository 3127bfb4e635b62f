"""zodbsql behind pgbouncer (Debian's package, on a private primary): what the storage
finds at start-up.

Session mode keeps one server session per client session, so everything zodbsql keeps
in a session survives (``test_suites.py`` runs ZODB's suites through it).  Transaction
mode hands server sessions around between transactions: a storage refuses to start
there, naming pool_mode.
"""
from __future__ import annotations

import pytest

import zodbsql
from tests.replica.cluster import PrivatePgBouncer
from zodbsql.backends.postgresql.options import PostgreSQLOptions
from zodbsql.errors import ConfigurationError

pytestmark = pytest.mark.replica


def test_session_mode_is_recognised(pgbouncer_session: PrivatePgBouncer) -> None:
    storage = zodbsql.open_storage(PostgreSQLOptions(dsn=pgbouncer_session.dsn()))
    try:
        assert getattr(storage.backend, "pooling") == "session"
    finally:
        storage.close()


def test_transaction_mode_is_refused_at_start(pgbouncer_transaction: PrivatePgBouncer) -> None:
    with pytest.raises(ConfigurationError, match="pool_mode = session"):
        zodbsql.open_storage(PostgreSQLOptions(dsn=pgbouncer_transaction.dsn()))


def test_a_direct_session_is_recognised(pgbouncer_session: PrivatePgBouncer) -> None:
    storage = zodbsql.open_storage(PostgreSQLOptions(dsn=pgbouncer_session.server.dsn()))
    try:
        assert getattr(storage.backend, "pooling") == "direct"
    finally:
        storage.close()
