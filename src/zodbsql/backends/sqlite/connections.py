"""The sqlite3 driver: placeholders, BEGIN variants and error translation.

Errors are told apart by SQLite's result code (``sqlite_errorcode``, Python 3.11+),
never by their text: the primary code is the low byte of the extended one.
"""
from __future__ import annotations

import contextlib
import sqlite3
import time
from typing import Any, Callable, Iterator, Sequence

from zodbsql.backends.base.connections import DBConnection, Row
from zodbsql.backends.sqlite.writers import queue_for
from zodbsql.errors import CommitLockTimeout, DatabaseError, SchemaError

#: Seconds a writer waits in SQLite's busy handler before it joins the queue of this
#: process's writers (writers.py), and every later writer with it until it is empty.
PATIENCE = 1.0

# Primary result codes (https://sqlite.org/rescode.html).
SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_READONLY = 8
SQLITE_FULL = 13
SQLITE_NOTADB = 26


def result_code(exc: BaseException | None) -> int | None:
    """The primary SQLite result code of a sqlite3 error, if Python recorded one."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


class SQLiteConnection(DBConnection):
    driver_name = "sqlite3"
    explain_prefix = "EXPLAIN QUERY PLAN "
    #: SQLite's default SQLITE_MAX_LENGTH.
    max_state_size: int | None = 1_000_000_000
    #: The ``synchronous`` setting the connection was opened with (upper case).
    synchronous = "FULL"
    #: A statement outside a transaction takes and drops the WAL's read lock and its
    #: page cache itself: a load by oid took 4.2 us so, 2.0 in a read transaction.
    reads_in_transaction = True

    def __init__(self, raw: sqlite3.Connection, path: str, lock_timeout: float) -> None:
        super().__init__(raw)
        self.path = path
        self.lock_timeout = lock_timeout
        #: The most ``?`` one statement may carry (999 in builds before 3.32).
        self.max_variables = raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        self._writers = queue_for(path)
        self._writing = False     # this connection has the turn of the writer queue
        #: Told of each COMMIT that went through (``WalCheckpointer.committed``).
        self.after_commit: Callable[[], None] | None = None

    def convert_sql(self, sql: str) -> str:
        return sql.replace("%s", "?")

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        """``DBConnection.fetchone`` in fewer steps: sqlite3 reads nothing ahead and
        hands rows as tuples already (a load by oid, 2.97 us in the general one, 2.42
        here, is most of a read where the state cache is off)."""
        if self.tracer is not None:
            return super().fetchone(sql, params)
        self._count()
        try:
            row: Row | None = self.raw.execute(self._sql(sql), params).fetchone()
        except Exception as exc:
            raise self._fail(exc, sql) from exc
        return row

    @contextlib.contextmanager
    def unsynced_commits(self) -> Iterator[None]:
        """The COMMITs within do not sync the log (``synchronous`` NORMAL: in WAL mode
        the log is synced at checkpoints then), and the connection's own setting
        (``synchronous``, as the adapter set it) is back after.  For a transaction
        whose loss with the power loses nothing: the oid counter's advance
        (``oidalloc.py``).  (Set on the driver's connection, as ``busy_timeout``: a
        setting of this connection, not a statement to the database.)"""
        if self.synchronous not in ("FULL", "EXTRA"):
            yield
            return
        self.raw.execute("PRAGMA synchronous = NORMAL")
        try:
            yield
        finally:
            self.raw.execute(f"PRAGMA synchronous = {self.synchronous}")

    def begin_read(self) -> None:
        self.execute("BEGIN DEFERRED")
        self.in_transaction = True

    def begin_write(self) -> None:
        writers = self._writers
        deadline = time.monotonic() + self.lock_timeout
        if not self._writing and not writers.crowded():
            # Nobody of this process waits long: SQLite's busy handler, for a while.
            if self._begin_immediate(min(PATIENCE, self.lock_timeout)):
                return
        if not self._writing:
            if not writers.acquire(max(0.0, deadline - time.monotonic())):
                raise self._locked_out()
            self._writing = True
        left = deadline - time.monotonic()
        if left <= 0 or not self._begin_immediate(left):
            self._end_turn()
            raise self._locked_out()

    def _begin_immediate(self, seconds: float) -> bool:
        """BEGIN IMMEDIATE, waiting at most ``seconds`` for the lock; False if it
        stayed taken."""
        if seconds != self.lock_timeout:
            self.raw.execute(f"PRAGMA busy_timeout = {max(1, int(seconds * 1000))}")
        try:
            self.execute("BEGIN IMMEDIATE")
        except CommitLockTimeout:
            return False
        except BaseException:
            self._end_turn()
            raise
        finally:
            if seconds != self.lock_timeout:
                self.raw.execute(f"PRAGMA busy_timeout = {int(self.lock_timeout * 1000)}")
        self.in_transaction = True
        return True

    def _locked_out(self) -> CommitLockTimeout:
        return CommitLockTimeout(
            f"SQLite database {self.path} stayed locked by another writer for"
            f" {self.lock_timeout:g}s (commit-lock-timeout); the transaction"
            " can be retried")

    def _end_turn(self) -> None:
        if self._writing:
            self._writing = False
            self._writers.release()

    def commit(self) -> None:
        if self.in_transaction:
            self._count()
            self.in_transaction = False
            with self.tracing("COMMIT"):
                try:
                    self.raw.execute("COMMIT")
                except Exception as exc:
                    raise self._fail(exc, "COMMIT") from exc
                finally:
                    self._end_turn()
            if self.after_commit is not None:
                self.after_commit()

    def rollback(self) -> None:
        if self.in_transaction:
            self._count()
            self.in_transaction = False
            with self.tracing("ROLLBACK"):
                try:
                    self.raw.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
        self._end_turn()

    def close(self) -> None:
        super().close()
        self._end_turn()

    def translate_error(self, exc: Exception, sql: str | None) -> Exception:
        text = str(exc)
        code = result_code(exc)
        if code == SQLITE_NOTADB:
            return SchemaError(f"{self.path} is not an SQLite database ({text})")
        if code == SQLITE_READONLY:
            return DatabaseError(
                f"SQLite database {self.path} is read-only for this process ({text});"
                " open the storage with read-only true or fix the file's permissions", sql)
        if code in (SQLITE_BUSY, SQLITE_LOCKED):
            return CommitLockTimeout(
                f"SQLite database {self.path} stayed locked for {self.lock_timeout:g}s"
                " (commit-lock-timeout); the transaction can be retried")
        if code == SQLITE_FULL:
            return DatabaseError(
                f"the disk holding SQLite database {self.path} is full ({text}); nothing"
                " of this transaction was written. Free space and retry", sql)
        return DatabaseError(f"sqlite3 error on {self.path}: {text}", sql)
