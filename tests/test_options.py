"""Settings are declared once: ZConfig's schema (component.xml), the URL parser, the
options dataclasses and the README agree on every name, type and default.

A setting added to a dataclass and not to component.xml (or the other way round), with
another default or datatype there, or missing from the README, fails here.
"""
from __future__ import annotations

import dataclasses
import io
import pathlib
from typing import Any

import pytest
import ZConfig

from zodbsql.api import parse_url
from zodbsql.backends import registry
from zodbsql.options import Options, settings, value_type, zconfig_datatype, zconfig_key

README = pathlib.Path(__file__).parent.parent / "README.md"
#: A schema with one storage section (ZODB's abstract type) and zodbsql's component.
SCHEMA = """<schema>
  <import package="ZODB"/>
  <import package="zodbsql"/>
  <section type="ZODB.storage" name="*" attribute="storage" required="yes"/>
</schema>"""
#: (ZConfig section type, its options class): ``<zodbsql>`` and every backend's section.
SECTIONS = [("zodbsql", Options)] + [(e.section, e.options_class()) for e in registry.BACKENDS]


def schema() -> Any:
    return ZConfig.loadSchemaFile(io.StringIO(SCHEMA))


def normalized(text: str | None) -> str:
    return " ".join((text or "").split())


def declared(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {zconfig_key(f): f for f in settings(cls)}


@pytest.mark.parametrize("section_type, cls", SECTIONS, ids=[s for s, _ in SECTIONS])
def test_zconfig_keys_are_the_declared_settings(section_type: str, cls: type) -> None:
    zschema = schema()
    keys = {key: info for key, info in zschema.gettype(section_type)
            if not info.issection()}
    fields = declared(cls)
    assert sorted(keys) == sorted(fields), f"<{section_type}> in component.xml"
    for key, info in keys.items():
        field = fields[key]
        where = f"<{section_type}> key {key}"
        assert info.datatype is zschema.registry.get(zconfig_datatype(cls, field)), where
        assert (info.minOccurs == 1) == field.metadata["required"], where
        assert normalized(info.description) == normalized(field.metadata["doc"]), where
        default = info.getdefault()
        if field.metadata["required"] or field.default is None:
            assert default is None, f"{where}: the dataclass has no default value"
        else:
            assert info.datatype(default.value) == field.default, where


def test_every_backend_has_its_section() -> None:
    """Under its short name (``%import zodbsql``) and its prefixed one."""
    sections = schema().gettype("zodbsql.backend").getsubtypenames()
    assert sorted(sections) == sorted(name for entry in registry.BACKENDS
                                      for name in (entry.section, entry.prefixed_section))
    for entry in registry.BACKENDS:     # the short name is the prefixed section, renamed
        short, prefixed = (dict(schema().gettype(name)) for name in
                           (entry.section, entry.prefixed_section))
        assert short.keys() == prefixed.keys()


def required_keys(cls: type, tmp_path: pathlib.Path) -> dict[str, str]:
    return {zconfig_key(f): str(tmp_path / "x") for f in settings(cls)
            if f.metadata["required"]}


def load(section_type: str, cls: type, tmp_path: pathlib.Path,
         key: str | None = None, text: str = "") -> tuple[Options, Any]:
    """The options ZConfig makes of a ``<zodbsql>`` with a ``section_type`` backend
    section holding its required keys (and ``key text`` in that section)."""
    backend = registry.BACKENDS[0] if section_type == "zodbsql" else registry.by_section(
        section_type)
    backend_keys = required_keys(backend.options_class(), tmp_path)
    storage_keys: dict[str, str] = {}
    if key:
        (storage_keys if section_type == "zodbsql" else backend_keys)[key] = text
    lines = [f"{k} {v}" for k, v in storage_keys.items()]
    lines += [f"<{backend.section}>"] + [f"{k} {v}" for k, v in backend_keys.items()]
    lines += [f"</{backend.section}>"]
    config, _ = ZConfig.loadConfigFile(
        schema(), io.StringIO("<zodbsql>\n" + "\n".join(lines) + "\n</zodbsql>\n"))
    factory = config.storage
    from zodbsql.config import options_from_section
    return options_from_section(factory.config), factory.config.backend


@pytest.mark.parametrize("section_type, cls", SECTIONS, ids=[s for s, _ in SECTIONS])
def test_zconfig_defaults_are_the_dataclass_defaults(section_type: str, cls: type,
                                                     tmp_path: pathlib.Path) -> None:
    options, backend = load(section_type, cls, tmp_path)
    made = options if section_type == "zodbsql" else backend
    assert made == cls(**{f.name: str(tmp_path / "x") for f in settings(cls)
                          if f.metadata["required"]})


#: Values of settings that take a few words only, by section type and setting.
CHOICES = {("sqlite3", "synchronous"): "normal", ("zodbsql", "compress"): "zstd",
           ("zodbsql", "cache_compress"): "zstd",
           ("zodbsql", "compress_level"): "9", ("postgresql", "driver"): "psycopg",
           ("postgresql", "toast_compression"): "pglz", ("mysql", "driver"): "pymysql"}


def sample(section_type: str, cls: type, field: dataclasses.Field[Any],
           tmp_path: pathlib.Path) -> str:
    """A value the setting accepts, other than its default."""
    if (section_type, field.name) in CHOICES:
        return CHOICES[section_type, field.name]
    kind = value_type(cls, field.name)
    if kind is bool:
        return "false" if field.default else "true"
    if kind is str:
        return str(tmp_path)
    return {int: "4096", float: "0.5"}[kind]


def storage_url(tmp_path: pathlib.Path, section_type: str, query: str) -> str:
    if section_type in ("zodbsql", "sqlite3"):
        return f"sqlite://{tmp_path}/x.sqlite?{query}"
    scheme = registry.by_section(section_type).schemes[0]
    return f"{scheme}://user@host/db?{query}"


@pytest.mark.parametrize("section_type, cls", SECTIONS, ids=[s for s, _ in SECTIONS])
def test_url_and_zconfig_read_every_setting_alike(section_type: str, cls: type,
                                                  tmp_path: pathlib.Path) -> None:
    """Each setting a URL takes as a query parameter is read by the URL parser and by
    ZConfig as the same value, of the dataclass's type."""
    for field in settings(cls):
        if field.metadata["required"]:
            continue
        text = sample(section_type, cls, field, tmp_path)
        if field.name == "shared_blob_dir":  # needs a blob-dir
            continue
        options, backend = load(section_type, cls, tmp_path, zconfig_key(field), text)
        from_zconfig = getattr(options if section_type == "zodbsql" else backend, field.name)
        assert isinstance(from_zconfig, value_type(cls, field.name)), field.name
        assert from_zconfig != field.default, field.name
        if not field.metadata["in_query"]:
            continue
        url_backend, url_options = parse_url(
            storage_url(tmp_path, section_type, f"{field.name}={text}"))
        made = url_options if section_type == "zodbsql" else url_backend
        assert getattr(made, field.name) == from_zconfig, field.name


def test_a_url_without_query_has_the_default_settings(tmp_path: pathlib.Path) -> None:
    _, options = parse_url(f"sqlite://{tmp_path}/x.sqlite")
    assert options == Options()


def test_every_setting_is_documented_in_the_readme() -> None:
    readme = README.read_text()
    missing = [f"{section}: {key}" for section, cls in SECTIONS for key in declared(cls)
               if f"`{key}`" not in readme]
    assert not missing, "settings the README does not name"
