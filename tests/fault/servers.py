"""Private PostgreSQL and MariaDB servers, for tests that stop, kill or restart one.

The shared servers on 127.0.0.1:5432 and :3306 belong to everyone on the machine; a test
that takes a server down starts its own: a fresh data directory in a temporary directory,
a free loopback port, trust (PostgreSQL) or password-less root (MariaDB) logins, and a
database ``test``.  Teardown stops the server and removes the directory, also when the
test failed.  The fixtures are session-scoped (one start per run) and importable by
other suites (replicas, clusters): ``from tests.fault.servers import private_postgresql``;
``start_private(PrivatePostgreSQL, settings={...})`` (or ``PrivateMariaDB, options=[...]``)
starts more, configured, servers (a primary and its replica), which the caller cleans up.

PostgreSQL refuses to run as root: when the tests run as root, ``initdb`` and ``pg_ctl``
run as the ``postgres`` OS user (``runuser``), which owns the directory.
"""
from __future__ import annotations

import glob
import os
import pathlib
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any, Iterator, Sequence

import pytest

from tests.databases import server_unavailable

START_TIMEOUT = 60.0


#: Where the private servers' ports are drawn from: below the kernel's range of ephemeral
#: ports.  A port the kernel hands out (bind to port 0) comes from the range it also
#: gives outgoing connections, so between the choice and a server's start, or its
#: restart much later, a client's socket could hold it: a Galera node's IST listener
#: once failed to start so ("Address already in use") and its cluster's tests errored.
LISTEN_PORTS = (10000, 32768)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on (now), outside the ephemeral range."""
    low, high = LISTEN_PORTS
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = min(high, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        pass
    for _ in range(200):
        port = random.randrange(low, high) if high > low else 0
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RuntimeError(f"no free TCP port on 127.0.0.1 between {low} and {high}")


def find_binary(name: str, patterns: tuple[str, ...] = ()) -> str | None:
    """``name`` on PATH, else the newest match of ``patterns`` (version directories)."""
    found = shutil.which(name)
    if found:
        return found
    for pattern in patterns:
        matches = sorted(glob.glob(pattern), key=_version_key)
        if matches:
            return matches[-1]
    return None


def _version_key(path: str) -> list[int]:
    return [int(part) for part in path.split("/") if part.isdigit()]


def _log_tail(path: pathlib.Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class PrivateServer:
    """One server process on a free port, with its data in ``directory``."""

    name = "server"
    directory: pathlib.Path
    port: int

    def start(self) -> None:
        raise NotImplementedError

    def stop_immediately(self) -> None:
        """Stop without a clean shutdown (a crash, as far as the data is concerned)."""
        raise NotImplementedError

    def is_running(self) -> bool:
        raise NotImplementedError

    def ensure_running(self) -> None:
        if not self.is_running():
            self.start()

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop_immediately()
        time.sleep(down_seconds)
        self.start()

    def setup(self) -> None:
        """Create the data directory, start the server, create database ``test``."""
        raise NotImplementedError

    def cleanup(self) -> None:
        try:
            if self.is_running():
                self.stop_immediately()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def wait_until_accepting(self, log: pathlib.Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                self.admin().close()
                return
            except Exception:
                if not self.is_running():
                    break
                time.sleep(0.1)
        raise RuntimeError(f"private {self.name} on port {self.port} did not start:\n"
                           + _log_tail(log))

    def admin(self) -> Any:
        """A driver connection as the superuser, to the server's own database."""
        raise NotImplementedError


