"""A private PostgreSQL server with room for many sessions (``max_connections`` 400).

The shared test server allows about 100 sessions; a few inherited ZODB tests need more
(``differences.SERVER_SESSIONS_NEEDED``).  This starts a throw-away server for them:
``initdb`` in a temporary directory, a free loopback port, trust logins, database
``test``; stopped and removed at the end of the session.  ``private_postgresql`` starts
one with other settings (the wake-up test's logs every statement).  PostgreSQL refuses
to run as root, so under root ``initdb`` and ``pg_ctl`` run as the ``postgres`` OS user.
(The fault tests have a fuller version of this idea; this one only has to start and
stop.)
"""
from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from typing import Iterator

import pytest

from tests.databases import server_unavailable

MAX_CONNECTIONS = 400


def _binary(name: str) -> str:
    found = shutil.which(name) or max(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                                      default=None, key=lambda p: int(p.split("/")[4]))
    if found is None:
        raise FileNotFoundError(f"{name} (Debian package postgresql) is not installed")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(*command: str) -> None:
    if os.geteuid() == 0:
        command = ("runuser", "-u", "postgres", "--") + command
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stdout}{result.stderr}")


@contextlib.contextmanager
def private_postgresql(settings: str = "") -> Iterator[tuple[str, str]]:
    """A throw-away server: ``(DSN of its database test, its directory)``; the server's
    log is ``log`` there.  ``settings``: more lines for postgresql.conf."""
    directory = tempfile.mkdtemp(prefix="zodbsql-private-pg-")
    data, port = os.path.join(directory, "data"), _free_port()
    started = False
    try:
        try:
            initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
            if os.geteuid() == 0:
                entry = pwd.getpwnam("postgres")
                os.chown(directory, entry.pw_uid, entry.pw_gid)
            _run(initdb, "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
            with open(os.path.join(data, "postgresql.conf"), "a") as conf:
                conf.write(f"\nport = {port}\nlisten_addresses = '127.0.0.1'\n"
                           f"unix_socket_directories = '{directory}'\n"
                           "shared_buffers = 32MB\nfsync = off\n" + settings + "\n")
            _run(pg_ctl, "-D", data, "-l", os.path.join(directory, "log"), "-w", "start")
            started = True
            import psycopg
            with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres",
                                 autocommit=True) as admin:
                admin.execute("CREATE DATABASE test")
        except (OSError, RuntimeError, KeyError) as exc:
            server_unavailable("a private PostgreSQL server", exc)
        yield f"host=127.0.0.1 port={port} user=postgres dbname=test", directory
    finally:
        if started:
            _run(_binary("pg_ctl"), "-D", data, "-m", "fast", "-w", "stop")
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def roomy_postgresql() -> Iterator[str]:
    """The DSN of database ``test`` on a private server with MAX_CONNECTIONS."""
    with private_postgresql(f"max_connections = {MAX_CONNECTIONS}") as (dsn, _):
        yield dsn
