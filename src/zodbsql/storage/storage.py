"""SQLStorage: ZODB's storage interfaces over one backend.

One ``SQLStorage`` is made per database; ZODB asks it for an instance per connection
(``new_instance``).  The instances share a :class:`Shared` (backend, options, state
cache, oid block, pool of committing connections); each has its own connection for
loading and its own snapshot tid, set by ``poll_invalidations``.  An instance that has
never polled (the root storage, used directly) reads the newest committed data.

With standbys configured (``backend.connect_replica``), a poll and the loads of its
snapshot go to one standby session, as long as the tid it polls is not older than the
instance's previous snapshot nor than the process's last commit; else that snapshot
is read from the primary.  A snapshot never mixes servers, except that a standby lost
in the middle hands over to the primary, which has every revision the snapshot sees.
"""
from __future__ import annotations

import logging
import struct
import threading
import time
from operator import itemgetter
from typing import Any, Callable, Iterable, NoReturn

import zope.interface
import ZODB.BaseStorage
from ZODB import POSException
from ZODB.ConflictResolution import ConflictResolvingStorage
from ZODB.blob import BlobFile
from ZODB.interfaces import (IBlobStorage, IBlobStorageRestoreable, IExternalGC,
                             IMVCCStorage, IStorage, IStorageCurrentRecordIteration,
                             IStorageIteration,
                             IStorageRestoreable, IStorageUndoable)
from ZODB.utils import p64, u64

from zodbsql.atrest.opening import check_keys, check_no_keys, codec_for
from zodbsql.cache import lookahead
from zodbsql.cache.brought import Brought
from zodbsql.backends.base import oidalloc, trace
from zodbsql.backends.base.contract import (BackendContract, ConnectionRole, LoadedState, Polled,
                                            PendingLoad, Revision, StateRow)
from zodbsql.backends.base.mover import REFERENCES_EACH
from zodbsql.errors import CommitLockTimeout, SchemaError, ZodbsqlError, described
from zodbsql.options import Options
from zodbsql.storage import (caches, heap, history, identity, iteration, metrics, next_poll, pack,
                             records)
from zodbsql.storage.blobs import BlobFiles
from zodbsql.storage.commit import PendingCommit
from zodbsql.storage.records import as_bytes, verified_by
from zodbsql.storage.shared import Shared

log = logging.getLogger(__name__)
#: ``p64`` without its call: an oid as the 8 bytes ZODB names it by.
_oid_bytes = struct.Struct(">Q").pack
#: A pick of a container's children larger than this sends the rest ahead, where the
#: mover can (``SENDS_AHEAD``): the server reads them while ZODB reads these.  ZODB
#: reads one of them in ~25 us here, and the server picks one in ~4 us.
SEND_AHEAD_AFTER = 128
#: A pick by oid (the client's, ``Mover.LOOKS_AHEAD``) brings no state stored in more
#: than this share of a prefetch's bytes, the miss's own included (then read alone): a
#: larger one waits for its own load.  The bench's root names every container written
#: before, and a miss among them brought those of 10,000 children, 270 KB each: ~3 ms of
#: a cold read of 1,000 objects on SQLite (their checksums and the cache's copies).
LARGEST_SHARE = 16

#: The meta entry that records where blob data lives ("database" or "shared-directory").
BLOB_LAYOUT = "blob_layout"

#: Seconds an instance that found no usable standby waits before looking again.
REPLICA_RETRY = 1.0


@zope.interface.implementer(IMVCCStorage, IStorage, IStorageRestoreable, IStorageIteration,
                            IStorageCurrentRecordIteration, IExternalGC)
