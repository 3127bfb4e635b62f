"""The psycopg 3 driver: loading it, opening sessions, translating its errors.

Connections run in autocommit, so each statement outside an explicit transaction is its
own transaction and nothing is ever left idle in a transaction by accident; the roles
open transactions explicitly with ``BEGIN``.  Statements repeated on a connection are
prepared on the server (``prepare_threshold``), except the history-free poll, which
travels with its ``BEGIN`` as one query (``begin_read_fetchall``).
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

from zodbsql.backends.base.connections import DBConnection, Row
from zodbsql.errors import (CommitLockTimeout, ConfigurationError, ConnectionLost,
                            DatabaseConflict, DatabaseError, DeadlockError, DriverNotFound)

#: Values of the ``driver`` option.  "auto" lets psycopg pick its fastest implementation
#: (the C extension, then the binary wheel, then pure Python over libpq).
DRIVERS = ("auto", "psycopg", "psycopg-c", "psycopg-binary", "psycopg-python")
_IMPL = {"psycopg-c": "c", "psycopg-binary": "binary", "psycopg-python": "python"}
#: Oldest server zodbsql supports.
MIN_SERVER_VERSION = 120000
#: Executions after which psycopg prepares a statement on the server.
PREPARE_THRESHOLD = 2
#: This session as pg_stat_activity lists it: its pid and when it started (as seconds
#: since 1970 in text, which no session setting such as DateStyle or TimeZone changes).
SESSION_STARTED = "extract(epoch FROM backend_start)::text"
SESSION_IDENTITY = (f"SELECT pid, {SESSION_STARTED} FROM pg_stat_activity"
                    " WHERE pid = pg_backend_pid()")
#: The history-free snapshot: the poll and every load of a ZODB transaction see one.
BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

# SQLSTATEs: lock_not_available, query_canceled (timeouts), deadlock_detected,
# serialization_failure.
LOCK_TIMEOUT_STATES = {"55P03", "57014"}
DEADLOCK = "40P01"
SERIALIZATION_FAILURE = "40001"
# admin_shutdown, crash_shutdown, cannot_connect_now; class 08 is connection exceptions.
GONE_STATES = {"57P01", "57P02", "57P03"}


def load_driver(driver: str = "auto") -> Any:
    """Import psycopg; raise :class:`DriverNotFound` saying what was tried and why."""
    if driver not in DRIVERS:
        raise ConfigurationError(
            f"postgresql driver must be one of {', '.join(DRIVERS)}, got {driver!r}")
    try:
        import psycopg
    except ImportError as exc:
        raise DriverNotFound(
            "no PostgreSQL driver could be loaded. Tried psycopg 3 (its C extension"
            " psycopg-c, then the binary wheel psycopg-binary, then pure Python over the"
            f" system libpq): {exc}. Install it with: pip install 'psycopg[binary]'"
        ) from exc
    wanted = _IMPL.get(driver)
    if wanted is not None and psycopg.pq.__impl__ != wanted:
        raise DriverNotFound(
            f"postgresql driver {driver!r} was requested but psycopg loaded its"
            f" {psycopg.pq.__impl__!r} implementation; set PSYCOPG_IMPL={wanted} before"
            f" starting Python, or use driver auto")
    return psycopg


@functools.lru_cache(maxsize=1)
def _pipelines_supported() -> bool:
    import psycopg
    return bool(psycopg.Pipeline.is_supported())


class ReadAhead:
    """A statement sent in pipeline mode (``send_fetchall``) whose rows are read later:
    the server runs it while the client works on what came before.

    The session stays in pipeline mode until its rows are taken: by ``rows``, or by
    any other statement of the session first (``settle``, from ``DBConnection``), so
    nothing else is ever sent behind it unread.  A failure is kept for ``rows`` to
    raise; the session is then marked broken (a pipeline's state after an error is
    not worth trusting), and its owner opens another."""

    def __init__(self, conn: "PostgreSQLConnection", pipeline: Any, cursor: Any, sql: str,
                 params: Sequence[Any], started: float) -> None:
        self.conn = conn
        self._pipeline = pipeline
        self._cursor = cursor
        self._sql = sql
        self._params = params
        self._started = started
        self._rows: list[Row] | None = None
        self._error: Exception | None = None

    def settle(self) -> None:
        """Take the rows (or the failure) and leave pipeline mode; once."""
        conn = self.conn
        if conn.read_ahead is not self:
            return
        conn.read_ahead = None
        try:
            try:
                self._rows = list(self._cursor.fetchall())
            finally:
                self._pipeline.__exit__(None, None, None)
        except Exception as exc:  # driver errors have no common base class
            self._error = exc
            conn.broken = True
        conn._traced(self._sql, self._params, self._started, self._error)

    def rows(self) -> list[Row]:
        self.settle()
        if self._error is not None:
            raise self.conn._fail(self._error, self._sql) from self._error
        assert self._rows is not None
        return self._rows


class PostgreSQLConnection(DBConnection):
    driver_name = "psycopg"
    #: BYTEA values are limited to 1 GB.
    max_state_size: int | None = (1 << 30) - 1
    #: When the server started this session (``SESSION_STARTED``): with
    #: ``session_id``, the pid, it names the session after a lost COMMIT, even once the
    #: server has given the pid to another session.
    session_started: str | None = None
    #: The random number a commit logs with its tid (commit_log), and the lowest tid it
    #: can have, so that a lost COMMIT can be looked up before its tid is known.
    commit_nonce: int | None = None
    commit_floor: int = 0

    def __init__(self, raw: Any, where: str, lock_timeout: float) -> None:
        super().__init__(raw)
        self.where = where
        self.lock_timeout = lock_timeout

    def begin_read(self) -> None:
        # Autocommit gives each statement its own snapshot; a poll and the loads after
        # it must see one, so history-free reads run in a repeatable-read transaction.
        self.execute(BEGIN_READ)
        self.in_transaction = True

    def begin_read_fetchall(self, sql: str, end_first: bool) -> list[Row]:
        """:meth:`begin_read`, then :meth:`fetchall` of ``sql`` in the new transaction,
        in one round trip: both go as one simple-protocol query.  ``sql`` has no
        parameters (the caller writes an integer into it), so it is never prepared on
        the server: it is planned at each call.  (Bound by psycopg's ClientCursor it
        took 30 to 40 us more a call here.)

        Counted and traced as one statement.  When it fails the connection is left in
        the transaction if BEGIN ran (``rollback`` ends it), as two calls would leave it.
        ``end_first``: the read transaction still open ends first, in the same query.
        It ends with COMMIT, which for a read-only transaction is what ROLLBACK is:
        psycopg forgets every prepared statement of the session (DEALLOCATE ALL) after a
        query it has not seen before that ran a ROLLBACK, and this query's text is new
        at every poll.
        """
        sql = f"{'COMMIT; ' if end_first else ''}{BEGIN_READ}; {sql}"
        return self.simple_query(sql, sql, 0, last=True)

    def sends_ahead(self) -> bool:
        """Can this session send a statement in pipeline mode (libpq 14 and later)?"""
        return _pipelines_supported()

    def send_fetchall(self, sql: str, params: Sequence[Any]) -> ReadAhead:
        """Send ``sql`` (prepared, binary results, as ``fetchall(binary=True,
        prepare=True)``) and return at once; its rows come with ``ReadAhead.rows``."""
        self.settle_read_ahead()
        self._count()
        tracer = self.tracer
        started = tracer.start() if tracer is not None else 0.0
        pipeline = self.raw.pipeline()
        pipeline.__enter__()
        try:
            cursor = self.result_cursor()
            self.execute_prepared(cursor, self._sql(sql), params)
        except Exception as exc:  # driver errors have no common base class
            try:
                pipeline.__exit__(type(exc), exc, exc.__traceback__)
            except Exception:
                self.broken = True
            self._traced(sql, params, started, exc)
            raise self._fail(exc, sql) from exc
        sent = self.read_ahead = ReadAhead(self, pipeline, cursor, sql, params, started)
        return sent

    def session_identity(self, set_up: str) -> tuple[int, str]:
        """Run ``set_up`` (statements whose results are dropped), then read this
        session's pid and start from the server, in one round trip (counted as one
        statement).  The server's pid, not libpq's: behind a pooler the two differ."""
        sql = f"{set_up}; {SESSION_IDENTITY}"
        row = self.simple_query(sql, sql, 0, last=True)[0]
        return int(row[0]), str(row[1])

    def inline(self, query: str, params: Sequence[Any]) -> str:
        """``query`` with its placeholders replaced by the values as SQL literals
        (psycopg's own quoting), for a query of several statements."""
        import psycopg
        return psycopg.ClientCursor(self.raw).mogrify(query, params)

    def fetch_and_commit(self, sql: str, shown: str, count: int) -> Row | None:
        """The first row of ``sql``, whose text ends the transaction (``...; COMMIT``)
        or runs alone in autocommit as a transaction of its own (``simple_query``).
        When it fails the connection stays in the transaction if the server says one is
        open (``rollback`` ends it)."""
        rows = self.simple_query(sql, shown, count, last=False)
        return rows[0] if rows else None

    def simple_query(self, sql: str, shown: str, count: int, last: bool) -> list[Row]:
        """The rows of the first (or ``last``) statement of ``sql``, statements with
        their values inline, sent as one simple-protocol query: one round trip, one
        statement in the server's log.  Counted as one statement and traced as
        ``shown`` with ``count`` parameters (the values inline are never logged; no
        plan is asked).  ``in_transaction`` follows the server's status after it."""
        self.settle_read_ahead()
        from psycopg.pq import TransactionStatus
        self._count()
        tracer = self.tracer
        started = tracer.start() if tracer is not None else 0.0
        error: Exception | None = None
        try:
            cursor = self.raw.cursor()
            cursor.execute(sql.encode())
            while last and cursor.nextset():
                pass    # past the results of the statements before the last
            return [tuple(row) for row in cursor.fetchall()]
        except Exception as exc:
            error = exc
            raise self._fail(exc, shown) from exc
        finally:
            self.in_transaction = (
                self.raw.pgconn.transaction_status != TransactionStatus.IDLE)
            if tracer is not None:
                tracer.done(self.where, shown, (None,) * count, started, error)

    def commit(self) -> None:
        self.settle_read_ahead()
        if not self.in_transaction:
            return
        self._count()
        self.in_transaction = False
        with self.tracing("COMMIT"):
            self._commit()

    def _commit(self) -> None:
        try:
            from psycopg.pq import TransactionStatus
            if self.raw.pgconn.transaction_status == TransactionStatus.INERROR:
                # COMMIT would silently roll back; never report that as committed.
                self.raw.execute("ROLLBACK")
                raise DatabaseError(
                    f"{self.where}: the transaction had failed and was rolled back", "COMMIT")
            self.raw.execute("COMMIT")
        except DatabaseError:
            raise
        except Exception as exc:
            raise self._fail(exc, "COMMIT") from exc

    def rollback(self) -> None:
        self.settle_read_ahead()
        if not self.in_transaction:
            return
        self._count()
        self.in_transaction = False
        with self.tracing("ROLLBACK"):
            try:
                self.raw.execute("ROLLBACK")
            except Exception:
                self.broken = True

    def execute_prepared(self, cursor: Any, sql: str, params: Sequence[Any]) -> None:
        # psycopg prepares a statement at its PREPARE_THRESHOLD-th run; the prefetch
        # statement's parse and analysis cost the server 2 to 3 ms a run, and a fresh
        # process runs it a handful of times in its first reads.  (None: a session
        # that must not prepare.)
        prepare = True if self.raw.prepare_threshold is not None else None
        cursor.execute(sql, params, prepare=prepare)

    def result_cursor(self) -> Any:
        # Binary BYTEA arrives as the bytes themselves; the text form is hex, which
        # psycopg decodes byte by byte (measured: 513 prefetched states, 5.1 -> 4.2 ms).
        return self.raw.cursor(binary=True)

    def close(self) -> None:
        try:
            self.raw.close()
        except Exception:
            pass

    def _plan(self, sql: str, params: Any) -> list[str]:
        # The server plans EXPLAIN of a statement with $n parameters only when it knows
        # their types: a client-side cursor sends the values inline instead.
        # In a transaction, a savepoint keeps a failed EXPLAIN from aborting it.
        import psycopg
        from psycopg.pq import TransactionStatus
        inside = self.raw.pgconn.transaction_status == TransactionStatus.INTRANS
        cursor = psycopg.ClientCursor(self.raw)
        if inside:
            cursor.execute("SAVEPOINT zodbsql_explain")
        self._count()
        try:
            cursor.execute(self.explain_prefix + self._sql(sql), params)
            return [str(row[0]) for row in cursor.fetchall()]
        except BaseException:
            if inside:
                cursor.execute("ROLLBACK TO SAVEPOINT zodbsql_explain")
            raise
        finally:
            if inside:
                cursor.execute("RELEASE SAVEPOINT zodbsql_explain")

    def translate_error(self, exc: Exception, sql: str | None) -> Exception:
        import psycopg
        state = sqlstate(exc) or ""
        if state in GONE_STATES or state.startswith("08") or (
                isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))
                and (self.raw.closed or self.raw.broken)):
            return ConnectionLost(
                f"the connection to {self.where} was lost ({exc}); the transaction can"
                " be retried", sql)
        if state in LOCK_TIMEOUT_STATES:
            return CommitLockTimeout(
                f"a lock on {self.where} was not granted within {self.lock_timeout:g}s"
                f" (commit-lock-timeout; PostgreSQL lock_timeout): {exc}. The transaction"
                " can be retried")
        if state == DEADLOCK:
            return DeadlockError(
                f"{self.where} detected a deadlock and cancelled this transaction ({exc});"
                " it can be retried")
        if state == SERIALIZATION_FAILURE:
            return DatabaseConflict(
                f"{self.where} cancelled this transaction on a serialization failure"
                f" ({exc}); it can be retried")
        return DatabaseError(f"psycopg error on {self.where}: {exc}", sql)


def sqlstate(exc: BaseException | None) -> str | None:
    """The SQLSTATE of a psycopg error (None for any other exception).  Since psycopg
    3.1 an error carries the server's code even when it has no class for it."""
    return getattr(exc, "sqlstate", None)
