"""Connections: the one place that knows the driver.

``DBConnection`` wraps a DB-API connection with the handful of calls the roles use.  SQL
is written with ``%s`` placeholders everywhere; a driver that wants another style
converts it here.  Every driver error is translated into :mod:`zodbsql.errors` with the
statement attached, and every statement sent is counted (the benchmark and the
round-trip tests read ``statements``).
"""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable, Iterable, Iterator, Sequence

from zodbsql.backends.base.contract import ConnectionRole, StatementCounter
from zodbsql.backends.base.trace import Tracer
from zodbsql.errors import ConnectionLost, DatabaseError

#: A row as the driver returns it; the roles turn rows into the named rows of
#: :mod:`zodbsql.backends.base.contract`.
Row = tuple[Any, ...]


class StatementTally:
    """A running total of the statements sent over several connections (one storage's).

    A connection with ``tally`` set adds every statement it counts here too, so the
    total survives connections being closed.  Increments are not locked: exact for one
    thread, close enough for a benchmark with several.
    """

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0


class DBConnection:
    """A database connection with error translation and a statement counter.

    Subclasses set ``driver_name`` and implement :meth:`translate_error`, and may
    override :meth:`convert_sql`, :meth:`begin_read` and :meth:`begin_write`.
    """

    driver_name = "dbapi"
    #: Do a history-preserving instance's loads read inside a read transaction,
    #: begun at its first load after a poll and ended with the ZODB transaction?
    #: (History-free loads always do: that transaction is their snapshot.)  Only where
    #: it costs no round trip and saves time: SQLite.
    reads_in_transaction = False
    #: Where counted statements are also added (set by the storage that owns this).
    tally: StatementCounter | None = None
    #: The server's id of this session (PostgreSQL backend pid, MySQL connection id),
    #: so that another connection can find it and end it after a lost COMMIT.
    session_id: int | None = None
    #: A lost COMMIT's tid, found by ``commit_outcome`` when finish sent COMMIT too.
    commit_tid: int | None = None
    #: The last tid before this connection's commit, when finish tells it (None:
    #: unknown): the committing instance's snapshot then means nothing else committed.
    commit_previous: int | None = None
    #: The largest state one statement may carry, in bytes (None: no limit known), and
    #: what sets it and how to raise it, for the error message.  A driver's subclass
    #: sets the database's fixed limit; a backend that learns it from the server at
    #: connect (MySQL's max_allowed_packet) sets it on the connection.
    max_state_size: int | None = None
    max_state_size_detail: str | None = None
    #: Where the session is, for messages (a subclass names the server and database).
    where = ""
    #: A replica session (``Backend.connect_replica``): when its lag was last read.
    lag_checked = 0.0
    #: The SQL trace (None: off, the usual case), set by the storage that owns this.
    tracer: Tracer | None = None
    #: How a driver asks for a statement's plan (``slow-statement-explain``).
    explain_prefix = "EXPLAIN "
    #: A statement sent ahead whose rows are still coming (PostgreSQL's
    #: ``send_fetchall``): every other statement takes them first (``settle``), so
    #: that what a session sends and what it reads stay in step.
    read_ahead: Any = None

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self._statements = 0
        self.in_transaction = False
        self.broken = False
        self._sql_cache: dict[str, str] = {}

    @property
    def statements(self) -> int:
        """Statements sent so far (resetting it to 0 leaves the tally alone)."""
        return self._statements

    @statements.setter
    def statements(self, value: int) -> None:
        tally = self.tally
        if tally is not None and value > self._statements:
            tally.total += value - self._statements
        self._statements = value

    def _count(self) -> None:
        """One more statement: what ``statements += 1`` does, without the property's
        getter and setter (every load by oid counts one)."""
        self._statements += 1
        if self.tally is not None:
            self.tally.total += 1

    # -- what subclasses specialise -------------------------------------------------
    def convert_sql(self, sql: str) -> str:
        return sql

    def translate_error(self, exc: Exception, sql: str | None) -> Exception:
        """Return the zodbsql exception for a driver exception (never raises)."""
        return DatabaseError(f"{self.driver_name}: {exc}", sql)

    def begin_read(self) -> None:
        """Start a transaction that reads one consistent snapshot."""
        self.execute("BEGIN")
        self.in_transaction = True

    def begin_write(self) -> None:
        """Start a transaction that will write."""
        self.execute("BEGIN")
        self.in_transaction = True

    # -- the calls the roles use ----------------------------------------------------
    def _sql(self, sql: str) -> str:
        converted = self._sql_cache.get(sql)
        if converted is None:
            converted = self._sql_cache[sql] = self.convert_sql(sql)
        return converted

    def _fail(self, exc: Exception, sql: str | None) -> Exception:
        error = self.translate_error(exc, sql)
        if isinstance(error, ConnectionLost):
            self.broken = True
        return error        # (its callers raise it "from exc")

    def settle_read_ahead(self) -> None:
        """Take the rows of a statement sent ahead, if one is out (``read_ahead``):
        every statement of the session calls this first."""
        if self.read_ahead is not None:
            self.read_ahead.settle()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return the number of rows it changed."""
        self.settle_read_ahead()
        self._count()
        tracer = self.tracer
        started = tracer.start() if tracer is not None else 0.0
        try:
            cursor = self.raw.cursor()
            cursor.execute(self._sql(sql), params)
            changed = int(cursor.rowcount)
        except Exception as exc:  # driver errors have no common base class
            self._traced(sql, params, started, exc)
            raise self._fail(exc, sql) from exc
        self._traced(sql, params, started)
        return changed

    def execute_script(self, sql: str | bytes, shown: str | None = None) -> None:
        """Run SQL text without parameters, as written (procedure definitions, or a
        statement built with its values in it); traced and reported as ``shown`` when
        given, which then must name no value."""
        self.settle_read_ahead()
        self._count()
        label = shown if shown is not None else str(sql)
        try:
            with self.tracing(label):
                self.raw.cursor().execute(sql)
        except Exception as exc:
            raise self._fail(exc, label) from exc

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.settle_read_ahead()
        self._count()
        tracer = self.tracer
        started = tracer.start() if tracer is not None else 0.0
        try:
            self.raw.cursor().executemany(self._sql(sql), rows)
        except Exception as exc:
            self._traced(sql, None, started, exc)
            raise self._fail(exc, sql) from exc
        self._traced(sql, None, started)

    def fetchall(self, sql: str, params: Sequence[Any] = (), binary: bool = False,
                 prepare: bool = False) -> list[Row]:
        self.settle_read_ahead()
        self._count()
        tracer = self.tracer
        started = tracer.start() if tracer is not None else 0.0
        try:
            cursor = self.result_cursor() if binary else self.raw.cursor()
            if prepare:
                self.execute_prepared(cursor, self._sql(sql), params)
            else:
                cursor.execute(self._sql(sql), params)
            rows = list(cursor.fetchall())
        except Exception as exc:
            self._traced(sql, params, started, exc)
            raise self._fail(exc, sql) from exc
        self._traced(sql, params, started)
        return rows

    def result_cursor(self) -> Any:
        """A cursor whose results come in the driver's binary format, if it has one."""
        return self.raw.cursor()

    def execute_prepared(self, cursor: Any, sql: str, params: Sequence[Any]) -> None:
        """Run ``sql`` on ``cursor``, prepared on the server from its first run where
        the driver can (``fetchall(prepare=True)``); here, simply run."""
        cursor.execute(sql, params)

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        self.settle_read_ahead()
        self._count()
        tracer = self.tracer
        started = tracer.start() if tracer is not None else 0.0
        try:
            cursor = self.raw.cursor()
            cursor.execute(self._sql(sql), params)
            row = cursor.fetchone()
        except Exception as exc:
            self._traced(sql, params, started, exc)
            raise self._fail(exc, sql) from exc
        self._traced(sql, params, started)
        return tuple(row) if row is not None else None

    # -- the SQL trace ----------------------------------------------------------------
    @contextlib.contextmanager
    def tracing(self, sql: str) -> Iterator[None]:
        """Trace what runs inside as the statement ``sql`` (COMMIT, ROLLBACK)."""
        tracer = self.tracer
        if tracer is None:
            yield
            return
        started = tracer.start()
        try:
            yield
        except Exception as exc:
            self._traced(sql, None, started, exc)
            raise
        self._traced(sql, None, started)

    def _traced(self, sql: str, params: Sequence[Any] | None, started: float,
                error: BaseException | None = None) -> None:
        tracer = self.tracer
        if tracer is not None:
            tracer.done(self.where or self.driver_name, sql, params, started,
                        error, self._plan)

    def _plan(self, sql: str, params: Sequence[Any] | None) -> list[str]:
        """The server's plan for ``sql``, one line per row (slow-statement-explain)."""
        self._count()
        cursor = self.raw.cursor()
        cursor.execute(self._sql(self.explain_prefix + sql), params)
        return [" | ".join(str(value) for value in row) for row in cursor.fetchall()]

    def commit(self) -> None:
        self._count()
        try:
            with self.tracing("COMMIT"):
                self.raw.commit()
        except Exception as exc:
            raise self._fail(exc, "COMMIT") from exc
        finally:
            self.in_transaction = False

    def rollback(self) -> None:
        """Roll back; a connection that is already gone is marked broken, not raised."""
        if not self.in_transaction:
            return
        self._count()
        self.in_transaction = False
        with self.tracing("ROLLBACK"):
            try:
                self.raw.rollback()
            except Exception:
                self.broken = True

    def close(self) -> None:
        try:
            self.raw.close()
        except Exception:
            pass


