"""The proxy itself, with the plain drivers (no zodbsql): it relays, and its two cuts
leave the server committed (FORWARD) or not (DROP) while the client gets an error.

The outcome tests rely on this: a balance of 40 there must mean a retried commit, not a
proxy that failed to let the first COMMIT through.
"""
from __future__ import annotations

from typing import Any

import pytest

from tests.fault.conftest import MakeScratch
from tests.fault.proxy import CommitCutProxy, Mode
from tests.fault.targets import ScratchDatabase

pytestmark = pytest.mark.fault


def connect(scratch: ScratchDatabase, port: int) -> Any:
    """A driver connection to the scratch database (not autocommit) through ``port``."""
    server = scratch.server
    assert server is not None
    if scratch.backend == "postgresql":
        import psycopg
        conn = psycopg.connect(host=server.host, port=port, user=server.user,
                               dbname=server.dbname, sslmode="disable", gssencmode="disable",
                               options=f"-c search_path={scratch.name}")
        return conn
    from zodbsql.backends.mysql.connections import load_driver
    name, module = load_driver("auto")
    return module.connect(host=server.host, port=port, user=server.user,
                          db=scratch.name, autocommit=False)


def insert(conn: Any, value: int) -> None:
    conn.cursor().execute(f"INSERT INTO probe (value) VALUES ({value})")
    conn.commit()


def values(scratch: ScratchDatabase) -> list[int]:
    server = scratch.server
    assert server is not None
    conn = connect(scratch, server.port)
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT value FROM probe ORDER BY value")
        return [int(row[0]) for row in cursor.fetchall()]
    finally:
        conn.close()


@pytest.mark.parametrize("backend", ["postgresql", "mysql"])
def test_proxy_relays_and_cuts(backend: str, make_scratch: MakeScratch) -> None:
    scratch = make_scratch(backend)
    assert scratch.server is not None
    with CommitCutProxy(backend, scratch.server.host, scratch.server.port) as proxy:
        conn = connect(scratch, proxy.port)
        conn.cursor().execute("CREATE TABLE probe (value INTEGER)")
        conn.commit()
        for value in range(5):   # unarmed: relayed; psycopg prepares COMMIT after two
            insert(conn, value)
        proxy.arm(Mode.FORWARD)
        with pytest.raises(Exception):
            insert(conn, 100)
        proxy.arm(Mode.DROP)
        conn = connect(scratch, proxy.port)
        with pytest.raises(Exception):
            insert(conn, 200)
        assert (proxy.cuts, proxy.unanswered) == (2, 0)
    assert values(scratch) == [0, 1, 2, 3, 4, 100]
