"""What every instance of one storage shares, and the view the core's helpers get of it.

``SQLStorage`` (storage.py) makes one :class:`Shared` per database and hands it to each
instance.  The helpers (commit, history, iteration, pack, verify) are handed a
:class:`Shared`, or anything holding one (:class:`HasShared`), and the backend roles
they call; none imports storage.py, so the core has no import cycle.
"""
from __future__ import annotations

import itertools
import threading
from typing import Protocol

from zodbsql.atrest.codec import PLAIN, RecordCodec
from zodbsql.backends.base import oidalloc
from zodbsql.backends.base.connections import ConnectionPool, StatementTally
from zodbsql.backends.base.contract import BackendContract, ConnectionRole
from zodbsql.cache import StateCache
from zodbsql.cache.persistent import PersistentCache
from zodbsql.cache.lookahead import ReferenceMemo
from zodbsql.cache.prefetch import Prefetcher, working_bytes
from zodbsql.cache.secondlevel import RedisCache
from zodbsql.backends.base.trace import Tracer
from zodbsql.options import Options
from zodbsql.storage.metrics import StorageMetrics
from zodbsql.storage.blobs import BlobFiles
from zodbsql.storage.records import matcher, references

#: Committing connections one storage keeps open at most.
COMMIT_POOL_SIZE = 8


class Shared:
    """What every instance of one storage shares."""

    def __init__(self, backend: BackendContract, options: Options,
                 codec: RecordCodec = PLAIN) -> None:
        self.backend = backend
        #: How states are stored (compressed, encrypted); the backend's roles read
        #: and write through it.
        self.codec = codec
        #: Does a loaded state match its stored checksum (``records.matcher``, remade
        #: when the storage opens and reads the checksum key)?
        self.matches = matcher(codec.checksum_key)
        backend.use_codec(codec)
        self.options = options
        self.cache = StateCache(int(options.cache_size_mb * 1024 * 1024),
                                compress=options.cache_compress)
        batch = self.cache.prefetch_batch(options.prefetch_count, options.prefetch_bytes)
        working = working_bytes(*batch)
        self.cache.reserve(working)
        # The queue's and the tails' cost grows with what the process reads and never
        # uses: counted as it moves, so the process keeps to cache-size-mb for hours.
        self.prefetcher = Prefetcher(
            *batch, held=self.cache.holds,
            report=lambda cost: self.cache.reserve(working + cost))
        #: The references of cached states, for the client's lookahead (SQLite).
        self.references_of = ReferenceMemo(references)
        self.statements = StatementTally()
        self.pool = ConnectionPool(
            lambda: self.counted(backend.connect_for_commit(options.commit_lock_timeout)),
            COMMIT_POOL_SIZE)
        self.oid_lock = threading.Lock()
        self.free_oids: list[int] = []
        self.oid_block = oidalloc.BLOCK
        self.last_allocation = 0.0
        #: The serial number of the commit that allocated the last block (blocks grow
        #: within one commit; a number, not the commit, so its states are not kept
        #: alive); 0: allocated outside a commit.
        self.last_allocator = 0
        #: The oids allocated for the commit ``last_allocator`` (0: outside a commit).
        self.allocated_in_commit = 0
        self.highest_oid_seen = 0
        self.pack_lock = threading.Lock()
        self.closed = False
        # A load connection no instance holds: the root's once it has checked the
        # schema, or one a released instance gave back.  The next instance takes it
        # instead of opening a server session (a ZODB DB's root storage loads nothing
        # after opening, so its first connection serves the DB's first instance).
        self._spare: ConnectionRole | None = None
        self._spare_lock = threading.Lock()
        self.blob_files = BlobFiles(options) if options.blob_dir else None
        #: The cache's file (cache-persistent-dir), once the storage has opened it.
        self.persistent: PersistentCache | None = None
        #: The Redis level (cache-redis-url), once the storage has opened it.
        self.second_level: RedisCache | None = None
        #: The newest tid this process committed: no snapshot read on a standby may be
        #: older (read-your-writes).
        self.last_commit = 0
        #: The backend's server generation the cache was filled from (a failover
        #: empties it).
        self.generation = backend.server_generation
        #: How many times the cache was emptied because the server changed or went
        #: back in time: an instance that has not polled since must forget everything.
        self.resets = 0
        #: The storage's metrics (``metrics``; None: off), made by the root storage.
        self.metrics: StorageMetrics | None = None
        #: The SQL trace every connection of this storage reports to (None: off).
        self.tracer = (Tracer(options.sql_trace, options.slow_statement,
                              options.slow_statement_explain,
                              options.name or backend.describe())
                       if options.sql_trace or options.slow_statement is not None else None)
        #: Whether a transaction start may keep its snapshot (backends/base/wakeup.py);
        #: started by the storage once its schema is ready.
        self.watch = backend.watch_commits()
        # The snapshots instances may read at (an instance's number -> its snapshot):
        # from its poll (or a start that kept its snapshot) to its afterCompletion.
        self._reading: dict[int, int] = {}
        self._reading_lock = threading.Lock()
        self._instance_numbers = itertools.count()

    def instance_number(self) -> int:
        """A number no other instance of this storage has (``reading_at``)."""
        return next(self._instance_numbers)

    def reading_at(self, instance: int, snapshot: int | None) -> None:
        """Instance ``instance`` may read at ``snapshot`` from now on (None: at none
        until its next poll)."""
        with self._reading_lock:
            if snapshot is None:
                self._reading.pop(instance, None)
            else:
                self._reading[instance] = snapshot

    def others_read_before(self, instance: int, tid: int) -> bool:
        """May an instance other than ``instance`` read at a snapshot before ``tid``?
        Only then is a state a poll up to ``tid`` retires worth keeping as an exact
        revision (``StateCache.after_poll``)."""
        with self._reading_lock:
            return any(snapshot < tid for number, snapshot in self._reading.items()
                       if number != instance)

    def counted(self, conn: ConnectionRole) -> ConnectionRole:
        """Add ``conn``'s statements from now on to this storage's running total, and
        trace them when the trace is on."""
        conn.tally = self.statements
        conn.tracer = self.tracer
        return conn

    def connect(self) -> ConnectionRole:
        return self.counted(self.backend.connect())

    def take_load_connection(self) -> ConnectionRole:
        """The spare load connection if there is one, else a new one."""
        with self._spare_lock:
            conn, self._spare = self._spare, None
        return conn if conn is not None else self.connect()

    def give_load_connection(self, conn: ConnectionRole) -> None:
        """Keep ``conn``, rolled back, as the spare; close it if there is one already,
        if it broke, or once the storage is closed."""
        conn.rollback()
        if not conn.broken:
            with self._spare_lock:
                if self._spare is None and not self.closed:
                    self._spare = conn
                    return
        conn.close()

    def close_spare(self) -> None:
        """Close the spare load connection (the storage is closed: none is kept)."""
        with self._spare_lock:
            conn, self._spare = self._spare, None
        if conn is not None:
            conn.close()


class HasShared(Protocol):
    """A storage, as the helpers that are handed one see it."""

    @property
    def shared(self) -> Shared: ...
