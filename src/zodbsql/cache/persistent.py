"""The state cache across restarts: saved to a file, read back in the background.

**Never trusted blindly.**  A file's states were current at their segment's ``as_of``
tid (see ``cachefile``).  After open, a thread reads the file and asks the database
one poll over what changed since the oldest ``as_of`` (the poller's own statement, on
a connection of its own); :meth:`StateCache.cover` extends the cache's index of changed
oids back to there, and :meth:`StateCache.adopt` takes a state only where that index
shows it unchanged since its ``as_of``, under the very rule a load follows.  When too
much changed for the index to hold, nothing is taken.  A file written for another
database (its ``database_id``), the other history mode or before a pack that has run
since is not read at all: after a pack a state may belong to an object the pack
removed, which no poll reports.

**Start-up never waits.**  Open starts the thread and returns; loads meanwhile go to
the database as in a cold process, and each batch of adopted states takes the cache's
lock only for the time it takes to insert them.

**Saved** at close and every ``cache-persistent-interval`` seconds, by the same
thread: the states current at the cache's newest poll, hottest first, within the bytes
of ``cache-size-mb``.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

from zodbsql.backends.base.contract import BackendContract, ConnectionRole
from zodbsql.cache import cachefile
from zodbsql.cache.cachefile import CacheFileError, Identity, Segment
from zodbsql.cache.statecache import StateCache
from zodbsql.errors import described

log = logging.getLogger(__name__)

#: States adopted under one hold of the cache's lock.  After each batch the thread
#: sleeps ``IDLE`` times as long as the batch took, so that requests served meanwhile
#: get the interpreter for most of the time: with batches of 2,000 back to back, a
#: request served during the read-back took 2 to 3 times as long.  The batches are
#: small because a request that waits for the database gives the interpreter away, and
#: gets it back only when the thread's batch (or the interpreter's 5 ms switch
#: interval) ends: on PostgreSQL, batches of 200 made a first request of 200 loads 22%
#: slower (``scripts/first_request.py``).
BATCH = 50
#: Entries whose revisions are checked against the database's current ones at a time.
CHECKED = 500
IDLE = 3.0
#: Seconds the thread pauses between two batches while requests are being served (the
#: state cache was asked something since the last batch): the read-back goes on between
#: requests, and only slowly while the process is never idle.
BUSY_PAUSE = 0.01


class Breather:
    """Called between two pieces of background work: sleeps ``IDLE`` times as long as
    the work took since the last call, and at least ``BUSY_PAUSE`` when ``activity``
    (a count that grows while requests run) changed meanwhile."""

    def __init__(self, activity: Callable[[], int] | None = None) -> None:
        self.activity = activity
        self.seen = activity() if activity is not None else 0
        self.since = time.perf_counter()

    def __call__(self) -> None:
        pause = IDLE * (time.perf_counter() - self.since)
        if self.activity is not None:
            now = self.activity()
            if now != self.seen:
                pause = max(pause, BUSY_PAUSE)
                self.seen = now
        time.sleep(pause)
        self.since = time.perf_counter()


class PersistentCache:
    """The file of one storage's state cache, and the thread that reads and saves it."""

    def __init__(self, directory: str, identity: Identity, cache: StateCache,
                 backend: BackendContract, connect: Callable[[], ConnectionRole],
                 interval: float) -> None:
        self.directory = Path(directory)
        self.identity = identity
        self.cache = cache
        self.backend = backend
        self.connect = connect
        self.interval = interval
        self.max_bytes = cache.limit
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._save_lock = threading.Lock()
        #: Set once the file was read back (or found missing, stale or unreadable).
        self.loaded = threading.Event()
        #: What the read-back did: states in the file, states adopted, changes polled.
        self.found = self.adopted = self.changes = 0

    @property
    def path(self) -> Path:
        return self.directory / self.identity.file_name

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"zodbsql cache file {self.path.name}")
        self._thread.start()

    def _run(self) -> None:
        try:
            self.load()
        except Exception:   # a background thread: never let it kill anything
            log.warning("zodbsql: could not read back the state cache %s", self.path,
                        exc_info=True)
        finally:
            self.loaded.set()
        while not self._stop.wait(self.interval):
            try:
                self.save()
            except Exception:
                log.warning("zodbsql: could not save the state cache to %s", self.path,
                            exc_info=True)

    # -- reading back --------------------------------------------------------------------------
    def load(self) -> int:
        """Read the file, check it against the database, adopt what is still current;
        return how many states were adopted."""
        try:
            segments = cachefile.read(self.path, self.identity, self._breather())
        except (CacheFileError, OSError) as exc:
            log.warning("zodbsql: ignoring the state cache file %s: %s", self.path, described(exc))
            return 0
        self.found = sum(len(s.entries) for s in segments)
        if not segments or self._stop.is_set():
            return 0
        conn = self.connect()
        try:
            refused = self._checked(conn, min(s.as_of for s in segments))
            if refused is not None:
                log.info("zodbsql: state cache file %s not used: %s", self.path, refused)
                return 0
            breathe = self._breather()
            for segment in segments:
                for start in range(0, len(segment.entries), CHECKED):
                    chunk = self._current(conn, segment.entries[start:start + CHECKED])
                    for first in range(0, len(chunk), BATCH):
                        if self._stop.is_set():
                            return self.adopted
                        taken, more = self.cache.adopt(chunk[first:first + BATCH],
                                                       segment.as_of)
                        self.adopted += taken
                        if not more:
                            return self.adopted
                        breathe()
        finally:
            conn.close()
        return self.adopted

    def _current(self, conn: ConnectionRole,
                 entries: list[tuple[int, int, bytes]]) -> list[tuple[int, int, bytes]]:
        """The ``entries`` whose revision is the object's current one in the database
        now.  The poll since the file's tid can't tell a file written before a backup
        was restored (or for a copy of the database that went its own way): from that
        tid on it sees only the restored database's commits, while the file holds
        revisions the restore undid."""
        current = self.backend.locker.current_tids(conn, [oid for oid, _, _ in entries])
        conn.rollback()
        return [entry for entry in entries if current.get(entry[0]) == entry[1]]

    def _breather(self) -> Breather:
        cache = self.cache
        return Breather(lambda: cache.hits + cache.misses)

    def _checked(self, conn: ConnectionRole, oldest: int) -> str | None:
        """Poll what changed since ``oldest`` into the cache's index (see
        :meth:`StateCache.cover`); None when it could, else why not (for the log).  An
        instance's first poll may overtake this one: then it is polled again, from
        there."""
        limit = self.cache.index_limit
        for _ in range(3):
            newest = self.cache.polled
            since = min(oldest, newest) if newest >= 0 else oldest
            polled = self.backend.poller.poll(conn, since, limit=limit)
            conn.rollback()
            upto = polled.upto
            self.changes = len(polled.changes) + len(polled.gone)
            if upto < since:
                return "the database is older than the file (restored from a backup?)"
            if self.cache.cover(since, upto, polled.changes, polled.gone,
                                polled.gone_seq, polled.lists_everything):
                return None
            # Not overtaken: too many changes, or deletions no longer listed.
            if polled.truncated:
                return f"more than {limit} objects changed since it was saved"
            if not polled.complete:
                return "objects deleted since it was saved can no longer be listed"
            if upto >= self.cache.base:
                return (f"{self.changes} objects changed since it was saved, more"
                        " than the cache's index holds beside its own")
        return "new polls overtook the check three times"

    # -- saving ------------------------------------------------------------------------------------
    def save(self) -> int:
        """Write the cache's current states into the file (merged with what other
        processes saved there); return the number of states the file holds."""
        with self._save_lock:
            as_of, current = self.cache.current_states()
            if as_of < 0:
                return 0
            own = Segment(as_of, [(oid, int.from_bytes(value[:8], "big"), value)
                                  for oid, value in current])
            self.directory.mkdir(parents=True, exist_ok=True)
            started = time.monotonic()
            written = cachefile.save(self.directory, self.identity, own, self.max_bytes)
            log.debug("zodbsql: saved %d states to %s in %.2f s", written, self.path,
                      time.monotonic() - started)
            return written

    def close(self, save: bool = True) -> None:
        """Stop the thread and save once more (unless ``save`` is False)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if not save:
            return
        try:
            self.save()
        except Exception:
            log.warning("zodbsql: could not save the state cache to %s", self.path,
                        exc_info=True)
