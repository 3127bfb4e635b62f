"""A second-level state cache in Redis, shared by the processes of every host.

**Keys that never go stale.**  A key names the database (its ``database_id``), the
history mode, an oid and a tid ``at``; its value is ``tid + state``, the revision of the
oid current at ``at``.  That is a fact no later commit changes, so nothing is ever
invalidated.  A process that loaded revision ``tid`` at snapshot ``X`` writes it under
``at = max(C, tid)`` (``C`` the *checkpoint*, below; ``at = tid`` when ``C > X``): the
revision current at ``X`` was current at every tid from ``tid`` to ``X``.  A process
asks for ``oid`` at snapshot ``X`` only when its own index of changes
(:meth:`StateCache.shared_key`) tells which key holds the state current at ``X``: the
oid's newest change ``c`` when ``C < c <= X``, else ``C`` itself when the index reaches
back to ``C`` and shows no change after it.

**The checkpoint** is a tid every process reads from the database at open (the meta
table's ``cache_checkpoint``; the first process records its newest tid), so their keys
meet.  At open a process extends its index back to ``C`` with one poll; when that is too
much (or its index later moves past ``C``) it takes a newer one and records it, in a
thread of its own (``record``).  It is not kept in Redis: a database restored from a
backup (or a copy of it that went its own way) would then read a checkpoint among the
commits the restore undid, and the states Redis keeps under it, current there in that
other history, would be served as current in this one.  Kept in the database, it comes
back with the database, a tid of its own history; after a restore under running
processes, each drops its checkpoint with the rest of its cache (``forget_checkpoint``).

**Redis down is a slow cache, not an error.**  Every Redis call has a short timeout; a
failure logs one warning, and Redis is left alone for ``RETRY`` seconds (loads go to the
database); the first call that works again logs that it did.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable, TypeVar

from zodbsql.cache.statecache import StateCache
from zodbsql.errors import described
from zodbsql.masking import mask_secrets

log = logging.getLogger(__name__)

#: Seconds Redis is left alone after a failure.
RETRY = 30.0
#: Seconds a Redis call may take (connecting included).
TIMEOUT = 0.5
#: Seconds ``close`` waits for the last checkpoint's record (the database's write
#: lock may hold it; the thread is a daemon and dies with the process).
CLOSE_WAIT = 10.0
#: Seconds a key lives: keys of old checkpoints go away on their own.
EXPIRE = 7 * 24 * 3600

T = TypeVar("T")


class RedisCache:
    """One storage's view of the shared cache (redis-py underneath)."""

    def __init__(self, url: str, prefix: str, database: str, keep_history: bool,
                 cache: StateCache, record: Callable[[int], None] | None = None) -> None:
        import redis    # the redis extra; only a storage that names a server needs it
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self.client = redis.Redis.from_url(url, socket_timeout=TIMEOUT,
                                           socket_connect_timeout=TIMEOUT)
        self.where = mask_secrets(url)
        self.prefix = f"{prefix}{database}:{'hp' if keep_history else 'hf'}:"
        self.cache = cache
        self.checkpoint = -1
        #: Records a checkpoint in the database (None: read-only, kept to itself).
        self._record = record
        #: The thread recording, and the tid it records next.
        self._recording: threading.Thread | None = None
        self._pending: int | None = None
        self._down_until = 0.0
        self._warned = False
        self._lock = threading.Lock()
        #: Counts since open: states served, asked for in vain, written.
        self.hits = self.misses = self.stored = 0

    def key(self, oid: int, at: int) -> bytes:
        return f"{self.prefix}{oid:x}:{at:x}".encode()

    def _call(self, what: Callable[[], T]) -> T | None:
        """``what()``, or None while Redis is down (warned about once)."""
        if self._down_until and time.monotonic() < self._down_until:
            return None
        try:
            result = what()
        except self._errors as exc:
            with self._lock:
                self._down_until = time.monotonic() + RETRY
                if not self._warned:
                    self._warned = True
                    log.warning("zodbsql: the Redis cache at %s is unreachable (%s);"
                                " loading from the database, trying again every %d s",
                                self.where, described(exc), RETRY)
            return None
        if self._warned:
            with self._lock:
                self._warned = False
                self._down_until = 0.0
            log.warning("zodbsql: the Redis cache at %s is reachable again", self.where)
        return result

    # -- the checkpoint ------------------------------------------------------------------------
    def publish_checkpoint(self, tid: int) -> None:
        """Use ``tid`` as this process's checkpoint, and record it in the database for
        the processes that open later (unless a newer one is recorded), in a thread:
        the caller may be a poll, which must not wait for the database's write lock.
        While a record is under way, ``tid`` waits for that thread, which records only
        the newest tid handed to it meanwhile (a record only moves forward)."""
        self.checkpoint = tid
        if self._record is None:
            return
        with self._lock:
            self._pending = tid
            if self._recording is not None:
                return      # the running thread takes it next
            self._recording = threading.Thread(target=self._record_pending, daemon=True,
                                               name="zodbsql cache checkpoint")
            self._recording.start()

    def _record_pending(self) -> None:
        """The recording thread: records the pending tid until none is left."""
        assert self._record is not None
        while True:
            with self._lock:
                tid, self._pending = self._pending, None
                if tid is None:
                    self._recording = None
                    return
            try:
                self._record(tid)   # storage/caches.py logs its own failures
            except Exception:       # anything else: logged; later tids still recorded
                log.exception("zodbsql: recording the Redis cache's checkpoint failed")

    def forget_checkpoint(self) -> None:
        """The database went back in time (or is another server's): the checkpoint may
        be a tid it no longer has; keys are named from the next poll's on."""
        self.checkpoint = -1

    def wait_recorded(self, timeout: float = 30.0) -> None:
        """Wait for the checkpoints handed to the thread to be recorded (tests;
        ``close``)."""
        with self._lock:
            recording = self._recording
        if recording is not None:
            recording.join(timeout)

    # -- states ----------------------------------------------------------------------------------
    def load(self, oid: int, snapshot: int) -> tuple[bytes, int] | None:
        """The state of ``oid`` current at ``snapshot`` and its tid, if Redis has it
        under a key this process can name."""
        at = self.cache.shared_key(oid, snapshot, self.checkpoint)
        if at is None:
            return None
        value = self._call(lambda: self.client.get(self.key(oid, at)))
        if not isinstance(value, bytes) or len(value) < 8:
            self.misses += 1
            return None
        self.hits += 1
        return value[8:], int.from_bytes(value[:8], "big")

    def load_many(self, oids: list[int], snapshot: int) -> dict[int, tuple[bytes, int]]:
        """``load`` for several oids in one round trip (``MGET``): those Redis has."""
        keys: dict[int, bytes] = {}
        for oid in oids:
            at = self.cache.shared_key(oid, snapshot, self.checkpoint)
            if at is not None:
                keys[oid] = self.key(oid, at)
        if not keys:
            return {}
        values = self._call(lambda: self.client.mget(list(keys.values())))
        found: dict[int, tuple[bytes, int]] = {}
        for oid, value in zip(keys, values or [None] * len(keys)):
            if isinstance(value, bytes) and len(value) >= 8:
                found[oid] = value[8:], int.from_bytes(value[:8], "big")
        self.hits += len(found)
        self.misses += len(keys) - len(found)
        return found

    def store(self, rows: Iterable[tuple[int, int, bytes]], snapshot: int | None) -> None:
        """Write states loaded at ``snapshot`` (None: a commit's own, written at their
        tid)."""
        checkpoint = self.checkpoint
        items = {}
        for oid, tid, state in rows:
            at = tid
            if snapshot is not None and 0 <= checkpoint <= snapshot:
                at = max(checkpoint, tid)
            items[self.key(oid, at)] = tid.to_bytes(8, "big") + state
        if not items:
            return

        def write() -> bool:
            pipe = self.client.pipeline(transaction=False)
            for key, value in items.items():
                pipe.set(key, value, ex=EXPIRE)
            pipe.execute()
            return True
        if self._call(write):
            self.stored += len(items)

    def close(self) -> None:
        self.wait_recorded(CLOSE_WAIT)
        try:
            self.client.close()
        except self._errors:
            pass
