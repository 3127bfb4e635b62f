"""A private MariaDB server with room for many sessions (``--max-connections`` 400).

The shared MariaDB allows 151 sessions; ZODB's 64-thread race test needs about 260
(``differences.SERVER_SESSIONS_NEEDED``), so on the shared server it would fail with
"Too many connections" as soon as anything else holds a few.  This starts a throw-away
server for it (``tests/fault/servers.py``'s ``PrivateMariaDB``: ``mariadb-install-db``
in a temporary directory, a free loopback port), removed at the end of the session.
"""
from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.conformance.roomy_postgresql import MAX_CONNECTIONS
from tests.databases import server_unavailable


@pytest.fixture(scope="session")
def roomy_mariadb() -> Iterator[dict[str, Any]]:
    """Settings (as ``tests.databases.MYSQL_SERVER``'s) of a private server."""
    from tests.fault.servers import PrivateMariaDB
    try:
        server = PrivateMariaDB([f"--max-connections={MAX_CONNECTIONS}"])
        server.setup()
    except (OSError, RuntimeError) as exc:
        server_unavailable("a private MariaDB server", exc)
    try:
        yield {"host": "127.0.0.1", "port": server.port, "unix_socket": None,
               "user": "root", "passwd": "", "driver": "auto"}
    finally:
        server.cleanup()
