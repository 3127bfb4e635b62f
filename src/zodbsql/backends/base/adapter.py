"""The backend: one database, its parts declared as classes.

A reader sees a whole backend in the ``*_class`` attributes of its subclass; the storage
core talks only to the instances made from them, through the Protocols of
:mod:`zodbsql.backends.base.contract` (a ``Backend`` is a ``BackendContract``).  The roles
are made with the backend and see it through that Protocol too, so no role module
imports this one.
"""
from __future__ import annotations

import logging
import time
from typing import ClassVar, Generic, TypeVar

from zodbsql.atrest.codec import PLAIN
from zodbsql.backends.base.blobs import Blobs
from zodbsql.backends.base.checker import Checker
from zodbsql.backends.base.connections import DBConnection
from zodbsql.backends.base.contract import BackendOptions, CodecRole, ConnectionRole
from zodbsql.backends.base.features import Features
from zodbsql.backends.base.history import History
from zodbsql.backends.base.inspector import Inspector
from zodbsql.backends.base.locker import Locker
from zodbsql.backends.base.mover import Mover
from zodbsql.backends.base.oidalloc import OidAllocator
from zodbsql.backends.base.packer import Packer
from zodbsql.backends.base.poller import Poller
from zodbsql.backends.base.schema import Schema
from zodbsql.backends.base.txncontrol import TransactionControl
from zodbsql.backends.base.wakeup import CommitWatch
from zodbsql.errors import DatabaseError, described

#: The type of a backend's own options (``SQLiteOptions``, ...).
OptionsT = TypeVar("OptionsT", bound=BackendOptions)
#: Seconds between two checks of a replica session's lag.
LAG_CHECK_INTERVAL = 1.0

log = logging.getLogger(__name__)


class Backend(Generic[OptionsT]):
    """Base class of every backend.

    Subclasses implement :meth:`connect` (a new :class:`DBConnection`),
    :meth:`describe` (where the data lives, for messages) and :meth:`sort_key`.
    """

    #: Short name used in URIs, ZConfig section names and messages.
    name: ClassVar[str] = "base"
    features_class: ClassVar[type[Features]] = Features
    schema_class: ClassVar[type[Schema]] = Schema
    locker_class: ClassVar[type[Locker]] = Locker
    mover_class: ClassVar[type[Mover]] = Mover
    poller_class: ClassVar[type[Poller]] = Poller
    oids_class: ClassVar[type[OidAllocator]] = OidAllocator
    history_class: ClassVar[type[History]] = History
    packer_class: ClassVar[type[Packer]] = Packer
    checker_class: ClassVar[type[Checker]] = Checker
    txncontrol_class: ClassVar[type[TransactionControl]] = TransactionControl
    inspector_class: ClassVar[type[Inspector]] = Inspector
    blobs_class: ClassVar[type[Blobs]] = Blobs

    #: Raised by one each time :meth:`connect` reaches another server than before (a
    #: failover): what the storage cached from the old one may not be on the new one.
    server_generation = 0

    def __init__(self, options: OptionsT, keep_history: bool, lock_timeout: float,
                 read_only: bool = False) -> None:
        #: The backend's own options object (SQLiteOptions, PostgreSQLOptions, ...).
        self.options = options
        self.keep_history = keep_history
        self.lock_timeout = lock_timeout
        self.read_only = read_only
        #: Seconds of lag above which a replica is skipped (a backend with replicas
        #: sets it from its replica-max-lag); the replica to try first next time.
        self.replica_max_lag = 0.0
        self._next_replica = 0
        self.features = self.features_class()
        self.schema = self.schema_class(self)
        self.locker = self.locker_class(self)
        self.mover = self.mover_class(self)
        self.poller = self.poller_class(self)
        self.oids = self.oids_class(self)
        self.history = self.history_class(self)
        self.packer = self.packer_class(self)
        self.checker = self.checker_class(self)
        self.txncontrol = self.txncontrol_class(self)
        self.inspector = self.inspector_class(self)
        self.blobs = self.blobs_class(self)
        #: How states are stored (compressed, encrypted); the storage sets it from its
        #: options before it reads or writes a state.
        self.codec: CodecRole = PLAIN

    def use_codec(self, codec: CodecRole) -> None:
        self.codec = codec

    def connect(self) -> DBConnection:
        """Open a new connection (autocommit between explicit transactions)."""
        raise NotImplementedError

    # -- replicas: a backend that has them gives their count, a session, and its lag -----
    def replica_count(self) -> int:
        return 0

    def open_replica(self, index: int) -> DBConnection:
        """A session on replica ``index`` (of ``replica_count``), whatever its lag."""
        raise NotImplementedError

    def replica_lag(self, conn: DBConnection) -> float:
        """Seconds the replica session ``conn`` is behind its primary."""
        raise NotImplementedError

    def connect_replica(self) -> DBConnection | None:
        """A session on a replica within ``replica_max_lag``, or None (none configured,
        or none reachable within the bound).  The replicas are tried in turn, starting
        one further on each time, so that sessions spread over them."""
        count = self.replica_count()
        if count == 0:
            return None
        start, self._next_replica = self._next_replica, (self._next_replica + 1) % count
        for step in range(count):
            try:
                conn = self.open_replica((start + step) % count)
            except DatabaseError as exc:
                log.info("replica skipped: %s", described(exc))
                continue
            try:
                lag = self.replica_lag(conn)
            except DatabaseError as exc:
                log.info("replica skipped: %s", described(exc))
                conn.close()
                continue
            if lag <= self.replica_max_lag:
                conn.lag_checked = time.monotonic()
                conn.statements = 0
                return conn
            log.info("replica skipped: %s is %.1fs behind (replica-max-lag %gs)", conn.where,
                     lag, self.replica_max_lag)
            conn.close()
        return None

    def replica_in_bounds(self, conn: ConnectionRole) -> bool:
        """Is the replica ``conn`` reads from still within its lag bound?  Read on the
        replica at most once per LAG_CHECK_INTERVAL."""
        if not isinstance(conn, DBConnection):
            return True
        now = time.monotonic()
        if now - conn.lag_checked < LAG_CHECK_INTERVAL:
            return True
        try:
            lag = self.replica_lag(conn)
        except DatabaseError:
            return False
        conn.lag_checked = now
        return lag <= self.replica_max_lag

    def check_exists(self) -> None:
        """Raise :class:`SchemaError` if the database is missing, before anything
        connects and so creates it (SQLite); a server says so when connecting."""

    def connect_for_commit(self, lock_timeout: float) -> DBConnection:
        """Open a connection for committing: temp tables made, lock timeouts set."""
        conn = self.connect()
        self.mover.prepare_connection(conn)
        return conn

    def describe(self) -> str:
        """Where the data is, for messages (never includes a password)."""
        raise NotImplementedError

    def sort_key(self) -> str:
        """A key that is the same for every storage on the same database."""
        raise NotImplementedError

    def database_size(self, conn: ConnectionRole) -> int:
        """Approximate size of the stored data in bytes."""
        return 0

    def watch_commits(self) -> CommitWatch:
        """A watch for one storage (``wakeup.py``); the base one never skips a poll."""
        return CommitWatch()

    def close(self) -> None:
        """The storage is closed: stop what the backend runs besides its connections
        (SQLite's checkpoint thread); the base one runs nothing."""

    def destroy(self) -> None:
        """Remove every zodbsql table (tests and the benchmark's scratch databases)."""
        conn = self.connect()
        try:
            conn.begin_write()
            self.schema.drop_all(conn)
            conn.commit()
        finally:
            conn.close()
