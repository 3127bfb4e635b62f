"""An SQLite error on COMMIT, injected under a storage's commit connections.

SQLite runs in the process, so nothing can cut a wire; instead the ``sqlite3``
connection under each commit connection is wrapped.  Armed, the next COMMIT either runs
and then raises (the commit reached the file, the caller is told it failed) or raises
without running (certainly not committed).  The storage's own code is untouched: only
the backend's ``connect_for_commit`` of this storage is wrapped.
"""
from __future__ import annotations

import sqlite3
from typing import Any

from tests.fault.proxy import is_commit
from zodbsql.storage import SQLStorage


#: The extended result code SQLite reports with each injected message (zodbsql tells
#: errors apart by code, as SQLite's own errors always carry one).
RESULT_CODES = {"database is locked": 5, "disk I/O error": 10}


class CommitFault:
    """Arm with ``arm(after=...)``; ``injected`` counts the errors raised."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.armed = 0
        self.after = True
        self.injected = 0

    def arm(self, after: bool, count: int = 1) -> None:
        self.after = after
        self.armed = count

    def install(self, storage: SQLStorage) -> None:
        backend = storage.shared.backend
        connect = backend.connect_for_commit

        def faulty_connect(*args: Any, **kwargs: Any) -> Any:
            conn = connect(*args, **kwargs)
            conn.raw = FaultyConnection(conn.raw, self)
            return conn
        backend.connect_for_commit = faulty_connect  # type: ignore[method-assign]
        storage.shared.pool.close()  # idle connections opened before are unwrapped

    def around(self, sql: str, run: Any) -> Any:
        """Run ``run()`` (a statement ``sql``), failing it as armed."""
        if self.armed <= 0 or not is_commit(sql.encode()):
            return run()
        self.armed -= 1
        self.injected += 1
        if self.after:
            run()
        error = sqlite3.OperationalError(self.message)
        error.sqlite_errorcode = RESULT_CODES.get(self.message, 1)  # type: ignore[attr-defined]
        raise error


class FaultyCursor:
    def __init__(self, cursor: sqlite3.Cursor, fault: CommitFault) -> None:
        self._cursor = cursor
        self._fault = fault

    def execute(self, sql: str, *args: Any) -> Any:
        self._fault.around(sql, lambda: self._cursor.execute(sql, *args))
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __iter__(self) -> Any:
        return iter(self._cursor)


class FaultyConnection:
    """An ``sqlite3.Connection`` whose COMMIT (as SQL or ``commit()``) can fail."""

    def __init__(self, raw: sqlite3.Connection, fault: CommitFault) -> None:
        self._raw = raw
        self._fault = fault

    def execute(self, sql: str, *args: Any) -> Any:
        return self._fault.around(sql, lambda: self._raw.execute(sql, *args))

    def cursor(self, *args: Any) -> FaultyCursor:
        return FaultyCursor(self._raw.cursor(*args), self._fault)

    def commit(self) -> None:
        self._fault.around("COMMIT", self._raw.commit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)