class PrivatePostgreSQL(PrivateServer):
    """``initdb`` + ``pg_ctl`` in a temporary directory."""

    name = "PostgreSQL"
    PATTERNS = ("/usr/lib/postgresql/*/bin/{}",)

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        """``settings``: extra postgresql.conf lines (``{"wal_level": "replica"}``)."""
        self.settings = dict(settings or {})
        self.bin: dict[str, str] = {}
        for tool in ("initdb", "pg_ctl"):
            path = find_binary(tool, tuple(p.format(tool) for p in self.PATTERNS))
            if path is None:
                raise FileNotFoundError(
                    f"{tool} not found on PATH or in /usr/lib/postgresql/*/bin"
                    " (Debian package postgresql)")
            self.bin[tool] = path
        self.user = self._os_user()
        self.directory = pathlib.Path(tempfile.mkdtemp(prefix="zodbsql-fault-pg-"))
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self.port = free_port()

    def setup(self) -> None:
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        self._run(self.bin["initdb"], "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "-E", "UTF8", "--no-sync")
        settings = {"port": str(self.port), "listen_addresses": "'127.0.0.1'",
                    "unix_socket_directories": f"'{self.directory}'",
                    "max_connections": "60", "shared_buffers": "32MB", **self.settings}
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("".join(f"\n{key} = {value}" for key, value in settings.items()) + "\n")
        self.start()
        with self.admin() as conn:
            conn.execute("CREATE DATABASE test")

    @staticmethod
    def _os_user() -> str | None:
        """The user to run PostgreSQL as (None: the current one, which is not root)."""
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise FileNotFoundError("running as root and there is no postgres OS user"
                                    " to run PostgreSQL as") from None
        return "postgres"

    def _run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        if self.user is not None:
            command = ("runuser", "-u", self.user, "--") + command
        result = subprocess.run(command, capture_output=True, text=True, timeout=120,
                                cwd=self.directory)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n"
                               f"{result.stdout}{result.stderr}\n{_log_tail(self.log)}")
        return result

    def start(self) -> None:
        self._run(self.bin["pg_ctl"], "-D", str(self.data), "-l", str(self.log),
                  "-w", "-t", str(int(START_TIMEOUT)), "start")
        self.wait_until_accepting(self.log)

    def stop_immediately(self) -> None:
        self._run(self.bin["pg_ctl"], "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def is_running(self) -> bool:
        return self._run(self.bin["pg_ctl"], "-D", str(self.data), "status",
                         check=False).returncode == 0

    def dsn(self, dbname: str = "test") -> str:
        return (f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"
                " sslmode=disable gssencmode=disable connect_timeout=5")

    def admin(self) -> Any:
        import psycopg
        return psycopg.connect(self.dsn("postgres"), autocommit=True)


class PrivateMariaDB(PrivateServer):
    """``mariadb-install-db`` + ``mariadbd`` in a temporary directory."""

    name = "MariaDB"

    def __init__(self, options: Sequence[str] = ()) -> None:
        """``options``: extra mariadbd command-line options (``--log-bin``...)."""
        self.options = list(options)
        self.os_user = pwd.getpwuid(os.geteuid()).pw_name
        install = find_binary("mariadb-install-db", ("/usr/bin/mariadb-install-db",))
        server = find_binary("mariadbd", ("/usr/sbin/mariadbd", "/usr/libexec/mariadbd"))
        if install is None or server is None:
            raise FileNotFoundError("mariadb-install-db or mariadbd not found"
                                    " (Debian package mariadb-server)")
        self.server_binary = server
        self.directory = pathlib.Path(tempfile.mkdtemp(prefix="zodbsql-fault-mariadb-"))
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self.socket_path = self.directory / "mysqld.sock"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.install_binary = install

    def setup(self) -> None:
        self.install_datadir()
        self.start()
        conn = self.admin()
        try:
            conn.cursor().execute("CREATE DATABASE test")
        finally:
            conn.close()

    def install_datadir(self) -> None:
        """A fresh data directory (``mariadb-install-db``), nothing started."""
        result = subprocess.run(
            [self.install_binary, "--no-defaults", f"--datadir={self.data}",
             f"--user={self.os_user}",
             "--auth-root-authentication-method=normal", "--skip-test-db",
             "--skip-name-resolve"],
            capture_output=True, text=True, timeout=180, cwd=self.directory)
        if result.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed ({result.returncode}):\n"
                               f"{result.stdout}{result.stderr}")

    def command(self) -> list[str]:
        """The server's command line (``options`` last, so they override)."""
        return [self.server_binary, "--no-defaults", f"--datadir={self.data}",
                f"--socket={self.socket_path}", f"--port={self.port}",
                "--bind-address=127.0.0.1", f"--user={self.os_user}", "--skip-name-resolve",
                f"--pid-file={self.directory / 'mysqld.pid'}", "--skip-ssl",
                # Its own temporary directory: on-disk temporary tables of one server
                # can't be touched by whatever cleans the machine's /tmp.
                f"--tmpdir={self.directory}",
                "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=32M",
                "--max-connections=100", *self.options]

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log,
                                            stderr=subprocess.STDOUT, cwd=self.directory)
        self.wait_until_accepting(self.log)

    def stop_immediately(self) -> None:
        process = self.process
        if process is None:
            return
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        self.process = None

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def admin(self) -> Any:
        from zodbsql.backends.mysql.connections import load_driver
        name, module = load_driver("auto")
        return module.connect(host="127.0.0.1", port=self.port, user="root",
                              autocommit=True, connect_timeout=5)


class PrivateRedis(PrivateServer):
    """A Redis server on a free port, keeping nothing on disk (the Redis cache's
    outage test kills it)."""

    name = "Redis"

    def __init__(self) -> None:
        binary = find_binary("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not on PATH")
        self.server_binary = binary
        self.directory = pathlib.Path(tempfile.mkdtemp(prefix="zodbsql-redis-"))
        self.log = self.directory / "redis.log"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def setup(self) -> None:
        self.start()

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [self.server_binary, "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(self.directory)],
                stdout=log, stderr=subprocess.STDOUT)
        self.wait_until_accepting(self.log)

    def stop_immediately(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)
            self.process = None

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def admin(self) -> Any:
        import redis
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)
        client.ping()
        return client


def start_private(kind: type[PrivateServer], **settings: Any) -> PrivateServer:
    """A running server of ``kind`` (``settings`` go to its constructor); a missing
    binary skips the test (fails it under CI=true).  The caller cleans it up."""
    try:
        server = kind(**settings)
    except (FileNotFoundError, ImportError) as exc:
        server_unavailable(f"a private {kind.name} server", exc)
        raise  # not reached: server_unavailable raises
    try:
        server.setup()
    except BaseException:
        server.cleanup()
        raise
    return server


def _serve(kind: type[PrivateServer]) -> Iterator[PrivateServer]:
    server = start_private(kind)
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def private_postgresql() -> Iterator[PrivateServer]:
    """A private PostgreSQL server for the session; tests may stop and restart it."""
    yield from _serve(PrivatePostgreSQL)


@pytest.fixture(scope="session")
def private_mariadb() -> Iterator[PrivateServer]:
    """A private MariaDB server for the session; tests may kill and restart it."""
    yield from _serve(PrivateMariaDB)
