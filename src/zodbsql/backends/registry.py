"""The backends zodbsql knows: one record each, read by everything that picks a backend.

``api`` (URLs), ``config`` (ZConfig sections), ``uri`` (zodburi), the command line and
the test factories find a backend here by its URL scheme, its ZConfig section type,
its options object or its name; none of them names a database itself.  Adding a
backend is one :class:`BackendEntry` in :data:`BACKENDS` plus its folder (see the
README, "How to add a backend").  Classes are named by import path, so a backend's
modules (and its driver) load only when it is used.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING, Any

from zodbsql.errors import ConfigurationError

if TYPE_CHECKING:
    from zodbsql.backends.base.adapter import Backend


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclasses.dataclass(frozen=True)
class BackendEntry:
    """One backend: what names it, and where its classes are."""

    #: The short name: ``ZODBSQL_TEST_BACKENDS``, messages.
    name: str
    #: URL schemes (``sqlite://...``); each also with the ``zodbsql+`` prefix of zodburi.
    #: The first one is registered with zodburi (``pyproject.toml``).
    schemes: tuple[str, ...]
    #: The ZConfig section type inside ``<zodbsql>`` (``component.xml``).
    section: str
    #: ``module:Class`` of the options dataclass (a :class:`zodbsql.options.BackendOptions`).
    options: str
    #: ``module:Class`` of the :class:`zodbsql.backends.base.adapter.Backend` subclass.
    backend: str

    @property
    def prefixed_section(self) -> str:
        """The section's name in ``zodbsql.prefixed`` (beside RelStorage's names)."""
        return f"zodbsql-{self.section}"

    def options_class(self) -> type[Any]:
        """The options dataclass, a ``zodbsql.options.BackendOptions`` (not imported:
        the options module finds its backend here, so the types would go round)."""
        return _load(self.options)  # type: ignore[no-any-return]

    def backend_class(self) -> type[Backend[Any]]:
        return _load(self.backend)  # type: ignore[no-any-return]


BACKENDS: tuple[BackendEntry, ...] = (
    BackendEntry(name="sqlite", schemes=("sqlite", "sqlite3"), section="sqlite3",
                 options="zodbsql.backends.sqlite.options:SQLiteOptions",
                 backend="zodbsql.backends.sqlite.adapter:SQLiteBackend"),
    BackendEntry(name="postgresql", schemes=("postgresql", "postgres"), section="postgresql",
                 options="zodbsql.backends.postgresql.options:PostgreSQLOptions",
                 backend="zodbsql.backends.postgresql.adapter:PostgreSQLBackend"),
    BackendEntry(name="mysql", schemes=("mysql", "mariadb"), section="mysql",
                 options="zodbsql.backends.mysql.options:MySQLOptions",
                 backend="zodbsql.backends.mysql.adapter:MySQLBackend"),
)


def names() -> list[str]:
    return [entry.name for entry in BACKENDS]


def schemes() -> list[str]:
    """Every URL scheme of every backend, without the ``zodbsql+`` prefix."""
    return [scheme for entry in BACKENDS for scheme in entry.schemes]


def by_name(name: str) -> BackendEntry:
    for entry in BACKENDS:
        if entry.name == name:
            return entry
    raise ConfigurationError(f"no backend is named {name!r} (known: {', '.join(names())})")


def by_scheme(scheme: str) -> BackendEntry | None:
    """The backend of a URL scheme (``zodbsql+`` prefix and case ignored), or None."""
    scheme = scheme.lower().removeprefix("zodbsql+")
    return next((entry for entry in BACKENDS if scheme in entry.schemes), None)


def by_section(section_type: str) -> BackendEntry:
    """The backend of a ZConfig section type: its short name (``sqlite3``, with
    ``%import zodbsql``) or the prefixed one (``zodbsql-sqlite3``, with
    ``%import zodbsql.prefixed``)."""
    for entry in BACKENDS:
        if section_type in (entry.section, entry.prefixed_section):
            return entry
    raise ConfigurationError(f"no backend has the ZConfig section <{section_type}>")


def entry_for_options(options: Any) -> BackendEntry:
    """The backend an options object (``SQLiteOptions(...)``) belongs to."""
    for entry in BACKENDS:
        if isinstance(options, entry.options_class()):
            return entry
    raise ConfigurationError(
        f"{type(options).__name__} is not the options class of a zodbsql backend")
