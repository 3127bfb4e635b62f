"""The three ways to configure a storage: ZConfig, zodburi URIs and Python."""
from __future__ import annotations

import pathlib

import pytest
import transaction
import ZODB.config
import zodburi

import zodbsql
import zodbsql.uri
from zodbsql.errors import ConfigurationError, SchemaError


def zconfig(path: pathlib.Path, extra: str = "") -> str:
    return f"""
%import zodbsql
<zodb>
  <zodbsql>
    {extra}
    <sqlite3>
      path {path}
      synchronous normal
    </sqlite3>
  </zodbsql>
</zodb>
"""


def test_zconfig_opens_a_working_database(tmp_path: pathlib.Path) -> None:
    text = zconfig(tmp_path / "Data.sqlite",
                   "keep-history false\n cache-size-mb 8\n commit-lock-timeout 5\n name main")
    db = ZODB.config.databaseFromString(text)
    try:
        options = db.storage.options
        assert (options.keep_history, options.cache_size_mb, options.commit_lock_timeout,
                options.name) == (False, 8.0, 5.0, "main")
        assert not db.storage.supportsUndo()
        with db.transaction() as conn:
            conn.root.answer = 42
    finally:
        db.close()
    db = ZODB.config.databaseFromString(text)
    try:
        with db.transaction() as conn:
            assert conn.root.answer == 42
    finally:
        db.close()


def test_zconfig_refuses_the_other_history_mode(tmp_path: pathlib.Path) -> None:
    ZODB.config.databaseFromString(zconfig(tmp_path / "Data.sqlite")).close()
    with pytest.raises(SchemaError, match="history-preserving"):
        ZODB.config.databaseFromString(zconfig(tmp_path / "Data.sqlite", "keep-history false"))


def test_zconfig_bad_value_names_the_option(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigurationError, match="commit-lock-timeout"):
        ZODB.config.databaseFromString(
            zconfig(tmp_path / "Data.sqlite", "commit-lock-timeout -1"))


def test_zodburi_resolves_storage_and_db_arguments(tmp_path: pathlib.Path) -> None:
    uri = (f"zodbsql+sqlite://{tmp_path}/Data.sqlite"
           "?keep_history=false&cache_size_mb=4&database_name=main&connection_cache_size=123")
    factory, dbkw = zodburi.resolve_uri(uri)
    assert dbkw["database_name"] == "main" and dbkw["cache_size"] == 123
    storage = factory()
    try:
        assert storage.options.keep_history is False
        assert storage.options.cache_size_mb == 4.0
    finally:
        storage.close()


@pytest.mark.parametrize("slashes", ["//", "///"], ids=["sqlite:///abs", "sqlite:////abs"])
def test_an_absolute_sqlite_path_stays_absolute_through_zodburi(
        tmp_path: pathlib.Path, slashes: str) -> None:
    """Both spellings of an absolute path (ours, SQLAlchemy's) name the same file, also
    when zodburi's DB arguments are taken out of the query (a URL put back together by
    its parts once made the path relative: sqlite://tmp/...)."""
    path = f"{tmp_path}/Data.sqlite"
    for uri in (f"zodbsql+sqlite:{slashes}{path}", f"sqlite:{slashes}{path}",
                f"zodbsql+sqlite:{slashes}{path}?database_name=main&prefetch_count=3"):
        factory, _ = zodbsql.uri.resolve_uri(uri)
        storage = factory()
        try:
            assert getattr(storage.shared.backend.options, "path") == path
        finally:
            storage.close()


def test_prefetch_bounds_from_zconfig_and_uri(tmp_path: pathlib.Path) -> None:
    db = ZODB.config.databaseFromString(
        zconfig(tmp_path / "Data.sqlite", "prefetch-count 50\n prefetch-bytes 64KB"))
    try:
        prefetcher = db.storage.shared.prefetcher
        assert (prefetcher.limit, prefetcher.max_bytes) == (50, 64 * 1024)
    finally:
        db.close()
    factory, _ = zodburi.resolve_uri(
        f"zodbsql+sqlite://{tmp_path}/Data.sqlite?prefetch_count=0&prefetch_bytes=4096")
    storage = factory()
    try:
        assert (storage.options.prefetch_count, storage.options.prefetch_bytes) == (0, 4096)
        assert not storage.shared.prefetcher.enabled
    finally:
        storage.close()
    with pytest.raises(ConfigurationError, match="prefetch-count"):
        ZODB.config.databaseFromString(zconfig(tmp_path / "Data.sqlite", "prefetch-count -1"))


def test_zodburi_bad_option_fails_at_resolve_time(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigurationError, match="colour"):
        zodburi.resolve_uri(f"zodbsql+sqlite://{tmp_path}/Data.sqlite?colour=blue")


def test_python_api(tmp_path: pathlib.Path) -> None:
    db = zodbsql.open_db(zodbsql.SQLiteOptions(path=str(tmp_path / "Data.sqlite")),
                         keep_history=True, cache_size_mb=1)
    try:
        conn = db.open()
        conn.root.value = "x"
        transaction.commit()
        assert db.storage.undoLog(0, 1)
        conn.close()
    finally:
        db.close()
    storage = zodbsql.open_storage(f"sqlite://{tmp_path}/Data.sqlite")
    try:
        assert len(storage) == 1  # the root
    finally:
        storage.close()


def test_options_are_immutable() -> None:
    options = zodbsql.Options()
    with pytest.raises(AttributeError):
        options.keep_history = False  # type: ignore[misc]
    assert options.replace(keep_history=False).keep_history is False


def test_blob_options_from_zconfig_and_url(tmp_path: pathlib.Path) -> None:
    from ZODB.blob import Blob
    from ZODB.interfaces import IBlobStorage

    from zodbsql.api import parse_url
    text = zconfig(tmp_path / "Data.sqlite",
                   f"blob-dir {tmp_path}/blobs\n blob-cache-size 200MB\n"
                   " blob-chunk-size 64KB")
    db = ZODB.config.databaseFromString(text)
    try:
        options = db.storage.options
        assert (options.blob_dir, options.shared_blob_dir, options.blob_cache_size,
                options.blob_chunk_size) == (f"{tmp_path}/blobs", False, 200 << 20, 64 << 10)
        assert IBlobStorage.providedBy(db.storage)
        with db.transaction() as conn:
            conn.root.blob = Blob(b"data")
        with db.transaction() as conn:
            with conn.root.blob.open() as f:
                assert f.read() == b"data"
    finally:
        db.close()
    _, options = parse_url(f"sqlite://{tmp_path}/x.sqlite?blob_dir={tmp_path}/b"
                           "&shared_blob_dir=true&blob_cache_size=1000&blob_chunk_size=4096")
    assert (options.blob_dir, options.shared_blob_dir, options.blob_cache_size,
            options.blob_chunk_size) == (f"{tmp_path}/b", True, 1000, 4096)
    with pytest.raises(ConfigurationError, match="shared-blob-dir"):
        parse_url(f"sqlite://{tmp_path}/x.sqlite?shared_blob_dir=true")
    plain = ZODB.config.databaseFromString(zconfig(tmp_path / "Plain.sqlite"))
    try:
        assert plain.storage.options.blob_dir is None
        assert not IBlobStorage.providedBy(plain.storage)
    finally:
        plain.close()
