"""A real replicated PostgreSQL: a primary and a streaming hot standby, and pgbouncer.

Both servers are private (``tests.fault.servers.PrivatePostgreSQL``): temporary
directories, free loopback ports, trust logins, run as the ``postgres`` OS user under
root.  The standby is made with ``pg_basebackup -R`` from the running primary (it
streams from it at once) and can be promoted (``pg_ctl promote``).  With ``synchronous``
the primary waits for the standby to flush every commit before acknowledging it
(``synchronous_standby_names``), set once the standby streams: a primary configured
for a standby it does not have yet would hang every commit, ``CREATE DATABASE`` too.

pgbouncer comes from Debian's package, installed with apt-get when missing, and runs
as the ``postgres`` OS user too (it refuses root) on a loopback port in front of one
server, in the pool mode asked for.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import time
from typing import Any

from tests.fault.servers import (START_TIMEOUT, PrivatePostgreSQL, PrivateServer, _log_tail,
                                 find_binary, free_port)

#: postgresql.conf lines of a primary that streams to a hot standby.
PRIMARY_SETTINGS = {"wal_level": "replica", "max_wal_senders": "5", "hot_standby": "on",
                    "max_connections": "300",
                    "wal_keep_size": "'64MB'", "hot_standby_feedback": "on"}
#: Seconds to wait for the standby to stream, or to replay a given position.
REPLICATION_TIMEOUT = 60.0


class PrivateStandby(PrivatePostgreSQL):
    """A hot standby of ``primary``, made by ``pg_basebackup -R``."""

    name = "PostgreSQL standby"

    def __init__(self, primary: PrivatePostgreSQL) -> None:
        super().__init__()
        self.primary = primary
        tool = find_binary("pg_basebackup", ("/usr/lib/postgresql/*/bin/pg_basebackup",))
        if tool is None:
            raise FileNotFoundError("pg_basebackup not found (Debian package postgresql)")
        self.bin["pg_basebackup"] = tool

    def setup(self) -> None:
        if self.user is not None:
            import pwd
            entry = pwd.getpwnam(self.user)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        # -R writes primary_conninfo and standby.signal; -c fast: no wait for a checkpoint.
        self._run(self.bin["pg_basebackup"], "-h", "127.0.0.1", "-p", str(self.primary.port),
                  "-U", "postgres", "-D", str(self.data), "-R", "-X", "stream", "-c", "fast",
                  "--no-sync")
        settings = {"port": str(self.port), "listen_addresses": "'127.0.0.1'",
                    "unix_socket_directories": f"'{self.directory}'",
                    "max_standby_streaming_delay": "'5s'"}
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("".join(f"\n{key} = {value}" for key, value in settings.items()) + "\n")
        with open(self.data / "postgresql.auto.conf", "a") as conf:
            # The name synchronous_standby_names lists on the primary.
            conf.write("\nprimary_conninfo = 'host=127.0.0.1 port=%d user=postgres"
                       " application_name=standby1'\n" % self.primary.port)
        self.start()

    def promote(self) -> None:
        """End recovery: the standby becomes a primary that accepts writes."""
        self._run(self.bin["pg_ctl"], "-D", str(self.data), "-w", "-t",
                  str(int(START_TIMEOUT)), "promote")

    def wait_streaming(self) -> None:
        """Until the primary lists this standby as streaming."""
        deadline = time.monotonic() + REPLICATION_TIMEOUT
        with self.primary.admin() as conn:
            while time.monotonic() < deadline:
                row = conn.execute("SELECT count(*) FROM pg_stat_replication"
                                   " WHERE application_name = 'standby1'"
                                   " AND state = 'streaming'").fetchone()
                if row and row[0]:
                    return
                time.sleep(0.1)
        raise RuntimeError("the standby did not start streaming:\n" + _log_tail(self.log))

    def wait_replayed(self) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        with self.primary.admin() as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        deadline = time.monotonic() + REPLICATION_TIMEOUT
        with self.admin() as conn:
            while time.monotonic() < deadline:
                done = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                    (row[0],)).fetchone()
                if done and done[0]:
                    return
                time.sleep(0.05)
        raise RuntimeError("the standby did not catch up:\n" + _log_tail(self.log))

    def pause_replay(self, paused: bool = True) -> None:
        """Stop (or resume) applying WAL: the standby lags while the primary commits."""
        with self.admin() as conn:
            conn.execute("SELECT pg_wal_replay_pause()" if paused else
                         "SELECT pg_wal_replay_resume()")


class ReplicatedPostgreSQL:
    """A primary and one streaming hot standby; ``cleanup`` removes both."""

    def __init__(self, synchronous: bool = False) -> None:
        self.synchronous = synchronous
        self.primary = PrivatePostgreSQL(settings=PRIMARY_SETTINGS)
        self.standby: PrivateStandby | None = None

    def setup(self) -> None:
        self.primary.setup()
        self.standby = PrivateStandby(self.primary)
        self.standby.setup()
        self.standby.wait_streaming()
        if self.synchronous:
            with self.primary.admin() as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby1'")
                conn.execute("SELECT pg_reload_conf()")
        self.standby.wait_replayed()

    def cleanup(self) -> None:
        try:
            if self.standby is not None:
                self.standby.cleanup()
        finally:
            self.primary.cleanup()

    def schema(self, name: str) -> None:
        """Create schema ``name`` in database ``test`` and wait until the standby has it."""
        with _connect(self.primary.dsn()) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        assert self.standby is not None
        self.standby.wait_replayed()


def _connect(dsn: str) -> Any:
    import psycopg
    return psycopg.connect(dsn, autocommit=True)


def ensure_pgbouncer() -> str:
    """The pgbouncer binary, installed from Debian's package when missing."""
    found = shutil.which("pgbouncer") or find_binary("pgbouncer", ("/usr/sbin/pgbouncer",))
    if found:
        return found
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "pgbouncer"]):
        result = subprocess.run(sudo + command, capture_output=True, text=True, env=env,
                                timeout=600)
        if result.returncode != 0:
            raise FileNotFoundError(f"pgbouncer is not installed and {' '.join(command)}"
                                    f" failed: {result.stdout}{result.stderr}")
    found = shutil.which("pgbouncer") or find_binary("pgbouncer", ("/usr/sbin/pgbouncer",))
    if not found:
        raise FileNotFoundError("pgbouncer is still not found after apt-get install pgbouncer")
    return found


