"""ZConfig datatypes for the ``<zodbsql>`` section and its backend sections."""
from __future__ import annotations

from typing import Any

from ZODB.config import BaseConfig

from zodbsql.backends.mysql.adapter import MySQLOptions
from zodbsql.backends.sqlite.adapter import SQLiteOptions
from zodbsql.options import Options
from zodbsql.storage import SQLStorage


def options_from_section(section: Any) -> Options:
    return Options(
        name=section.name,
        keep_history=section.keep_history,
        read_only=section.read_only,
        create_schema=section.create_schema,
        cache_size_mb=section.cache_size_mb,
        prefetch_count=section.prefetch_count,
        prefetch_bytes=section.prefetch_bytes,
        commit_lock_timeout=section.commit_lock_timeout,
        row_lock_timeout=section.row_lock_timeout,
        pack_gc=section.pack_gc,
        pack_batch_size=section.pack_batch_size,
        pack_duty_cycle=section.pack_duty_cycle,
        blob_dir=section.blob_dir,
        shared_blob_dir=section.shared_blob_dir,
        blob_cache_size=section.blob_cache_size,
        blob_chunk_size=section.blob_chunk_size,
    )


class StorageFactory(BaseConfig):
    """``<zodbsql>``: opens a :class:`SQLStorage` on the configured backend."""

    def open(self, database_name: str = "unnamed", databases: Any = None) -> SQLStorage:
        options = options_from_section(self.config)
        backend = self.config.backend.create_backend(
            options.keep_history, options.commit_lock_timeout, options.read_only)
        return SQLStorage(backend, options)


def SQLiteSection(section: Any) -> SQLiteOptions:
    """``<sqlite3>``: the database file."""
    return SQLiteOptions(path=section.path, synchronous=section.synchronous)


def PostgreSQLSection(section: Any) -> Any:
    """``<postgresql>``: the server, database and schema."""
    from zodbsql.backends.postgresql.adapter import PostgreSQLOptions
    return PostgreSQLOptions(dsn=section.dsn, schema=section.schema, driver=section.driver)


def MySQLSection(section: Any) -> MySQLOptions:
    """``<mysql>``: the server, database, login and driver."""
    return MySQLOptions(host=section.host, port=section.port, unix_socket=section.unix_socket,
                        db=section.db, user=section.user, passwd=section.passwd or "",
                        driver=section.driver)
