"""ZConfig datatypes for the ``<zodbsql>`` section and its backend sections.

The keys of each section are the settings declared by the options dataclasses
(``zodbsql.options``); ``component.xml`` lists them for ZConfig, and
``tests/test_options.py`` checks that the two agree.
"""
from __future__ import annotations

from typing import Any

from ZODB.config import BaseConfig

from zodbsql.backends import registry
from zodbsql.options import Options, from_section
from zodbsql.storage import SQLStorage


def options_from_section(section: Any) -> Options:
    return from_section(Options, section)


class StorageFactory(BaseConfig):
    """``<zodbsql>``: opens a :class:`SQLStorage` on the configured backend."""

    def open(self, database_name: str = "unnamed", databases: Any = None) -> SQLStorage:
        options = options_from_section(self.config)
        backend = self.config.backend.create_backend(
            options.keep_history, options.commit_lock_timeout, options.read_only)
        return SQLStorage(backend, options)


def BackendSection(section: Any) -> Any:
    """``<sqlite3>``, ``<postgresql>``, ...: the options of the backend whose section
    type it is (``zodbsql.backends.registry``)."""
    entry = registry.by_section(section.getSectionType())
    return from_section(entry.options_class(), section)
