"""Contenders: the databases a bench compares, from ZConfig text as ZODB users write it.

A contender is one ``<zodb NAME>`` section of a ZConfig file (any storage ZODB can
configure: ``<filestorage>``, ``<mappingstorage>``, ``<zeoclient>``, ``<zodbsql>``,
``<relstorage>``...).  Worker processes get the whole file's text and the name, and open
the database themselves, so nothing unpicklable crosses a process boundary.

Shortcuts (``--contender sqlite`` ...) write such a section for a database in a
temporary directory that the bench owns and removes.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import ZConfig
import ZODB
import ZODB.config
from ZODB.utils import z64

from zodbsql.bench.deadlocks import DeadlockCounter, counter_for
from zodbsql.bench.wire import StatementRelay
from zodbsql.errors import ConfigurationError

#: A ``<zodb NAME>`` section that holds this comment may be written to although it
#: already holds data, when ``--wipe`` is given too.
DISPOSABLE_MARK = "zodbsql-bench: disposable"

#: Storages one process owns: the workers of such a contender are threads of one
#: process (FileStorage locks its file; MappingStorage lives in memory).
SINGLE_PROCESS_STORAGES = {"FileStorage", "MappingStorage", "DemoStorage"}


@dataclass
class Contender:
    name: str
    config_text: str            # the whole ZConfig file; `name` picks the section
    owned: bool = False         # the bench created it (temporary directory)
    disposable: bool = False    # the config marks it disposable
    description: str = ""
    single_process: bool = False
    storage_class: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    deadlocks: DeadlockCounter | None = None   # its server's deadlock counter, if any
    relay: StatementRelay | None = None         # counts its statements on the wire

    def __getstate__(self) -> dict[str, Any]:
        # Workers get the contender without the relay, which lives in the bench's process.
        return {**self.__dict__, "relay": None}

    def open_db(self) -> ZODB.DB:
        return database_factory(self.config_text, self.name).open()

    def open_storage(self, read_only: bool = False) -> Any:
        storage_section = database_factory(self.config_text, self.name).config.storage
        if read_only and hasattr(storage_section.config, "read_only"):
            storage_section.config.read_only = True
        return storage_section.open()


def database_size(contender: Contender) -> int | None:
    """The contender's database size in bytes, as its storage's ``getSize`` says (None:
    it can't be opened, or gives none), after a run: what compression saves."""
    try:
        storage = contender.open_storage(read_only=True)
    except Exception:  # a storage that can't be opened read-only (ZEO down, ...)
        return None
    try:
        size = storage.getSize()
    except Exception:  # a storage without a size
        return None
    finally:
        storage.close()
    return int(size) if isinstance(size, int) and size > 0 else None


def load_factories(text: str) -> list[Any]:
    schema = ZODB.config.getDbSchema()
    try:
        config, _ = ZConfig.loadConfigFile(schema, io.StringIO(text))
    except ZConfig.ConfigurationError as exc:
        raise ConfigurationError(f"bench configuration: {exc}") from None
    return list(config.database or [])


def database_factory(text: str, name: str) -> Any:
    for factory in load_factories(text):
        if factory.name == name:
            return factory
    raise ConfigurationError(f"no <zodb {name}> section in the bench configuration")


def _disposable_names(text: str) -> set[str]:
    """Names of the ``<zodb NAME>`` sections holding the disposable mark."""
    names, current = set(), None
    for line in text.splitlines():
        opened = re.match(r"\s*<zodb\s+([^>\s]+)\s*>", line, re.I)
        if opened:
            current = opened.group(1)
        elif re.match(r"\s*</zodb\s*>", line, re.I):
            current = None
        elif current and "#" in line and DISPOSABLE_MARK in line.split("#", 1)[1]:
            names.add(current)
    return names


def from_config_text(text: str, owned: bool = False) -> list[Contender]:
    factories = load_factories(text)
    if not factories:
        raise ConfigurationError("the bench configuration has no <zodb NAME> section")
    unnamed = [f for f in factories if not f.name]
    if unnamed:
        raise ConfigurationError("every <zodb> section of a bench configuration needs a name")
    disposable = _disposable_names(text)
    return [Contender(f.name, text, owned=owned, disposable=f.name in disposable)
            for f in factories]


# -- shortcuts ---------------------------------------------------------------------------
SQLITE = """
<zodb {name}>
  <zodbsql>
    keep-history {keep_history}{cache}
    <sqlite3>
      path {dir}/Data.sqlite
    </sqlite3>
  </zodbsql>
</zodb>
"""
FILESTORAGE = """
<zodb {name}>
  <filestorage>
    path {dir}/Data.fs
  </filestorage>
</zodb>
"""
MAPPINGSTORAGE = """
<zodb {name}>
  <mappingstorage/>
</zodb>
"""
ZEOCLIENT = """
<zodb {name}>
  <zeoclient>
    server {address}
    wait true
  </zeoclient>
</zodb>
"""


POSTGRESQL = """
<zodb {name}>
  <zodbsql>
    keep-history {keep_history}{cache}
    <postgresql>
      dsn {dsn}
      schema {schema}
    </postgresql>
  </zodbsql>
</zodb>
"""
MYSQL = """
<zodb {name}>
  <zodbsql>
    keep-history {keep_history}
    <mysql>
      host {host}
      port {port}
      db {db}
      user {user}{passwd}
    </mysql>
  </zodbsql>
</zodb>
"""
RELSTORAGE_POSTGRESQL = """
%import relstorage
<zodb {name}>
  <relstorage>
    keep-history {keep_history}
    <postgresql>
      dsn {dsn}
    </postgresql>
  </relstorage>
</zodb>
"""
#: Where the server shortcuts create their scratch schema or database (environment
#: variables; the defaults are the local test servers).
POSTGRESQL_DSN = os.environ.get("ZODBSQL_BENCH_POSTGRESQL_DSN",
                                "host=127.0.0.1 port=5432 user=postgres dbname=test")
# Names are generated by the bench, never taken from input.
CREATE_DATABASE = "CREATE DATABASE {name}"
DROP_DATABASE = "DROP DATABASE IF EXISTS {name}"
END_SESSIONS = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"
MYSQL_URL = os.environ.get("ZODBSQL_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
#: The Redis server of the -redis shortcuts.
REDIS_URL = os.environ.get("ZODBSQL_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


class Servers:
    """Servers and scratch databases the bench makes for its contenders, stopped and
    dropped in ``close`` (also on Ctrl-C)."""

    def __init__(self, server_statements: bool = False) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        self.scratch = contextlib.ExitStack()
        self.server_statements = server_statements
        self.relays: dict[str, StatementRelay] = {}   # contender name -> its relay

    def relayed(self, name: str, dsn: str) -> str:
        """``dsn`` itself, or (with --server-statements) the DSN of a relay of its own
        in front of that server, which counts the contender's statements."""
        if not self.server_statements:
            return dsn
        import psycopg
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        relay = StatementRelay(str(params.get("host") or "127.0.0.1"),
                               int(params.get("port") or 5432))
        self.relays[name] = relay
        self.scratch.callback(relay.close)
        params.update(host="127.0.0.1", port=str(relay.port), sslmode="disable")
        return psycopg.conninfo.make_conninfo("", **params)

    def scratch_database(self, backend_options: Any) -> Any:
        """Backend options for a new schema (PostgreSQL) or database (MySQL) on the
        server of ``backend_options``; dropped when the bench ends."""
        backend = backend_options.create_backend(True, 30.0)
        return self.scratch.enter_context(backend.inspector.scratch())

    def start_zeo(self, directory: str) -> str:
        try:
            import ZEO  # noqa: F401
        except ImportError:
            raise ConfigurationError(
                "the zeo contender needs ZEO: pip install 'zodbsql[bench]'") from None
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        address = f"127.0.0.1:{port}"
        process = subprocess.Popen(
            [sys.executable, "-m", "ZEO.runzeo", "-a", address,
             "-f", os.path.join(directory, "Data.fs")],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(directory, "zeo.log"), "wb"))
        self.processes.append(process)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ConfigurationError(f"the ZEO server exited (log: {directory}/zeo.log)")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                return address
            time.sleep(0.1)
        raise ConfigurationError("the ZEO server did not start within 30 s")

    def scratch_postgresql_database(self, dsn: str) -> str:
        """The DSN of a new PostgreSQL database (RelStorage wants a database of its
        own: it installs procedures it looks up outside the search path)."""
        import uuid

        import psycopg
        name = f"zodbsql_bench_{uuid.uuid4().hex[:12]}"
        admin = psycopg.connect(dsn, autocommit=True)
        admin.execute(CREATE_DATABASE.format(name=name))

        def drop() -> None:
            admin.execute(END_SESSIONS, (name,))
            admin.execute(DROP_DATABASE.format(name=name))
            admin.close()
        self.scratch.callback(drop)
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        params["dbname"] = name
        return psycopg.conninfo.make_conninfo("", **params)

    def redis_prefix(self, url: str) -> str:
        """A key prefix of its own on the Redis server at ``url``, for one contender;
        its keys are deleted when the bench ends."""
        import uuid
        try:
            import redis
        except ImportError:
            raise ConfigurationError(
                "the -redis contenders need redis-py: pip install 'zodbsql[redis]'") from None
        prefix = f"zodbsql-bench-{uuid.uuid4().hex[:12]}:"
        client = redis.Redis.from_url(url)
        try:
            client.ping()
        except (redis.RedisError, OSError) as exc:
            raise ConfigurationError(f"the Redis server at {url} does not answer: {exc}"
                                     " (ZODBSQL_BENCH_REDIS_URL names it)") from None

        def delete() -> None:
            keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
            for start in range(0, len(keys), 1000):
                client.delete(*keys[start:start + 1000])
            client.close()
        self.scratch.callback(delete)
        return prefix

    def close(self) -> None:
        self.scratch.close()
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()


def _cache_line(persistent: bool, directory: str, servers: Servers, redis: bool = False,
                off: bool = False) -> str:
    """The settings of the -pcache shortcuts (a persistent cache beside the data), the
    -redis ones (the Redis level, with a key prefix of the contender's own) and the
    -nocache one (the state cache off)."""
    line = f"\n    cache-persistent-dir {directory}/state-cache" if persistent else ""
    if off:
        line += "\n    cache-size-mb 0"
    if redis:
        line += (f"\n    cache-redis-url {REDIS_URL}"
                 f"\n    cache-redis-prefix {servers.redis_prefix(REDIS_URL)}")
    return line


def _sqlite(keep_history: bool, persistent: bool = False, redis: bool = False,
            cache_off: bool = False) -> Callable[[str, str, Servers], str]:
    def make(name: str, directory: str, servers: Servers) -> str:
        return "%import zodbsql\n" + SQLITE.format(
            name=name, dir=directory, keep_history=str(keep_history).lower(),
            cache=_cache_line(persistent, directory, servers, redis, cache_off))
    return make


def _zeo(name: str, directory: str, servers: Servers) -> str:
    return ZEOCLIENT.format(name=name, address=servers.start_zeo(directory))


def _postgresql(keep_history: bool, relstorage: bool = False, persistent: bool = False,
                redis: bool = False) -> Callable[[str, str, Servers], str]:
    def make(name: str, directory: str, servers: Servers) -> str:
        from zodbsql.backends.postgresql.options import PostgreSQLOptions
        # A database of its own, as RelStorage's: PostgreSQL counts deadlocks per
        # database, so the hotspot test's figure is this contender's alone.
        dsn = servers.relayed(name, servers.scratch_postgresql_database(POSTGRESQL_DSN))
        if relstorage:
            return RELSTORAGE_POSTGRESQL.format(
                name=name, dsn=dsn, keep_history=str(keep_history).lower())
        scratch = servers.scratch_database(PostgreSQLOptions(dsn=dsn))
        return "%import zodbsql\n" + POSTGRESQL.format(
            name=name, dsn=dsn, schema=scratch.schema,
            keep_history=str(keep_history).lower(),
            cache=_cache_line(persistent, directory, servers, redis))
    return make


def _mysql(keep_history: bool) -> Callable[[str, str, Servers], str]:
    def make(name: str, directory: str, servers: Servers) -> str:
        from zodbsql.api import parse_url
        base, _ = parse_url(MYSQL_URL)
        scratch = servers.scratch_database(base)
        return "%import zodbsql\n" + MYSQL.format(
            name=name, host=scratch.host, port=scratch.port, db=scratch.db,
            user=scratch.user,
            passwd=f"\n      passwd {scratch.passwd}" if scratch.passwd else "",
            keep_history=str(keep_history).lower())
    return make


#: name -> (description, maker(section name, temporary directory, servers) -> ZConfig text)
SHORTCUTS: dict[str, tuple[str, Callable[[str, str, Servers], str]]] = {
    "sqlite": ("zodbsql on SQLite, history-preserving", _sqlite(True)),
    "sqlite-hf": ("zodbsql on SQLite, history-free", _sqlite(False)),
    "sqlite-pcache": ("zodbsql on SQLite, history-preserving, with a persistent cache"
                      " (cache-persistent-dir)", _sqlite(True, persistent=True)),
    "sqlite-redis": ("zodbsql on SQLite, history-preserving, with the Redis level"
                     " (cache-redis-url: ZODBSQL_BENCH_REDIS_URL, default the local"
                     " server)", _sqlite(True, redis=True)),
    "sqlite-nocache": ("zodbsql on SQLite, history-preserving, with the state cache off"
                       " (cache-size-mb 0)", _sqlite(True, cache_off=True)),
    "filestorage": ("ZODB FileStorage", lambda n, d, s: FILESTORAGE.format(name=n, dir=d)),
    "mappingstorage": ("ZODB MappingStorage (in memory)",
                       lambda n, d, s: MAPPINGSTORAGE.format(name=n)),
    "zeo": ("ZEO client, server over a FileStorage on 127.0.0.1", _zeo),
    "postgresql": ("zodbsql on PostgreSQL (a scratch database), history-preserving",
                   _postgresql(True)),
    "postgresql-hf": ("zodbsql on PostgreSQL (a scratch database), history-free",
                      _postgresql(False)),
    "postgresql-pcache": ("zodbsql on PostgreSQL (a scratch database), history-preserving,"
                          " with a persistent cache (cache-persistent-dir)",
                          _postgresql(True, persistent=True)),
    "postgresql-redis": ("zodbsql on PostgreSQL (a scratch database), history-preserving,"
                         " with the Redis level (cache-redis-url: ZODBSQL_BENCH_REDIS_URL,"
                         " default the local server)", _postgresql(True, redis=True)),
    "mysql": ("zodbsql on MySQL/MariaDB (a scratch database), history-preserving",
              _mysql(True)),
    "mysql-hf": ("zodbsql on MySQL/MariaDB (a scratch database), history-free",
                 _mysql(False)),
    "relstorage-postgresql": ("RelStorage on PostgreSQL (a scratch database),"
                              " history-preserving (pip install 'zodbsql[relstorage]')",
                              _postgresql(True, relstorage=True)),
}
DEFAULT_CONTENDERS = ("sqlite", "filestorage")


@contextlib.contextmanager
def prepared(config_files: list[str] | str | None, shortcuts: list[str], wipe: bool = False,
             server_statements: bool = False) -> Iterator[list[Contender]]:
    """The contenders, checked and ready; temporary files and servers go at the end.
    ``server_statements``: the PostgreSQL shortcuts go through a :class:`StatementRelay`
    each."""
    servers = Servers(server_statements)
    tmp = tempfile.mkdtemp(prefix="zodbsql-bench-")
    try:
        contenders: list[Contender] = []
        if isinstance(config_files, str):
            config_files = [config_files]
        for config_file in config_files or []:
            try:
                with open(config_file, encoding="utf-8") as f:
                    text = f.read()
            except OSError as exc:
                raise ConfigurationError(f"cannot read {config_file}: {exc}") from None
            contenders += from_config_text(text)
        if not config_files and not shortcuts:
            shortcuts = list(DEFAULT_CONTENDERS)
        for shortcut in shortcuts:
            if shortcut not in SHORTCUTS:
                raise ConfigurationError(
                    f"unknown contender {shortcut!r}; choose from {', '.join(SHORTCUTS)}")
            directory = os.path.join(tmp, shortcut)
            os.makedirs(directory)
            description, make = SHORTCUTS[shortcut]
            (contender,) = from_config_text(make(shortcut, directory, servers), owned=True)
            contender.description = description
            contender.relay = servers.relays.get(shortcut)
            contenders.append(contender)
        names = [c.name for c in contenders]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"contender names must differ: {names}")
        for contender in contenders:
            inspect(contender, wipe)
        yield contenders
    finally:
        servers.close()
        shutil.rmtree(tmp, ignore_errors=True)


def inspect(contender: Contender, wipe: bool) -> None:
    """Learn the storage's class and versions; refuse a non-empty database it may not use.

    The storage is opened read-only where it can be, so a refused database is left as
    it was.
    """
    try:
        storage = contender.open_storage(read_only=not contender.owned)
    except Exception:
        # A database that does not exist yet can't be opened read-only (SQLite):
        # creating it harms nothing, and it is checked for data all the same.
        storage = contender.open_storage()
    try:
        contender.storage_class = type(storage).__name__
        contender.single_process = contender.storage_class in SINGLE_PROCESS_STORAGES
        if not contender.description:
            contender.description = describe(storage)
        contender.versions = versions(storage)
        contender.deadlocks = counter_for(storage)
        empty = storage.lastTransaction() == z64
    finally:
        storage.close()
    if not empty and not contender.owned and not (wipe and contender.disposable):
        raise ConfigurationError(
            f"contender {contender.name!r} already holds data, left untouched: the bench"
            f" only writes to a database that is empty, or whose <zodb {contender.name}>"
            f" section has the comment '# {DISPOSABLE_MARK}' and --wipe is given")
    if not contender.single_process:
        # The root object, made here once: workers opening a new database together
        # would each try to create it.
        contender.open_db().close()


def describe(storage: Any) -> str:
    backend = getattr(storage, "backend", None)
    if backend is not None and hasattr(backend, "describe"):
        mode = "history-preserving" if storage.options.keep_history else "history-free"
        return f"zodbsql, {backend.describe()} ({mode})"
    return f"{type(storage).__module__}.{type(storage).__name__}"


def versions(storage: Any) -> dict[str, str]:
    found: dict[str, str] = {}
    backend = getattr(storage, "backend", None)
    if backend is not None and type(backend).__module__.startswith("zodbsql.backends.sqlite"):
        import sqlite3
        found["sqlite"] = sqlite3.sqlite_version
    if type(storage).__module__.startswith("relstorage"):
        with contextlib.suppress(Exception):
            found["server"] = str(storage._adapter.driver.__name__)
    return found
