"""PostgreSQL's commit watch: one session per storage LISTENs for the schema's commits.

Every commit announces its tid: ``zodbsql_allocate_tid`` (procedures_common.sql) calls
``pg_notify`` inside the finish statement, and the server delivers the notification
when, and only if, the transaction commits.  Announcing costs no round trip.  (The
server's notification lock is taken at commit, while the commit already holds
``commit_row``, so zodbsql's commits are not serialised further; it is one lock for the
whole server, though, so commits of other databases that also notify queue behind it.)

The watch keeps ``high``: every commit whose tid is above it has a notification not yet
read.  That holds from the moment the session listens: it LISTENs (committed) and only
then reads the last tid, so a commit is either in that read or after the LISTEN, and
then notified.  A transaction start takes in what arrived on the socket (no statement:
libpq only consumes input already there) and keeps its snapshot if ``high`` equals it.
"Equals", not "at most": a snapshot above every tid the server knows (a server that
went back in time) is polled, so the storage notices.  A commit of this process raises
``high`` at once, for every storage on the same database in the process.

A pack makes no tid, but the deletions it records must reach the polls too (see
``base/poller.py``): each of its batches announces its record's number (``gone:N``),
and the heartbeat reads the newest number with the last tid.  The token a check returns
is that number; a start skips its poll only while no newer one was heard since the
check that preceded its last poll.

A silent session (a firewall that dropped an idle connection) would deliver nothing and
look quiet, so a background thread proves the session alive with a heartbeat every
``HEARTBEAT_INTERVAL``: one ``SELECT last_tid`` on the listening session, whose reply
comes after every notification of a commit made before it was sent.  A start skips its
poll only if the last heartbeat answered and was sent less than ``LIVENESS`` ago.  So a
start reads a snapshot that may lack only commits made after the newest of the last
heartbeat and the notifications that arrived: normally a commit of another process is
seen by the first start after its notification (well under a millisecond after that
process's COMMIT returned, like a ZEO client without ``server-sync``), at worst
``LIVENESS`` after it while the session is failing unnoticed.  ``listen-for-commits
false`` polls at every start instead.  History-free, a quiet start also needs the read
transaction of the instance's last poll to be still open (``SQLStorage._unchanged``):
that transaction is the snapshot.

When the session is lost (pg_terminate_backend, a restart, a failover), every start
polls until the thread has listened again (one attempt per ``HEARTBEAT_INTERVAL``).
A database whose procedures do not announce commits (made by an older zodbsql, opened
read-only since) is polled; so is one reached through a pooler that shares server
sessions between transactions, where LISTEN would not stay with the client.
"""
from __future__ import annotations

import logging
import os
import select
import threading
import time
import weakref
from typing import Any, Callable

from zodbsql.backends.base.contract import BackendContract, ConnectionRole
from zodbsql.backends.base.wakeup import CommitWatch
from zodbsql.backends.postgresql import pooler
from zodbsql.backends.postgresql.schema import IN_CURRENT_SCHEMA
from zodbsql.errors import ZodbsqlError, described

log = logging.getLogger(__name__)

#: Procedures older than announcing commits lack the channel function.
HAS_CHANNEL = (f"SELECT 1 FROM pg_proc WHERE pronamespace = {IN_CURRENT_SCHEMA}"
               " AND proname = 'zodbsql_channel'")
CHANNEL = "SELECT zodbsql_channel()"
#: The last tid, and the last number given to a record of deletions (a pack's).
LAST_TID = ("SELECT last_tid, (SELECT MAX(last_seq) FROM gone_row) FROM commit_row")
#: The same in a database made before deletions were recorded, opened read-only (its
#: poller does not read them either: ``PollerRole.reads_gone``).
LAST_TID_ALONE = "SELECT last_tid, NULL FROM commit_row"
#: A pack's batch of deletions announces its record's number as ``gone:N``
#: (``packer.ANNOUNCE_GONE``): a pack makes no tid, so the tids alone would leave every
#: start quiet until the next commit, which then took in all of the pack's deletions.
GONE_PREFIX = "gone:"
#: Seconds between heartbeats (and between attempts to listen again).
HEARTBEAT_INTERVAL = 1.0
#: A start skips its poll only if the last heartbeat was sent less than this ago.
LIVENESS = 2.5
#: libpq parameters of the listening session (unless the DSN sets them): a peer that
#: stops acknowledging fails the session within seconds rather than minutes.
LISTENER_PARAMETERS = {"keepalives": "1", "keepalives_idle": "10",
                       "keepalives_interval": "5", "keepalives_count": "3",
                       "tcp_user_timeout": "10000"}