class SQLStorage(ConflictResolvingStorage):  # type: ignore[misc]  # ZODB is untyped
    """A ZODB storage in a relational database."""

    def __init__(self, backend: BackendContract, options: Options | None = None, *,
                 shared: Shared | None = None) -> None:
        self._load: ConnectionRole | None = None
        if shared is None:
            options = options or Options(keep_history=backend.keep_history)
            shared = Shared(backend, options, codec_for(options))
            self._load = shared.counted(self._open_checked(backend, options, shared))
            self._is_root = True
            if options.blob_dir:
                self._check_blob_layout(backend, options)
            caches.open_caches(shared, self._load)
            shared.watch.start()
        else:
            self._is_root = False
        self.shared = shared
        self._options = shared.options
        self.__name__ = shared.options.name or backend.describe()
        if self._is_root and shared.options.metrics:
            self.enable_metrics(shared.options.metrics_port)
        if shared.options.keep_history:
            zope.interface.alsoProvides(self, IStorageUndoable)
        if shared.blob_files is not None:
            zope.interface.alsoProvides(self, IBlobStorage, IBlobStorageRestoreable)
            if shared.blob_files.fshelper is not None:
                self.fshelper = shared.blob_files.fshelper
        self._snapshot: int | None = None   # None: read the newest data
        self._polled: int | None = None
        # The newest deletion record this instance's polls have seen (backends/base/poller.py).
        self._gone_seen: int | None = None
        self._watch_token: object = None     # the commit watch's, from before the last poll
        self._own_tids: set[int] = set()
        # (tid, oids) of this instance's commit when nothing else was committed between
        # its snapshot and it (finish told the tid before it): the next start may move
        # the snapshot there without a poll.
        self._committed_alone: tuple[int, list[int]] | None = None
        self._read_txn = False               # the snapshot's read transaction is open
        self._end_due = False                # sync() left it for the next poll to end
        self._replica: ConnectionRole | None = None   # a standby session, if any
        self._on_replica = False             # this snapshot is read on _replica
        self._replica_retry = 0.0            # no standby was usable: ask again after this
        self._resets = shared.resets           # the cache resets this instance has heard of
        # A pick sent ahead (``_load_batch``) and the snapshot it was sent at.
        self._sent_ahead: tuple[PendingLoad, int] | None = None
        # What the last prefetches brought, until this instance's loads ask for it.
        self._brought = Brought(shared.cache, shared.prefetcher.max_bytes)
        self._load_lock = threading.RLock()
        self._tpc_lock = threading.Lock()
        self._pending: PendingCommit | None = None
        self._resolving = False              # inside vote's conflict resolution
        self._last_commit: int | None = None
        self._number = shared.instance_number()     # its key in ``shared.reading_at``

    @staticmethod
    def _open_checked(backend: BackendContract, options: Options, shared: Shared,
                      remake: bool = False) -> ConnectionRole:
        """The load connection, once the schema is checked (made if allowed, or
        ``remake``: zap's, whatever create-schema says) and the at-rest keys match."""
        create = options.create_schema or remake
        if not create:
            backend.check_exists()
        codec = shared.codec
        conn = backend.connect()
        try:
            backend.schema.prepare(conn, options.keep_history, create, options.read_only,
                                   remake)
            if codec.keys is not None:
                codec.checksum_key = check_keys(backend, conn, codec.keys, options.read_only)
            else:
                check_no_keys(backend, conn, options.read_only)
            shared.matches = records.matcher(codec.checksum_key)
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_blob_layout(self, backend: BackendContract, options: Options) -> None:
        """The blob layout is recorded with the first storage that has a blob-dir; one
        opened with the other layout would not find the blobs, so it is refused."""
        assert self._load is not None
        want = "shared-directory" if options.shared_blob_dir else "database"
        conn = self._load
        stored = identity.recorded_once(backend, conn, BLOB_LAYOUT, want, options.read_only)
        if stored is not None and stored != want:
            conn.close()
            self._load = None
            raise SchemaError(
                f"{backend.describe()} keeps its blobs in the {stored} layout, but the"
                f" storage was configured for the {want} layout (shared-blob-dir"
                f" {'true' if options.shared_blob_dir else 'false'}); set shared-blob-dir"
                f" {'true' if stored == 'shared-directory' else 'false'} to open it")

    # -- IMVCCStorage ---------------------------------------------------------------------------
    def new_instance(self) -> "SQLStorage":
        self._check_open()
        self._give_idle_load_connection()
        return SQLStorage(self.shared.backend, shared=self.shared)

    def _give_idle_load_connection(self) -> None:
        """Outside a read transaction this storage's load connection is idle: make it
        the spare the new instance takes (``_conn`` takes one back when needed)."""
        with self._load_lock:
            conn = self._load
            if conn is None or self._read_txn:
                return
            self._load, self._sent_ahead = None, None
            self.shared.give_load_connection(conn)

    def release(self) -> None:
        with self._load_lock:
            if self._load is not None:
                self.shared.give_load_connection(self._load)
            if self._replica is not None:
                self._replica.rollback()
                self._replica.close()
            self._load = self._replica = self._sent_ahead = None
            self._read_txn = self._on_replica = False
            self._watch_token = None
            self._brought.drop()
        self.shared.reading_at(self._number, None)

    def sync(self, force: bool = True) -> None:
        with self._load_lock:
            if self._next_poll_may_end_read_txn():
                # ZODB polls right after.
                self._end_due = True
                return
        self._end_read_txn()

    def afterCompletion(self) -> None:
        with self._load_lock:
            # ZODB's Connection.afterCompletion polls next, through newTransaction,
            # whose sync leaves the read transaction for that poll to end (``sync``);
            # Connection.close does not poll (its ZODB connection goes to the pool).
            # The caller's frame says which, read only when that poll could end it.
            if not (self._next_poll_may_end_read_txn() and next_poll.zodb_polls_next()):
                self._end_read_txn()
        # ZODB polls next (a plain transaction manager), or at the next begin: nothing is
        # read at this snapshot before, so no exact revision is kept for it.
        self.shared.reading_at(self._number, None)

    def _next_poll_may_end_read_txn(self) -> bool:
        """May the read transaction be left for the next poll, whose query ends it
        before it begins the next (PostgreSQL: one round trip for both)?"""
        return (self._read_txn and not self._on_replica and self._replica is None
                and self.shared.backend.poller.ends_with_begin
                and self.shared.backend.replica_count() == 0)

    def poll_invalidations(self) -> list[bytes] | None:
        """Move this instance's snapshot to the newest commit; return the oids changed
        (None: everything, after a failover to a server that may lack what was seen)."""
        shared = self.shared
        heap.maybe_trim(self._options.heap_trim_interval)
        with self._load_lock:
            end_first, self._end_due = self._end_due, False
            if not end_first:
                self._end_read_txn()
            alone, self._committed_alone = self._committed_alone, None
            if alone is not None and self._moved_past_own_commit(*alone):
                return []
            since: int | None
            gone_since: int | None
            if self._polled is not None:
                since, gone_since = self._polled, self._gone_seen
            else:
                # An instance's first poll starts where the shared cache's last one did,
                # read before this poll's snapshot begins (``_unchanged`` begins it on
                # SQLite): read after, another instance's poll may have moved it past
                # the snapshot, which then looked like a database gone back in time.
                since, gone_since = shared.cache.position()
            quiet, token = self._unchanged()
            if quiet:
                shared.reading_at(self._number, self._snapshot)
                return []
            self._watch_token = None    # until this poll has succeeded
            own_commit = self._own_commit_changes(alone, since, gone_since)
            poll_from = since if own_commit is None else own_commit[0]
            polled = self._poll_replica(poll_from, gone_since)
            reset = False
            if polled is None:
                polled = self._poll(self._conn(), poll_from, gone_since, end_first)
                # (From its own commit on, this instance has seen that commit.)
                reset = self._server_changed(poll_from, polled.upto)
            if own_commit is not None:
                polled = polled._replace(changes=own_commit[1] + polled.changes)
            upto, changes, gone = polled.upto, polled.changes, polled.gone
            invalidated: list[bytes] | None = []
            if reset or polled.truncated or not polled.complete or (
                    gone_since is not None and gone_since < polled.gone_floor):
                # (Truncated: more changed than poll-changes-limit.  The others:
                # deletions since this instance's last poll were pruned before it
                # could see them.)
                invalidated = None
            elif self._polled is not None:
                own = self._own_tids
                if own:
                    invalidated = [_oid_bytes(oid) for oid, tid in changes if tid not in own]
                else:   # a reader's usual start: in C (1,000 changes: ~0.4 -> ~0.1 ms)
                    invalidated = list(map(_oid_bytes, map(itemgetter(0), changes)))
                if gone:
                    invalidated.extend(map(_oid_bytes, gone))
            # After a reset the snapshot starts afresh at ``upto``: the cache, emptied
            # by the first instance to see it, has nothing from before to cover.
            self._polled_to(upto if reset or since is None else since, polled, token)
            if shared.metrics is not None:
                shared.metrics.polled(len(invalidated) if invalidated is not None
                                      else len(changes))
            return invalidated

    def _polled_to(self, since: int, polled: Polled, token: object) -> None:
        """The snapshot moves to ``polled.upto``; ``polled.changes`` were committed
        after ``since``."""
        shared = self.shared
        upto = polled.upto
        shared.cache.after_poll(since, upto, polled.changes, polled.gone, polled.gone_seq,
                                polled.gone_floor, polled.complete, polled.truncated,
                                keep_revisions=shared.others_read_before(self._number, upto))
        shared.reading_at(self._number, upto)
        self._gone_seen = polled.gone_seq
        second = shared.second_level
        if second is not None and shared.cache.base > second.checkpoint:
            second.publish_checkpoint(shared.cache.base)   # the index moved past it
        self._own_tids = set()
        self._sent_ahead = None     # for the snapshot before (its rows are read and dropped)
        self._snapshot = self._polled = upto
        if shared.tracer is not None:
            trace.context.set(f"snapshot 0x{upto:016x}")
        self._watch_token = token

    def _moved_past_own_commit(self, tid: int, oids: list[int]) -> bool:
        """Move the snapshot to this instance's own commit ``tid`` without a poll, if
        nothing else was committed before it since the snapshot (checked at commit)
        nor after it (the commit watch says so, as for any start it lets skip its
        poll); the changes are then exactly the commit's own ``oids``.  A history-free
        snapshot is the read transaction a poll began: it stands for the commit only
        when the commit changed no object (an empty commit, one that only read
        current) and is still open, left to this poll to end (PostgreSQL's)."""
        shared = self.shared
        since = self._polled
        if since is None or not self._same_server():
            return False
        if not self._options.keep_history and (
                oids or not self._next_poll_may_end_read_txn()):
            return False
        cache = shared.cache
        try:
            quiet, token = shared.watch.quiet_after_own_commit(self._conn, tid,
                                                               self._watch_token)
        except ZodbsqlError:
            return False
        if not quiet or (cache.enabled and cache.polled != since):
            return False
        self._on_replica = False    # a standby may not have replayed the commit yet
        # Deletions since the last poll wait for the next: its records start there.
        self._polled_to(since, Polled(tid, [(oid, tid) for oid in oids], [],
                                      self._gone_seen or 0, 0), token)
        if shared.metrics is not None:
            shared.metrics.polled(0)
        return True

    def _own_commit_changes(self, alone: tuple[int, list[int]] | None, since: int | None,
                            gone_since: int | None) -> tuple[int, list[Revision]] | None:
        """This instance's own commit (its tid, its changes), when the poll after it may
        start at its tid (``alone``: nothing else was committed between the snapshot
        ``since`` and it, checked at commit): the database need not send back the rows
        this instance has just written (a 1,000-object commit: 1,000 rows read and
        parsed, ~0.65 ms on SQLite).  Deletions are asked for by record number
        (``gone_since``), whatever the tid the poll starts from."""
        if alone is None or since is None or gone_since is None or not self._same_server():
            return None
        tid, oids = alone
        return tid, [(oid, tid) for oid in oids]

    def _same_server(self) -> bool:
        """Is the server the one this instance last polled (no failover, no reset
        seen since)?  Only then may its own commit stand for a poll's changes."""
        shared = self.shared
        return (self._resets == shared.resets
                and shared.backend.server_generation == shared.generation)

    def _unchanged(self) -> tuple[bool, object]:
        """May this start keep the snapshot (nothing committed since its poll)?  The
        commit watch says, without a statement when it can; the token it returns is
        kept with the poll that follows otherwise."""
        # -1 for an instance that never polled: no skip, but a token for its first poll.
        polled = self._polled if self._polled is not None else -1
        watch = self.shared.watch
        try:
            if watch.reads_connection and not self._options.keep_history:
                self._snapshot_conn()     # the check and the poll in one read transaction
            quiet, token = watch.quiet(self._conn, polled, self._watch_token)
        except ZodbsqlError:
            return False, None
        # The shared cache takes loaded states only at its newest poll: one emptied
        # (``clear``) or moved on by another instance wants this start to poll too.
        cache = self.shared.cache
        quiet = quiet and (not cache.enabled or cache.polled == polled)
        # (After a restart or failover the poll must run: it is what drops the cache.)
        quiet = quiet and self._same_server()
        if quiet and not (self._options.keep_history or watch.reads_connection):
            # History-free, the snapshot is the read transaction its poll began: kept
            # only while that one is still open (the start after ZODB's afterCompletion
            # poll, whose transaction ``sync`` left for this poll to end).  Begun anew
            # at a load, it could see a later commit, a read conflict.
            quiet = self._read_txn and not self._on_replica
        if quiet:
            self._watch_token = token
        return quiet, token

    def _poll(self, conn: ConnectionRole, since: int | None, gone_since: int | None,
              end_first: bool = False) -> Polled:
        """``end_first``: the read transaction ``sync`` left open ends in the poll's
        round trip."""
        poller = self.shared.backend.poller
        limit = self._options.poll_changes_limit
        end_first = end_first and conn.in_transaction
        if not self.shared.options.keep_history and (end_first or not conn.in_transaction):
            # History-free data has no old revisions to name: the snapshot is a
            # read transaction, held until the ZODB transaction ends (a poll that
            # failed after its BEGIN leaves it for _end_read_txn to roll back too).
            try:
                return poller.begin_and_poll(conn, since, gone_since, end_first, limit)
            finally:
                self._read_txn = conn.in_transaction
        return poller.poll(conn, since, gone_since, limit)

    def _poll_replica(self, since: int | None, gone_since: int | None) -> Polled | None:
        """Poll on a standby; None when none is usable or it has not replayed this
        instance's last snapshot or the process's last commit (then the primary polls)."""
        backend = self.shared.backend
        self._on_replica = False
        replica = self._replica
        if replica is not None and (replica.broken or not backend.replica_in_bounds(replica)):
            replica.close()
            self._replica = replica = None
        if replica is None:
            now = time.monotonic()
            if now < self._replica_retry:
                return None
            found = backend.connect_replica()
            if found is None:
                self._replica_retry = now + REPLICA_RETRY
                return None
            replica = self._replica = self.shared.counted(found)
        try:
            polled = self._poll(replica, since, gone_since)
        except ZodbsqlError as exc:
            log.info("standby poll failed, reading from the primary: %s", described(exc))
            replica.rollback()
            replica.close()
            self._replica, self._read_txn = None, False
            return None
        if polled.upto < max(self._polled or 0, self.shared.last_commit):
            replica.rollback()
            self._read_txn = False
            return None
        self._on_replica = True
        return polled

    def _server_changed(self, since: int | None, upto: int) -> bool:
        """After a poll on the primary: has it changed (a failover) or gone back in
        time (a restored backup) since what this process saw?  Then the shared cache is
        emptied, once, by the first instance to see it, and every instance's ZODB
        connection must forget everything at its next poll, also one that polls only
        after new commits have passed the tid it last saw."""
        shared = self.shared
        generation = shared.backend.server_generation
        rewound = since is not None and upto < since
        if not rewound and generation == shared.generation and self._resets == shared.resets:
            return False
        with shared.oid_lock:
            # (An instance that saw it first left the cache polled at its ``upto``.)
            if shared.generation != generation or (rewound and shared.cache.polled != upto):
                log.warning("%s: the primary changed or went back in time (last tid"
                            " 0x%016x, seen 0x%016x): every cached state is dropped",
                            self.__name__, upto, since or 0)
                shared.cache.clear()
                if shared.second_level is not None:
                    shared.second_level.forget_checkpoint()
                shared.generation = generation
                shared.last_commit = min(shared.last_commit, upto)
                shared.resets += 1
            self._resets = shared.resets
        return True

    def _end_read_txn(self) -> None:
        with self._load_lock:
            self._end_due = False
            if self._read_txn:
                conn = self._replica if self._on_replica else self._load
                if conn is not None:
                    conn.rollback()
            self._read_txn = False

    def _conn(self) -> ConnectionRole:
        if self._load is None or self._load.broken:
            self._check_open()
            if self._load is not None:
                self._load.close()
            self._load = self.shared.take_load_connection()
            if not self._on_replica:
                self._read_txn = False
        return self._load

    def _reading(self) -> ConnectionRole:
        """The connection of this snapshot: the standby it was polled on, else the
        primary's.  A standby lost in the middle hands over to the primary, which has
        every revision the snapshot sees (history-free: a fresh read transaction,
        whose newer states are read conflicts)."""
        if self._on_replica:
            replica = self._replica
            if replica is not None and not replica.broken:
                return replica
            self._on_replica = self._read_txn = False
        return self._conn()

    def _check_open(self) -> None:
        if self.shared.closed:
            raise POSException.StorageError(f"storage {self.__name__} is closed")

    # -- loading -------------------------------------------------------------------------------------
    def load(self, oid: bytes, version: str = "") -> tuple[bytes, bytes]:
        oid_int = u64(oid)
        shared = self.shared
        with self._load_lock:
            snapshot = self._snapshot
            if snapshot is None:
                row = shared.backend.mover.load_current(self._conn(), oid_int)
            elif not shared.cache.enabled and shared.second_level is None:
                # No cache to look in or to fill (cache-size-mb 0): the row, straight
                # (the steps below cost 5.6 us a load on SQLite, the row 3.4).
                row = shared.backend.mover.load_at(self._snapshot_conn(), oid_int, snapshot)
                if row is not None and row.tid > snapshot:
                    self._read_conflict(oid, row.tid, snapshot)
            else:
                source = "cache"
                hit = self._brought.take(oid_int, snapshot) if self._brought.states else None
                if hit is None:
                    hit = shared.cache.get(oid_int, snapshot)
                if hit is None and self._sent_ahead is not None:
                    hit = self._take_sent_ahead(oid_int, snapshot)
                if hit is None and shared.second_level is not None:
                    hit = self._load_shared(oid_int, snapshot)
                    source = "redis"
                if hit is not None:
                    prefetched = shared.prefetcher.note_hit(oid_int)
                    if shared.metrics is not None:
                        shared.metrics.loaded("prefetch" if prefetched and source == "cache"
                                              else source)
                    return hit[0], p64(hit[1])
                self._brought.note()     # its hits counted before the miss's batch enters
                row = self._load_at(oid_int, snapshot)
                if row is not None and row.tid > snapshot:
                    self._read_conflict(oid, row.tid, snapshot)
            if row is None or row.state is None:
                raise POSException.POSKeyError(oid)
            tid, state = row.tid, row.state
            verified_by(shared.matches, oid_int, tid, row.checksum, state)
            if shared.metrics is not None:
                shared.metrics.loaded("database", len(state))
            if snapshot is not None:
                shared.cache.put_loaded(oid_int, tid, state, snapshot)
                if shared.second_level is not None:
                    shared.second_level.store([(oid_int, tid, state)], snapshot)
            return state, p64(tid)

    def _read_conflict(self, oid: bytes, tid: int, snapshot: int) -> NoReturn:
        """``oid`` changed after the snapshot, and its old revision is gone (history-free)."""
        if self.shared.metrics is not None:
            self.shared.metrics.conflict("read_conflict")
        raise POSException.ReadConflictError(oid=oid, serials=(p64(tid), p64(snapshot)))

    def _load_shared(self, oid: int, snapshot: int) -> tuple[bytes, int] | None:
        """``oid``'s state at the snapshot from the Redis level, into the shared cache;
        with prefetch on, the oids the prefetch plan queued after it come in the same
        round trip, and the references of what came feed the plan, as a database load's
        do (``_load_at``)."""
        shared = self.shared
        second = shared.second_level
        assert second is not None
        prefetcher, cache = shared.prefetcher, shared.cache
        if not (prefetcher.enabled and cache.enabled):
            hit = second.load(oid, snapshot)
            if hit is not None:
                cache.put_loaded(oid, hit[1], hit[0], snapshot)
            return hit
        _, queued = prefetcher.plan(oid)
        found = second.load_many(
            [oid, *cache.missing(queued, snapshot)], snapshot)
        references: list[tuple[int, int]] = []
        for each, (state, tid) in found.items():
            cache.put_loaded(each, tid, state, snapshot)
            references.extend((each, to) for to in sorted(records.references(each, state)))
        hit = found.pop(oid, None)
        # A miss here goes on to the database, whose load plans again for ``oid``.
        prefetcher.loaded(oid if hit is not None else -1, list(found), references)
        return hit

    def _load_at(self, oid: int, snapshot: int) -> StateRow | None:
        """``oid``'s row as of the snapshot from the database; with prefetch on, the
        states it refers to (and the queued oids found after it) come along into the
        shared cache: in the same statement, or as the client picks them where the
        mover ``LOOKS_AHEAD`` (``_load_looking_ahead``)."""
        shared = self.shared
        mover = shared.backend.mover
        conn = self._snapshot_conn()
        prefetcher = shared.prefetcher
        if not (prefetcher.enabled and shared.cache.enabled):
            return mover.load_at(conn, oid, snapshot)
        bound, queued = prefetcher.plan(oid)
        if bound == 0:
            return mover.load_at(conn, oid, snapshot)
        cache = shared.cache
        also = cache.missing(queued, snapshot)
        before = cache.take_retired(oid)
        if before is not None:
            return self._load_changed(conn, oid, snapshot, before, bound, also)
        at_least = mover.LOOKAHEAD_AT_LEAST
        if mover.LOOKS_AHEAD and at_least is None:
            return self._load_looking_ahead(conn, oid, snapshot, bound, also)
        if mover.LOOKS_AHEAD and at_least is not None:
            siblings = self._siblings_to_pick(oid, snapshot, bound, at_least)
            if siblings is not None:
                return self._load_batch(conn, oid, snapshot, siblings, True)
        row, states, references = mover.load_with_references(
            conn, oid, snapshot, also, bound, prefetcher.max_bytes,
            mover.REFERENCES_PER_STATE * bound, prefetcher.parents())
        prefetcher.loaded(oid, self._cache_rows(states, snapshot), references)
        return row

    def _load_changed(self, conn: ConnectionRole, oid: int, snapshot: int, before: bytes,
                      bound: int, also: list[int]) -> StateRow | None:
        """``_load_at`` of an object that changed while this process held it
        (``before``, its state then): what comes along are the references its new
        revision added and the cache does not hold, then the queued oids ``also``
        (a walk's next, past a changed bucket), in a second statement.  Those it
        had before, the process had the chance to read: a container another process
        added a child to brings that child, not its oldest children within the bytes
        (a mapping of 34 containers, two new: the 26 oldest came, the new ones did not,
        and the prefetch, none of its batch used, stopped)."""
        shared = self.shared
        mover = shared.backend.mover
        row = mover.load_at(conn, oid, snapshot)
        added: list[int] = []
        if (row is not None and row.state is not None and row.tid <= snapshot
                and (row.checksum is None or shared.matches(row.state, row.checksum))):
            had = records.references(oid, before)
            added = shared.cache.missing(
                [each for each in shared.references_of(oid, row.state) if each not in had],
                snapshot)[:bound]
        prefetcher = shared.prefetcher
        listed = set(added)
        wanted = (added + [each for each in also if each not in listed])[:bound]
        brought = (mover.load_many_at(conn, wanted, snapshot, prefetcher.max_bytes)
                   if wanted else [])
        prefetcher.loaded(oid, self._cache_rows(brought, snapshot),
                          [(oid, each) for each in added])
        return row

    def _load_looking_ahead(self, conn: ConnectionRole, oid: int, snapshot: int,
                            bound: int, also: list[int]) -> StateRow | None:
        """``_load_at`` where the client picks what comes along (``Mover.LOOKS_AHEAD``):
        with a cached parent, its uncached references after ``oid``
        (``lookahead.uncached_after``) come with it in one statement by oid; without
        one, ``oid``'s row and its first references, then those of them not cached."""
        shared = self.shared
        mover = shared.backend.mover
        prefetcher = shared.prefetcher
        cache = shared.cache
        wanted = bound - len(also)
        if wanted > 0:
            parent, missing = lookahead.uncached_after(
                oid, prefetcher.parents(), wanted,
                lambda oids: cache.peek_many(oids, snapshot), shared.references_of,
                mover.LOOKAHEAD_LARGEST, records.refers_to_nothing,
                lambda held_by, child: mover.references_after(
                    conn, held_by, child, snapshot, wanted))
            listed = set(also)
            if parent is None:
                row, own = mover.load_and_references(conn, oid, snapshot, bound)
                also += cache.missing([each for each in own if each not in listed], snapshot)
                brought = mover.load_many_at(
                    conn, also[:bound], snapshot, prefetcher.max_bytes,
                    largest=self._largest_picked()) if also else []
                prefetcher.loaded(oid, self._cache_rows(brought, snapshot),
                                  [(oid, each) for each in own])
                return row
            prefetcher.note_parent(parent)
            also += [each for each in missing if each not in listed]
        return self._load_batch(conn, oid, snapshot, also, False,
                                walk_on=bound - len(also))

    def _siblings_to_pick(self, oid: int, snapshot: int, bound: int,
                          at_least: int) -> list[int] | None:
        """Where the mover has its prefetching statement but the client picks a
        container's children (``Mover.LOOKAHEAD_AT_LEAST``): the references of the
        miss's cached parent after it (then before it) not cached, when there are at
        least ``at_least``; they come with it in one plain statement by oid, their own
        references queued as the statement's are (``_load_batch``).  None for anything
        else (no cached parent, fewer such siblings: a BTree's bucket), left to the
        statement, which walks on from what it finds (the next buckets and their
        items)."""
        shared = self.shared
        prefetcher = shared.prefetcher
        cache = shared.cache
        # The parent's own references only: the statement looks further.
        parent, missing = lookahead.uncached_after(
            oid, prefetcher.parents(), bound,
            lambda oids: cache.peek_many(oids, snapshot), shared.references_of,
            shared.backend.mover.LOOKAHEAD_LARGEST, records.refers_to_nothing,
            looked_into_at_most=0)
        if parent is None or len(missing) < at_least:
            return None
        prefetcher.note_parent(parent)
        return missing

    def _load_batch(self, conn: ConnectionRole, oid: int, snapshot: int, also: list[int],
                    queue_references: bool, walk_on: int = 0) -> StateRow | None:
        """``oid``'s row, and ``also`` into the shared cache, by oid in one statement
        (bounded in bytes and, where the client picks, none stored in more than a
        ``LARGEST_SHARE``-th of them: a larger ``oid`` is read alone); with
        ``queue_references``, the first references of what came are queued (a server's
        round trip: the items of the buckets it brought); with ``walk_on``, up to that
        many more states come, those what came refers to and the cache does not hold
        (``lookahead.walked_on``: the next buckets of a BTree and their items), in one
        more statement where the mover walks (``load_walked``), else a statement a
        step, and enter the cache with the rest."""
        mover = self.shared.backend.mover
        prefetcher = self.shared.prefetcher
        references: list[tuple[int, int]] = []
        ahead: list[int] = []
        if queue_references and mover.SENDS_AHEAD and len(also) > SEND_AHEAD_AFTER:
            also, ahead = also[:SEND_AHEAD_AFTER], also[SEND_AHEAD_AFTER:]
        if queue_references:
            loaded, references = mover.load_many_with_references(
                conn, [oid, *also], snapshot, prefetcher.max_bytes, REFERENCES_EACH)
        else:
            loaded = mover.load_many_at(conn, [oid, *also], snapshot, prefetcher.max_bytes,
                                        largest=self._largest_picked())
            if walk_on > 0 and len(loaded) <= walk_on * lookahead.WALKED_FROM_EACH:
                # From the states that came along, not from the miss's own: a container
                # missed (a mapping another process changed) would walk into its
                # cached neighbours (a warm reader next to a BTree it read: 4,000
                # lookups and states it never asked for, at every such miss).
                loaded += self._walked_on(conn, snapshot, oid, loaded, walk_on)
        own_row, brought = None, []
        for each in loaded:
            if each.oid == oid:
                own_row = each
            else:
                brought.append(each)
        prefetcher.loaded(oid, self._cache_rows(brought, snapshot), references)
        if own_row is None:
            # Missing, or a state that does not open: load_at says which.
            return mover.load_at(conn, oid, snapshot)
        if ahead:
            self._send_ahead(conn, ahead, snapshot, loaded)
        return StateRow(own_row.tid, own_row.checksum, own_row.state)

    def _largest_picked(self) -> int:
        """The largest state a pick by oid brings along (``LARGEST_SHARE``)."""
        return self.shared.prefetcher.max_bytes // LARGEST_SHARE

    def _walked_on(self, conn: ConnectionRole, snapshot: int, oid: int,
                   came: list[LoadedState], count: int) -> list[LoadedState]:
        """``lookahead.walked_on`` from the states that ``came`` besides ``oid``'s (the
        miss's), within the bytes of a prefetch they left."""
        shared = self.shared
        mover = shared.backend.mover
        largest = mover.LOOKAHEAD_LARGEST
        if largest is None:
            largest = lookahead.BYTES_READ_PER_OID * count
        return lookahead.walked_on(
            [each for each in came if each.oid != oid], count, self._room_left(came),
            lambda oids: shared.cache.peek_many(oids, snapshot), shared.references_of,
            largest, records.refers_to_nothing,
            lambda oids: mover.load_many_at(conn, oids, snapshot), loaded_already=(oid,),
            load_walked=lambda seeds, limit: mover.load_walked(
                conn, seeds, snapshot, limit, largest))

    def _room_left(self, loaded: list[LoadedState]) -> int | None:
        """The bytes of a prefetch (``prefetch-bytes``) that ``loaded`` left (None: no
        bound)."""
        room = self.shared.prefetcher.max_bytes
        if room is None:
            return None
        return room - sum(len(each.state) for each in loaded if each.state is not None)

    def _send_ahead(self, conn: ConnectionRole, oids: list[int], snapshot: int,
                    loaded: list[LoadedState]) -> None:
        """Send the pick of ``oids`` (in the bytes the batch before left) and return:
        its rows are taken at the next miss (``_take_sent_ahead``)."""
        room = self._room_left(loaded)
        if room is not None and room <= 0:
            return
        try:
            sent = self.shared.backend.mover.send_load_many_with_references(
                conn, oids, snapshot, room, REFERENCES_EACH)
        except ZodbsqlError as exc:     # the load itself has its row: not its failure
            log.debug("%s: a pick could not be sent ahead (%s)", self.__name__, described(exc))
            return
        self._sent_ahead = (sent, snapshot)

    def _take_sent_ahead(self, oid: int, snapshot: int) -> tuple[bytes, int] | None:
        """At a miss: the pick sent ahead into the shared cache, then ``oid`` from it
        if it came.  A pick that failed is dropped (its session is marked broken, and
        the miss is loaded on a new one)."""
        assert self._sent_ahead is not None
        (sent, sent_at), self._sent_ahead = self._sent_ahead, None
        if sent_at != snapshot:
            return None
        try:
            loaded, references = sent.result()
        except ZodbsqlError as exc:
            log.debug("%s: a pick sent ahead failed (%s); loading without it",
                      self.__name__, described(exc))
            return None
        cached = self._cache_rows(loaded, snapshot)
        # No miss loaded these: the first of them stands for it.
        self.shared.prefetcher.loaded(cached[0] if cached else oid, cached, references)
        return self.shared.cache.get(oid, snapshot)

    def _snapshot_conn(self) -> ConnectionRole:
        """The load connection, ready to read as of the snapshot."""
        conn = self._reading()
        if not self._read_txn and (not self._options.keep_history
                                   or conn.reads_in_transaction):
            # History-free: the transaction ended without a new poll (afterCompletion,
            # sync); a fresh read transaction still gives every state as of the
            # snapshot, or a read conflict for one changed since.  History-preserving
            # (``reads_in_transaction``): any read transaction begun after the poll
            # holds every revision up to the snapshot; ``poll_invalidations`` ends it
            # before the snapshot moves (``sync`` leaves it open only for a poller that
            # ``ends_with_begin``, PostgreSQL's, whose history-preserving loads read
            # outside one).
            conn.begin_read()
            self._read_txn = True
        return conn

    def prefetch(self, oids: Iterable[bytes], tid: bytes | None = None) -> None:
        """Load ``oids`` at this instance's snapshot into the shared cache, in one
        statement (a few for thousands of oids on SQLite and MySQL).

        Objects that don't exist, or changed after the snapshot (history-free), are
        left out; their ``load`` raises as usual.  An instance that has not polled
        reads without the cache, so it has nothing to prefetch.
        """
        shared = self.shared
        with self._load_lock:
            snapshot = self._snapshot
            if snapshot is None or not shared.cache.enabled:
                return
            wanted = sorted(set(shared.cache.missing(map(u64, oids), snapshot)))
            if wanted:
                rows = shared.backend.mover.load_many_at(self._snapshot_conn(), wanted, snapshot)
                self._cache_rows(rows, snapshot)

    def _cache_rows(self, rows: Iterable[LoadedState], snapshot: int) -> list[int]:
        """Put loaded states that the snapshot sees into the shared cache, as ``load``
        does; return their oids.  A state that fails its checksum is left out (its own
        ``load`` reports it)."""
        matches = self.shared.matches
        cached = []
        shared_rows = []
        for oid, tid, stored_checksum, state in rows:
            if state is None or tid > snapshot:
                continue
            if stored_checksum is not None and not matches(state, stored_checksum):
                continue                # as ``verified_by`` checks it
            cached.append(oid)
            shared_rows.append((oid, tid, state))
        self._brought.add(shared_rows, snapshot)
        self.shared.cache.put_loaded_many(shared_rows, snapshot)
        if self.shared.metrics is not None:
            self.shared.metrics.read(sum(len(state) for _, _, state in shared_rows))
        if self.shared.second_level is not None:
            self.shared.second_level.store(shared_rows, snapshot)
        return cached

    def resolve_conflict(self, oid: int, committed_tid: int, old_tid: int,
                         new_state: bytes | None, committed_state: bytes) -> bytes:
        """ZODB's conflict resolution, with ``loadSerial`` answering from the state
        cache: the revision it asks for is the one the transaction read."""
        self._resolving = True
        try:
            resolved: bytes = self.tryToResolveConflict(
                p64(oid), p64(committed_tid), p64(old_tid), new_state, committed_state)
        finally:
            self._resolving = False
        if self.shared.metrics is not None:
            self.shared.metrics.conflict("resolved")
        return resolved

    def loadSerial(self, oid: bytes, serial: bytes) -> bytes:
        oid_int, tid = u64(oid), u64(serial)
        if self._resolving:
            # Conflict resolution (resolve_conflict) asks for the revision its
            # transaction read: usually cached.  (Elsewhere the database answers: a pack
            # may have removed it.)
            cached = self.shared.cache.get_revision(oid_int, tid)
            if cached is not None:
                return cached
        with self._load_lock:
            row = self.shared.backend.mover.load_serial(self._conn(), oid_int, tid)
        if row is None or row.state is None:
            raise POSException.POSKeyError(oid)
        verified_by(self.shared.matches, oid_int, tid, row.checksum, row.state)
        return row.state

    def loadBefore(self, oid: bytes, tid: bytes) -> tuple[bytes, bytes, bytes | None] | None:
        oid_int = u64(oid)
        with self._load_lock:
            conn = self._conn()
            found = self.shared.backend.mover.load_before(conn, oid_int, u64(tid))
            if found is None:
                if not self.shared.backend.mover.exists(conn, oid_int):
                    raise POSException.POSKeyError(oid)
                return None
        (start, stored_checksum, state), end = found
        if state is None:
            raise POSException.POSKeyError(oid)  # the object was deleted (undone creation)
        data = bytes(state)
        verified_by(self.shared.matches, oid_int, int(start), stored_checksum, data)
        return data, p64(start), (p64(end) if end is not None else None)

    def getTid(self, oid: bytes) -> bytes:
        """The tid of the current revision; POSKeyError if the object doesn't exist."""
        with self._load_lock:
            row = self.shared.backend.mover.load_current(self._conn(), u64(oid))
        if row is None or row.state is None:
            raise POSException.POSKeyError(oid)
        return as_bytes(row.tid)

    def referrers(self, oid: bytes) -> list[bytes]:
        """The oids of the objects whose current revision refers to ``oid``, ascending
        (one query)."""
        with self._load_lock:
            return [p64(o) for o in self.shared.backend.history.referrers(self._conn(), u64(oid))]

    def history(self, oid: bytes, size: int = 1) -> list[dict[str, Any]]:
        with self._load_lock:
            return history.object_history(self.shared.backend, self._conn(), oid, size)

    # -- oids -------------------------------------------------------------------------------------------
    def new_oid(self) -> bytes:
        if self._options.read_only:
            raise POSException.ReadOnlyError()
        shared = self.shared
        with shared.oid_lock:
            if not shared.free_oids:
                # Blocks grow while oids are used up quickly (within one big commit, or
                # within a second), so the database is asked a few times rather than once
                # per 16 oids.
                now = time.monotonic()
                pending = self._pending
                same_commit = pending is not None and shared.last_allocator == pending.serial
                largest = shared.backend.oids.largest_block
                if same_commit or now - shared.last_allocation < 1.0:
                    shared.oid_block = min(shared.oid_block * oidalloc.GROWTH, largest)
                else:
                    # After a pause, what the last commit that ran out took: a process
                    # that commits 1,000 new objects now and then asks once a commit, not
                    # twice (each ask on SQLite a write transaction of its own, an fsync).
                    shared.oid_block = max(oidalloc.BLOCK,
                                           min(shared.allocated_in_commit, largest))
                shared.last_allocation = now
                shared.last_allocator = pending.serial if pending is not None else 0
                shared.allocated_in_commit = (
                    (shared.allocated_in_commit if same_commit else 0) + shared.oid_block
                    if pending is not None else 0)
                if pending is not None and pending.conn is not None:
                    block = shared.backend.oids.allocate(pending.conn, shared.oid_block)
                else:
                    conn = shared.pool.acquire(shared.options.commit_lock_timeout)
                    try:
                        block = shared.backend.oids.allocate(conn, shared.oid_block)
                    finally:
                        shared.pool.release(conn)
                shared.highest_oid_seen = max(shared.highest_oid_seen, block[-1])
                shared.free_oids = block[::-1]
            # Once per new object: to_bytes is as_bytes (p64) without its two Python calls.
            oid: bytes = shared.free_oids.pop().to_bytes(8, "big")
            return oid

    # -- two-phase commit -------------------------------------------------------------------------
    def tpc_begin(self, transaction: Any, tid: bytes | None = None, status: str = " ") -> None:
        if self._options.read_only:
            raise POSException.ReadOnlyError()
        self._check_open()
        pending = self._pending
        if pending is not None and pending.transaction is transaction:
            raise POSException.StorageTransactionError(
                "Duplicate tpc_begin calls for same transaction")
        self._tpc_lock.acquire()
        if self.shared.tracer is not None:
            trace.context.set(commit_label(transaction))
        self._pending = PendingCommit(self.shared, self.resolve_conflict, transaction, tid,
                                      status)
        if self._polled is not None:
            self._pending.snapshot_current = self._same_server

    def _pending_for(self, transaction: Any) -> PendingCommit:
        pending = self._pending
        if pending is None or pending.transaction is not transaction:
            raise POSException.StorageTransactionError(self, transaction)
        return pending

    def store(self, oid: bytes, serial: bytes, data: bytes, version: str,
              transaction: Any) -> None:
        if self._options.read_only:
            raise POSException.ReadOnlyError()
        pending = self._pending_for(transaction)
        if version:
            raise POSException.Unsupported("versions are not supported")
        # Once per stored object: int.from_bytes is u64 without its Python call.
        pending.store(int.from_bytes(oid, "big"),
                      int.from_bytes(serial, "big") if serial else 0, data)

    def restore(self, oid: bytes, serial: bytes, data: bytes | None, version: str,
                prev_txn: bytes | None, transaction: Any) -> None:
        if self._options.read_only:
            raise POSException.ReadOnlyError()
        pending = self._pending_for(transaction)
        if version:
            raise POSException.Unsupported("versions are not supported")
        if data is None and prev_txn is not None:
            # A backpointer: the state is the one written by prev_txn.
            data = self.loadSerial(oid, prev_txn)
        pending.restore(u64(oid), data, u64(prev_txn) if prev_txn else None)

    def deleteObject(self, oid: bytes, oldserial: bytes, transaction: Any) -> None:
        if self._options.read_only:
            raise POSException.ReadOnlyError()
        self._pending_for(transaction).store(u64(oid), u64(oldserial), None)

    def checkCurrentSerialInTransaction(self, oid: bytes, serial: bytes,
                                        transaction: Any) -> None:
        self._pending_for(transaction).read_current[u64(oid)] = u64(serial)

    def tpc_vote(self, transaction: Any) -> Iterable[bytes]:
        pending = self._pending_for(transaction)
        measured = self.shared.metrics
        if measured is None:
            return pending.vote()
        started = time.perf_counter()
        try:
            voted = pending.vote()
        except (POSException.ConflictError, CommitLockTimeout) as exc:
            measured.conflict(metrics.conflict_kind(exc))
            raise
        measured.voted(time.perf_counter() - started)
        return voted

    def tpc_finish(self, transaction: Any, func: Callable[[bytes], Any] = lambda tid: None) -> bytes:
        pending = self._pending_for(transaction)
        started = time.perf_counter()
        try:
            try:
                tid = pending.finish()
            except (POSException.ConflictError, CommitLockTimeout) as exc:
                if self.shared.metrics is not None:
                    self.shared.metrics.conflict(metrics.conflict_kind(exc))
                raise
            tid_bytes = as_bytes(tid)
            self._own_tids.add(tid)
            self._last_commit = tid
            previous = pending.previous_tid
            self._committed_alone = (
                (tid, list(pending.states)) if previous is not None
                and previous == self._polled else None)
            shared = self.shared
            shared.last_commit = max(shared.last_commit, tid)
            shared.watch.committed(tid)
            # A generator: a list would keep a pair per stored object alive at once, each
            # counted toward the cyclic collector's next pass.
            self.shared.cache.put_revisions(
                tid, ((oid, state) for oid, (_, state) in pending.states.items()))
            if self.shared.second_level is not None:
                self.shared.second_level.store(
                    [(oid, tid, state) for oid, (_, state) in pending.states.items()
                     if state is not None], None)
            func(tid_bytes)
            if shared.metrics is not None:
                shared.metrics.committed(time.perf_counter() - started, sum(
                    len(state) for _, state in pending.states.values() if state is not None))
            return tid_bytes
        finally:
            self._end_commit(pending)

    def tpc_abort(self, transaction: Any) -> None:
        pending = self._pending
        if pending is None or pending.transaction is not transaction:
            return
        try:
            pending.abort()
        finally:
            self._end_commit(pending)

    def _end_commit(self, pending: PendingCommit) -> None:
        pending.release()
        self._pending = None
        if self.shared.tracer is not None:
            trace.context.set("")
        self._tpc_lock.release()

    def tpc_transaction(self) -> Any:
        return self._pending.transaction if self._pending is not None else None

    # -- blobs --------------------------------------------------------------------------------
    def _blob_files(self) -> BlobFiles:
        files = self.shared.blob_files
        if files is None:
            raise POSException.Unsupported(
                f"storage {self.__name__} has no blob-dir, so it does not store blobs"
                " (set blob-dir to store them)")
        return files

    def storeBlob(self, oid: bytes, oldserial: bytes, data: bytes, blobfilename: str,
                  version: str, transaction: Any) -> None:
        files = self._blob_files()
        self.store(oid, _serial_bytes(oldserial), data, version, transaction)
        self._pending_for(transaction).store_blob(u64(oid), files.take(blobfilename))

    def restoreBlob(self, oid: bytes, serial: bytes, data: bytes, blobfilename: str,
                    prev_txn: bytes | None, transaction: Any) -> None:
        files = self._blob_files()
        self.restore(oid, serial, data, "", prev_txn, transaction)
        self._pending_for(transaction).store_blob(u64(oid), files.take(blobfilename))

    def temporaryDirectory(self) -> str:
        return self._blob_files().temp_dir

    def loadBlob(self, oid: bytes, serial: bytes) -> str:
        """The path of a file holding the blob of revision ``serial`` of ``oid``."""
        files = self._blob_files()
        oid_int, tid = u64(oid), u64(serial)
        if files.cache is None:
            return files.load_shared(oid_int, tid)
        blobs = self.shared.backend.blobs
        content_hash = files.hashes.get(oid_int, tid)
        if content_hash is not None:
            path = files.cache.lookup(content_hash)
            if path is not None:
                return path
        with self._load_lock:
            conn = self._conn()
            if content_hash is None:
                content_hash = blobs.content_hash(conn, oid_int, tid)
                if content_hash is None:
                    raise POSException.POSKeyError("no blob for this revision", oid, serial)
                files.hashes.put(oid_int, tid, content_hash)
                path = files.cache.lookup(content_hash)
                if path is not None:
                    return path
            own_txn = not conn.in_transaction
            if own_txn:
                conn.begin_read()  # the content row and its chunks from one snapshot
            try:
                found = blobs.content(conn, content_hash)
                if found is None:
                    raise POSException.POSKeyError(
                        f"the blob content {content_hash.hex()} is missing", oid, serial)
                size, chunks = found
                try:
                    return files.cache.fill(
                        content_hash, size,
                        lambda write: blobs.download(conn, content_hash, chunks, write))
                except POSException.POSKeyError as exc:
                    # fill's: what was read is not the content; named with the revision
                    # asked for, as the other failures of a load are.
                    raise POSException.POSKeyError(exc.args[0], oid, serial) from None
                except KeyError as exc:   # download's: the number of a missing chunk
                    raise POSException.POSKeyError(
                        f"chunk {exc} of blob content {content_hash.hex()} is missing",
                        oid, serial) from None
            finally:
                if own_txn:
                    conn.rollback()

    def openCommittedBlobFile(self, oid: bytes, serial: bytes, blob: Any = None) -> Any:
        # A cached file may be pruned between loadBlob and open: load it again then.
        for attempt in range(5):
            path = self.loadBlob(oid, serial)
            try:
                return open(path, "rb") if blob is None else BlobFile(path, "r", blob)
            except FileNotFoundError:
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")

    # -- undo ---------------------------------------------------------------------------------------
    def supportsUndo(self) -> bool:
        return self._options.keep_history

    def undo(self, transaction_id: bytes, transaction: Any) -> tuple[bytes, list[bytes]]:
        if self._options.read_only:
            raise POSException.ReadOnlyError()
        pending = self._pending_for(transaction)
        with self._load_lock:
            if self._options.keep_history:
                # Undo reads the newest revisions, not a load's read transaction's.
                self._end_read_txn()
            return history.undo(self.shared, self._conn(), pending, transaction_id,
                                self.tryToResolveConflict)

    def undoLog(self, first: int = 0, last: int = -20,
                filter: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
        with self._load_lock:
            return history.undo_log(self.shared, self._conn(), first, last, filter)

    def undoInfo(self, first: int = 0, last: int = -20,
                 specification: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        def matches(desc: dict[str, Any]) -> bool:
            return all(desc.get(k) == v for k, v in (specification or {}).items())
        return self.undoLog(first, last, matches if specification else None)

    # -- iteration ---------------------------------------------------------------------------------
    def iterator(self, start: bytes | None = None, stop: bytes | None = None) -> Any:
        return iteration.TransactionIterator(self.shared, start, stop)

    def copyTransactionsFrom(self, other: Any, verbose: bool = False) -> None:
        """Copy every transaction of ``other`` (any iterable storage) into this one."""
        if self.shared.blob_files is not None:
            from ZODB.utils import z64

            from zodbsql.copying import copy_transactions
            copy_transactions(other, self, z64)
        else:
            ZODB.BaseStorage.copy(other, self, verbose)

    def record_iternext(self, next: Any = None) -> tuple[bytes, bytes, bytes, Any]:
        return iteration.record_iternext(self.shared.backend, self._conn(), next)

    # -- pack ----------------------------------------------------------------------------------------
    def pack(self, t: float, referencesf: Any = None, gc: bool = True) -> None:
        if self._options.read_only:
            raise POSException.ReadOnlyError()
        pack.pack(self, t, gc and self._options.pack_gc)

    # -- bookkeeping ------------------------------------------------------------------------------
    def enable_metrics(self, port: int | None = None) -> metrics.StorageMetrics:
        """Turn metrics on for this storage (what ``metrics true`` does at open), and
        serve them on ``port`` of 127.0.0.1 when given; returns the storage's series."""
        shared = self.shared
        if shared.metrics is None:
            shared.metrics = metrics.StorageMetrics(self.__name__, shared.cache, shared.pool)
        if port is not None:
            metrics.serve(port)
        return shared.metrics

    def statement_count(self) -> int:
        """SQL statements sent so far by every instance of this storage in this process
        (loads, polls and commits; connection set-up excluded)."""
        return self.shared.statements.total

    def lastTransaction(self) -> bytes:
        if self._snapshot is not None:
            last = max(self._snapshot, self._last_commit or 0)
        else:
            with self._load_lock:
                last = self.shared.backend.poller.last_tid(self._conn())
        return as_bytes(last)

    def getName(self) -> str:
        return self.__name__

    def getSize(self) -> int:
        with self._load_lock:
            return self.shared.backend.database_size(self._conn())

    def __len__(self) -> int:
        with self._load_lock:
            return self.shared.backend.mover.count_objects(self._conn())

    def sortKey(self) -> str:
        return self.shared.backend.sort_key()

    def isReadOnly(self) -> bool:
        return self._options.read_only

    def supportsVersions(self) -> bool:
        return False

    def zap_all(self) -> None:
        """Remove every object and transaction: drop and recreate the schema.

        For tools asked explicitly to empty a database (``convert --clear``) and tests;
        other processes using the database must be stopped first.
        """
        if self._options.read_only:
            raise POSException.ReadOnlyError()
        shared = self.shared
        caches.close_caches(shared, save=False)  # its database is going away
        self.release()
        shared.close_spare()
        shared.pool.close()
        shared.backend.destroy()
        self._load = self._open_checked(shared.backend, self._options, shared, remake=True)
        shared.cache.clear()
        caches.open_caches(shared, self._load)
        shared.watch.reset()
        if shared.blob_files is not None:
            shared.blob_files.hashes.clear()
        with shared.oid_lock:
            shared.free_oids = []
            shared.highest_oid_seen = 0
        self._snapshot = self._polled = None
        shared.reading_at(self._number, None)

    def close(self) -> None:
        if self._pending is not None:
            try:
                self._pending.abort()
            except ZodbsqlError:
                pass
        self.release()
        if self._is_root and not self.shared.closed:
            caches.close_caches(self.shared)
            if self.shared.metrics is not None:
                self.shared.metrics.close()
            self.shared.watch.close()
            self.shared.cache.close()
            self.shared.closed = True
            self.shared.close_spare()
            self.shared.pool.close()
            self.shared.backend.close()
            if self.shared.blob_files is not None:
                self.shared.blob_files.close()

    @property
    def options(self) -> Options:
        return self._options

    @property
    def backend(self) -> BackendContract:
        return self.shared.backend

    def __repr__(self) -> str:
        return f"<SQLStorage {self.__name__}>"


def commit_label(transaction: Any) -> str:
    """How the SQL trace names a ZODB transaction: its id in this process, and the
    start of its description."""
    description = getattr(transaction, "description", "") or ""
    if isinstance(description, bytes):
        description = description.decode("utf-8", "replace")
    text = " ".join(str(description).split())[:60]
    return f"commit {id(transaction):x}" + (f" {text!r}" if text else "")


def _serial_bytes(serial: bytes | str) -> bytes:
    """Some callers pass the empty serial as a str of NULs."""
    if isinstance(serial, str):
        return serial.encode("latin-1")
    return serial
