"""The SQLite backend: its parts, and how a connection to the file is opened."""
from __future__ import annotations

import os
import sqlite3
from typing import ClassVar

from zodbsql.backends.base.adapter import Backend
from zodbsql.backends.base.connections import DBConnection
from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.backends.sqlite.blobs import SQLiteBlobs
from zodbsql.backends.sqlite.checkpointer import WalCheckpointer
from zodbsql.backends.sqlite.connections import SQLiteConnection
from zodbsql.backends.sqlite.features import SQLiteFeatures
from zodbsql.backends.sqlite.inspector import SQLiteInspector
from zodbsql.backends.sqlite.locker import SQLiteLocker
from zodbsql.backends.sqlite.mover import SQLiteMover
from zodbsql.backends.sqlite.oidalloc import SQLiteOidAllocator
from zodbsql.backends.sqlite.options import SQLiteOptions
from zodbsql.backends.sqlite.packer import SQLitePacker
from zodbsql.backends.sqlite.poller import SQLitePoller
from zodbsql.backends.sqlite.schema import HAS_META, SQLiteSchema, use_wal
from zodbsql.backends.sqlite.wakeup import DataVersionWatch
from zodbsql.errors import ConfigurationError, DatabaseError, SchemaError

#: The files beside a WAL database.
WAL_FILES = ("-wal", "-shm")


def in_wal_mode(path: str) -> bool:
    """Does the file's header say WAL (read and write format versions 2)?"""
    try:
        with open(path, "rb") as f:
            header = f.read(20)
    except OSError:
        return False
    return header.startswith(b"SQLite format 3\0") and header[18:20] == b"\x02\x02"


class SQLiteBackend(Backend[SQLiteOptions]):
    name: ClassVar[str] = "sqlite3"
    features_class = SQLiteFeatures
    schema_class = SQLiteSchema
    mover_class = SQLiteMover
    oids_class = SQLiteOidAllocator
    packer_class = SQLitePacker
    inspector_class = SQLiteInspector
    locker_class = SQLiteLocker
    poller_class = SQLitePoller
    blobs_class = SQLiteBlobs

    def __init__(self, options: SQLiteOptions, keep_history: bool, lock_timeout: float,
                 read_only: bool = False) -> None:
        super().__init__(options, keep_history, lock_timeout, read_only)
        self.path = os.path.abspath(os.path.expanduser(options.path))
        self._check_path()
        #: The thread that checkpoints the WAL off the commits (checkpointer.py).
        self.checkpointer = (
            WalCheckpointer(self.path, options.wal_autocheckpoint, options.synchronous,
                            lock_timeout)
            if options.checkpoint_in_background and not read_only else None)

    def _check_path(self) -> None:
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise ConfigurationError(
                f"the directory of the SQLite database {self.path} does not exist;"
                " create it first (zodbsql creates the file, not its directory)")
        if os.path.exists(self.path):
            if os.path.isdir(self.path):
                raise ConfigurationError(f"SQLite path {self.path} is a directory, not a file")
            if not os.access(self.path, os.R_OK):
                raise ConfigurationError(f"SQLite database {self.path} is not readable")
            if not self.read_only and not os.access(self.path, os.W_OK):
                raise ConfigurationError(
                    f"SQLite database {self.path} is read-only for this process;"
                    " open the storage with read-only true or fix the file's permissions")
            self._check_wal_files(directory)
        elif self.read_only:
            raise ConfigurationError(
                f"SQLite database {self.path} does not exist and the storage is read-only")
        elif not os.access(directory, os.W_OK):
            raise ConfigurationError(
                f"cannot create the SQLite database {self.path}: its directory is not writable")

    def _check_wal_files(self, directory: str) -> None:
        """A WAL database is read and written through DB-wal and DB-shm beside it, even
        read-only; SQLite creates them when they are missing, in the directory."""
        missing = [self.path + suffix for suffix in WAL_FILES
                   if not os.path.exists(self.path + suffix)]
        if missing and in_wal_mode(self.path) and not os.access(directory, os.W_OK | os.X_OK):
            raise ConfigurationError(
                f"SQLite database {self.path} is in WAL mode, which needs"
                f" {' and '.join(missing)}; SQLite can't create them because the directory"
                f" {directory} is not writable for this process: make the directory"
                " writable for the user the storage runs as")

    def check_exists(self) -> None:
        if not os.path.exists(self.path):
            raise SchemaError(
                f"SQLite database {self.path} does not exist and create-schema is false,"
                " so it was not created")

    def connect(self) -> DBConnection:
        try:
            if self.read_only:
                raw = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                      isolation_level=None, check_same_thread=False,
                                      timeout=self.lock_timeout)
            else:
                raw = sqlite3.connect(self.path, isolation_level=None,
                                      check_same_thread=False, timeout=self.lock_timeout)
        except sqlite3.Error as exc:
            raise DatabaseError(f"cannot open SQLite database {self.path}: {exc}") from exc
        conn = SQLiteConnection(raw, self.path, self.lock_timeout)
        try:
            # Only a zodbsql database is switched to WAL (switching writes the file's
            # header); a new one is switched once its schema exists (SQLiteSchema).
            if not self.read_only and conn.fetchone(HAS_META) is not None:
                use_wal(conn, self.lock_timeout)
            conn.synchronous = self.options.synchronous.upper()
            conn.execute(f"PRAGMA synchronous = {conn.synchronous}")
            if not self.read_only:
                conn.execute(f"PRAGMA wal_autocheckpoint = {int(self.options.wal_autocheckpoint)}")
                if self.checkpointer is not None:
                    conn.after_commit = self.checkpointer.committed
            conn.execute("PRAGMA foreign_keys = OFF")
            conn.execute("PRAGMA temp_store = MEMORY")
        except BaseException:
            conn.close()
            raise
        conn.statements = 0
        return conn

    def watch_commits(self) -> DataVersionWatch:
        return DataVersionWatch()

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()

    def describe(self) -> str:
        return f"SQLite database {self.path}"

    def sort_key(self) -> str:
        return f"zodbsql:sqlite3:{self.path}"

    def database_size(self, conn: ConnectionRole) -> int:
        pages = conn.fetchone("PRAGMA page_count")
        size = conn.fetchone("PRAGMA page_size")
        return int(pages[0]) * int(size[0]) if pages and size else 0