#: The newest tid each database (``sort_key``) was committed at by this process: a
#: commit is known to every storage on the database here before its notification.
_local_high: dict[str, int] = {}
_local_lock = threading.Lock()


def note_local_commit(key: str, tid: int) -> None:
    with _local_lock:
        if tid > _local_high.get(key, 0):
            _local_high[key] = tid


def local_high(key: str) -> int:
    with _local_lock:
        return _local_high.get(key, 0)


class _Session:
    """The listening session and what it told."""

    def __init__(self, conn: ConnectionRole, reads_gone: bool) -> None:
        self.conn = conn
        self._last_tid = LAST_TID if reads_gone else LAST_TID_ALONE
        self.pid = os.getpid()
        self.high = -1
        #: The newest record of deletions announced or read (``GONE_PREFIX``).
        self.gone = -1
        self.unknown = False     # a notification naming no tid arrived: ask for the tid
        self.heard = 0.0         # when the last answered heartbeat was sent

    def note(self, payload: bytes | str) -> None:
        text = payload.decode() if isinstance(payload, bytes) else payload
        if text.startswith(GONE_PREFIX) and text[len(GONE_PREFIX):].isdigit():
            self.gone = max(self.gone, int(text[len(GONE_PREFIX):]))
            return
        try:
            tid = int(payload)
        except ValueError:
            # Not one of ours (anyone may NOTIFY the channel): which commit it stands
            # for is unknown, so the next heartbeat reads the last tid first.
            self.unknown = True
            return
        if tid > self.high:
            self.high = tid

    def heartbeat(self) -> None:
        """One round trip: every notification sent before it arrives with its reply."""
        sent = time.monotonic()
        self.unknown = False      # a foreign notification in the reply sets it again
        row = self.conn.fetchone(self._last_tid)
        if row and row[1] is not None:
            self.gone = max(self.gone, int(row[1]))
        self.note(str(int(row[0]) if row else 0))
        self.heard = sent


