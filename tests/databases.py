"""The databases the tests run against, one factory per backend.

Each factory makes storages on a database the test created and removes it afterwards.
SQLite needs nothing; server backends join ``BACKENDS`` as they land, and with CI=true a
server that can't be reached fails the run instead of skipping it.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

from zodbsql.api import open_storage
from zodbsql.backends.sqlite.adapter import SQLiteOptions
from zodbsql.storage import SQLStorage


@dataclasses.dataclass(frozen=True)
class Param:
    """One cell of the matrix: a backend and a history mode."""

    backend: str
    keep_history: bool

    @property
    def id(self) -> str:
        return f"{self.backend}-{'hp' if self.keep_history else 'hf'}"


class SQLiteFactory:
    """Storages on SQLite files in the test's temporary directory."""

    def __init__(self, param: Param, tmp_path: pathlib.Path) -> None:
        self.param = param
        self.tmp_path = tmp_path
        self.count = 0
        self.opened: list[SQLStorage] = []
        self.path = self.new_path()

    def new_path(self) -> str:
        self.count += 1
        return str(self.tmp_path / f"db{self.count}.sqlite")

    def backend_options(self, path: str | None = None) -> Any:
        return SQLiteOptions(path=path or self.path, synchronous="normal")

    def open(self, path: str | None = None, **options: Any) -> SQLStorage:
        options.setdefault("keep_history", self.param.keep_history)
        storage = open_storage(self.backend_options(path), **options)
        self.opened.append(storage)
        return storage

    def open_other(self, **options: Any) -> SQLStorage:
        """A storage on a second, empty database of the same kind."""
        return self.open(self.new_path(), **options)

    def cleanup(self) -> None:
        for storage in self.opened:
            storage.close()


FACTORIES = {"sqlite": SQLiteFactory}
BACKENDS = [b for b in os.environ.get("ZODBSQL_TEST_BACKENDS", "sqlite").split(",") if b]
PARAMS = [Param(backend, keep_history) for backend in BACKENDS for keep_history in (True, False)]