class PrivatePgBouncer(PrivateServer):
    """pgbouncer on a free loopback port in front of ``server``'s database ``test``."""

    name = "pgbouncer"

    def __init__(self, server: PrivatePostgreSQL, pool_mode: str = "session") -> None:
        self.binary = ensure_pgbouncer()
        self.server = server
        self.pool_mode = pool_mode
        self.user = server.user
        self.directory = pathlib.Path(server.directory) / f"pgbouncer-{pool_mode}"
        self.port = free_port()
        self.log = self.directory / "pgbouncer.log"
        self.process: subprocess.Popen[bytes] | None = None

    def setup(self) -> None:
        self.directory.mkdir()
        (self.directory / "users.txt").write_text('"postgres" ""\n')
        (self.directory / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"test = host=127.0.0.1 port={self.server.port} dbname=test\n"
            f"postgres = host=127.0.0.1 port={self.server.port} dbname=postgres\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.directory / 'users.txt'}\n"
            f"pool_mode = {self.pool_mode}\nmax_client_conn = 200\ndefault_pool_size = 40\n"
            f"logfile = {self.log}\npidfile = {self.directory / 'pgbouncer.pid'}\n"
            "ignore_startup_parameters = extra_float_digits\n")
        if self.user is not None:
            subprocess.run(["chown", "-R", self.user, str(self.directory)], check=True)
        self.start()

    def start(self) -> None:
        command = [self.binary, str(self.directory / "pgbouncer.ini")]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--"] + command
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, cwd=self.directory)
        self.wait_until_accepting(self.log)

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop_immediately(self) -> None:
        # pgbouncer itself, by its pid file: a SIGKILL would end runuser, not its child.
        if self.process is None:
            return
        try:
            pid = int((self.directory / "pgbouncer.pid").read_text().split()[0])
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError, IndexError):
            self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.process = None

    def cleanup(self) -> None:
        self.stop_immediately()  # the directory goes with the server's

    def dsn(self, dbname: str = "test") -> str:
        return (f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"
                " sslmode=disable gssencmode=disable connect_timeout=5")

    def admin(self) -> Any:
        return _connect(self.dsn("postgres"))