class CommitListener(CommitWatch):
    method = "LISTEN/NOTIFY (no statement while nothing commits)"

    def __init__(self, backend: BackendContract, connect: Callable[[], ConnectionRole]) -> None:
        self._backend = backend
        self._connect = connect
        self._key = backend.sort_key()
        self._lock = threading.Lock()
        self._session: _Session | None = None    # None: not listening, every start polls
        self._stop = threading.Event()
        self._disabled = False       # the database can't announce commits to us
        self._failing = False        # listening failed since it last worked
        self._thread: threading.Thread | None = None

    # -- what the storage calls -----------------------------------------------------------
    def start(self) -> None:
        self._listen()
        if self._disabled or self._stop.is_set():
            return
        # The thread holds the watch weakly: a storage dropped unclosed ends it too.
        self._thread = threading.Thread(target=_run, args=(weakref.ref(self), self._stop),
                                        name="zodbsql-listen", daemon=True)
        self._thread.start()

    def quiet(self, conn: Callable[[], ConnectionRole], snapshot: int,
              token: object) -> tuple[bool, object]:
        # Never wait for the heartbeat's round trip: poll instead.
        if not self._lock.acquire(blocking=False):
            return False, None
        try:
            session = self._session
            # (A forked child shares the parent's socket: it must not read from it.)
            if (session is None or session.pid != os.getpid()
                    or not self._take_arrived(session)):
                return False, None
            high, gone = session.high, session.gone
            if session.unknown or time.monotonic() - session.heard > LIVENESS:
                return False, gone
        finally:
            self._lock.release()
        # The token is the newest record of deletions known at this check: a poll
        # after it takes in every record up to it, so a start may skip its poll only
        # while none newer was announced (or read by a heartbeat, after a lost session).
        return max(high, local_high(self._key)) == snapshot and token == gone, gone

    def committed(self, tid: int) -> None:
        note_local_commit(self._key, tid)

    def reset(self) -> None:
        with self._lock:
            self._drop()
        self._listen()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._drop()

    @property
    def listening(self) -> bool:
        """Is the session up (as of the last check)?"""
        return self._session is not None

    @property
    def session_pid(self) -> int | None:
        """The listening session's server pid (tests end it to see the fallback)."""
        session = self._session
        return session.conn.session_id if session is not None else None

    # -- the session ------------------------------------------------------------------------
    def _take_arrived(self, session: _Session) -> bool:
        """Take in the notifications already on the socket; False when the session is
        gone (then it is dropped).  Lock held; sends nothing (a read and a ``select``
        when nothing arrived)."""
        pgconn = _raw(session.conn).pgconn
        try:
            # Until the socket has nothing more: a session the server ended sends its
            # last message, then end of file, which only the next read sees.  (Read at
            # least once: over TLS, data may wait in libpq's buffers, not the socket.)
            while True:
                pgconn.consume_input()
                while True:
                    notice = pgconn.notifies()
                    if notice is None:
                        break
                    session.note(notice.extra)
                if pgconn.status != _ok():
                    raise ConnectionError("the connection is closed")
                if not select.select([pgconn.socket], [], [], 0)[0]:
                    break
        except Exception as exc:   # psycopg's OperationalError: the socket is closed
            self._lost(exc)
            return False
        return True

    def _beat(self) -> None:
        """The thread's step: a heartbeat, or an attempt to listen again."""
        if self._disabled:
            return
        if self._session is None:
            self._listen()
            return
        with self._lock:
            session = self._session
            if session is None:
                return
            try:
                session.heartbeat()
            except ZodbsqlError as exc:
                self._lost(exc)

    def _lost(self, exc: Exception) -> None:
        log.warning("zodbsql: %s: the session listening for commits was lost (%s); every"
                    " transaction start polls until it listens again",
                    self._backend.describe(), described(exc))
        self._drop()
        self._failing = True

    def _drop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.conn.close()

    def _listen(self) -> None:
        """Open the session, LISTEN, then read the last tid (in that order: see the
        module's note)."""
        if getattr(self._backend, "pooling", None) == pooler.TRANSACTION_POOLING:
            self._disable("the server is reached through a pooler that shares server"
                          " sessions between transactions, where LISTEN does not stay"
                          " with the session")
            return
        conn: ConnectionRole | None = None
        try:
            conn = self._connect()
            row = conn.fetchone(HAS_CHANNEL) and conn.fetchone(CHANNEL)
            channel = row[0] if row else None
            if channel is None:
                conn.close()
                self._disable("its commit procedures predate announcing commits (a"
                              " writable storage opened on it installs them)")
                return
            session = _Session(conn, self._backend.poller.reads_gone)
            # Notifications that come with the replies to statements on the session.
            _raw(conn).add_notify_handler(lambda notify: session.note(notify.payload))
            conn.execute(f'LISTEN "{channel}"')
            session.heartbeat()
        except ZodbsqlError as exc:
            if conn is not None:
                conn.close()
            # Said once per outage: the thread tries again every HEARTBEAT_INTERVAL.
            # The message, not the exception: a kept log record (a test's capture)
            # would keep its traceback's frames, and through them the caller's storages
            # and their open read transactions (history-free), alive.
            log.log(logging.DEBUG if self._failing else logging.WARNING,
                    "zodbsql: %s: cannot listen for commits (%s); every transaction"
                    " start polls until it can", self._backend.describe(), described(exc))
            self._failing = True
            return
        with self._lock:
            if self._stop.is_set():
                conn.close()
                return
            self._drop()
            self._session = session
        log.log(logging.INFO if self._failing else logging.DEBUG,
                "zodbsql: %s: listening for commits", self._backend.describe())
        self._failing = False

    def _disable(self, why: str) -> None:
        log.info("zodbsql: %s: listen-for-commits is off because %s; every transaction"
                 " start polls", self._backend.describe(), why)
        self._disabled = True


def _run(watch: "weakref.ref[CommitListener]", stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_INTERVAL):
        listener = watch()
        if listener is None:
            return
        listener._beat()
        del listener


def _raw(conn: ConnectionRole) -> Any:
    return getattr(conn, "raw")


def _ok() -> Any:
    from psycopg.pq import ConnStatus
    return ConnStatus.OK
