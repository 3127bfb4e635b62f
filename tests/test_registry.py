"""The backend registry: each entry is complete, and every place that picks a backend
(URLs, zodburi, ZConfig, the tools, the test matrix) finds it there."""
from __future__ import annotations

import dataclasses
import importlib.resources
import pathlib
import tomllib

import pytest

from zodbsql.api import parse_url
from zodbsql.backends import registry
from zodbsql.backends.base.adapter import Backend
from zodbsql.cli.opening import STORAGE_HELP
from zodbsql.errors import ConfigurationError
from zodbsql.options import BackendOptions
from tests.databases import FACTORIES

ENTRIES = registry.BACKENDS
IDS = [entry.name for entry in ENTRIES]
PYPROJECT = tomllib.loads((pathlib.Path(__file__).parent.parent / "pyproject.toml").read_text())


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_an_entry_names_its_classes_and_folder(entry: registry.BackendEntry) -> None:
    options = entry.options_class()
    assert dataclasses.is_dataclass(options) and issubclass(options, BackendOptions)
    assert issubclass(entry.backend_class(), Backend)
    folder = importlib.resources.files("zodbsql.backends") / entry.options.split(".")[2]
    for module in ("__init__.py", "adapter.py", "options.py"):
        assert (folder / module).is_file(), f"{entry.name}: {module}"


def test_names_schemes_and_sections_are_unique() -> None:
    for values in (registry.names(), registry.schemes(), [e.section for e in ENTRIES]):
        assert len(values) == len(set(values))


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_every_scheme_picks_its_backend(entry: registry.BackendEntry) -> None:
    # An SQLite URL names a file, a server's a login, host and database.
    where = "/tmp/x.sqlite" if entry.name == "sqlite" else "user@host/db"
    for scheme in entry.schemes:
        for prefix in ("", "zodbsql+"):
            backend, _ = parse_url(f"{prefix}{scheme}://{where}")
            assert registry.entry_for_options(backend) is entry
            assert f"{scheme}://" in STORAGE_HELP


def test_an_unknown_scheme_lists_the_known_ones() -> None:
    with pytest.raises(ConfigurationError, match="mariadb://"):
        parse_url("oracle://db/x")


def test_zodburi_knows_every_backend() -> None:
    resolvers = PYPROJECT["project"]["entry-points"]["zodburi.resolvers"]
    assert sorted(resolvers) == sorted(f"zodbsql+{e.schemes[0]}" for e in ENTRIES)
    assert set(resolvers.values()) == {"zodbsql.uri:resolve_uri"}


def test_every_backend_has_a_test_factory() -> None:
    assert sorted(FACTORIES) == sorted(registry.names())


def test_by_name_and_section() -> None:
    for entry in ENTRIES:
        assert registry.by_name(entry.name) is entry
        assert registry.by_section(entry.section) is entry
    with pytest.raises(ConfigurationError, match="sqlite"):
        registry.by_name("oracle")
