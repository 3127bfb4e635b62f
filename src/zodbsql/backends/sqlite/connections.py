"""The sqlite3 driver: placeholders, BEGIN variants and error translation."""
from __future__ import annotations

import sqlite3

from zodbsql.backends.base.connections import DBConnection
from zodbsql.errors import CommitLockTimeout, DatabaseError, SchemaError


class SQLiteConnection(DBConnection):
    driver_name = "sqlite3"

    def __init__(self, raw: sqlite3.Connection, path: str, lock_timeout: float) -> None:
        super().__init__(raw)
        self.path = path
        self.lock_timeout = lock_timeout

    def convert_sql(self, sql: str) -> str:
        return sql.replace("%s", "?")

    def begin_read(self) -> None:
        self.execute("BEGIN DEFERRED")
        self.in_transaction = True

    def begin_write(self) -> None:
        try:
            self.execute("BEGIN IMMEDIATE")
        except DatabaseError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise CommitLockTimeout(
                    f"SQLite database {self.path} stayed locked by another writer for"
                    f" {self.lock_timeout:g}s (commit-lock-timeout); the transaction"
                    " can be retried") from exc.__cause__
            raise
        self.in_transaction = True

    def commit(self) -> None:
        if self.in_transaction:
            self.statements += 1
            self.in_transaction = False
            try:
                self.raw.execute("COMMIT")
            except Exception as exc:
                raise self._fail(exc, "COMMIT") from exc

    def rollback(self) -> None:
        if self.in_transaction:
            self.statements += 1
            self.in_transaction = False
            try:
                self.raw.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def translate_error(self, exc: Exception, sql: str | None) -> Exception:
        text = str(exc)
        if "file is not a database" in text:
            return SchemaError(f"{self.path} is not an SQLite database ({text})")
        if "readonly database" in text:
            return DatabaseError(
                f"SQLite database {self.path} is read-only for this process ({text});"
                " open the storage with read-only true or fix the file's permissions", sql)
        if "database is locked" in text:
            return CommitLockTimeout(
                f"SQLite database {self.path} stayed locked for {self.lock_timeout:g}s"
                " (commit-lock-timeout)")
        return DatabaseError(f"sqlite3 error on {self.path}: {text}", sql)