class ConnectionPool:
    """A bounded pool of connections shared by every instance of one storage.

    Committing takes a connection from here and gives it back afterwards, so a site with
    many ZODB connections holds at most ``max_size`` committing server connections.
    """

    def __init__(self, open_connection: Callable[[], ConnectionRole], max_size: int) -> None:
        self._open = open_connection
        self._idle: queue.LifoQueue[ConnectionRole] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(max_size)
        self.max_size = max_size
        #: Connections handed out and not yet given back (read by the metrics).
        self.in_use = 0

    def acquire(self, timeout: float | None = None) -> ConnectionRole:
        # (A semaphore waits without end for None; -1, a lock's "forever", is no wait.)
        if not self._slots.acquire(timeout=timeout):
            raise DatabaseError(
                f"all {self.max_size} pooled connections stayed busy for {timeout}s"
                " (raise the pool size or find the long commits)")
        try:
            conn = self._idle.get_nowait()
        except queue.Empty:
            try:
                conn = self._open()
            except BaseException:
                self._slots.release()
                raise
        self.in_use += 1
        return conn

    def release(self, conn: ConnectionRole) -> None:
        self.in_use -= 1
        conn.rollback()
        if conn.broken:
            conn.close()
        else:
            self._idle.put(conn)
        self._slots.release()

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return
