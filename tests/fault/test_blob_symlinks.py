"""Symlinks planted in the local blob cache (database layout).

The cache directory may be shared by several processes, so whoever can write there can
put a symlink where a cached blob (or a fan-out directory) would be.  zodbsql must not
serve the file it points to, write through it, touch its target's times, or delete the
target.  Serving the real blob (downloaded again) or refusing with a storage error are
both fine.  The blob cache is being hardened on the ``hygiene`` branch; until that lands
the serving and writing-through tests fail here.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
from typing import Any, Iterator

import pytest
import transaction
import ZODB
from ZODB.blob import Blob
from ZODB.POSException import POSError

import zodbsql
from zodbsql.errors import ZodbsqlError
from tests.fault.conftest import MakeScratch

pytestmark = pytest.mark.fault

CONTENT = b"the real blob " * 3000
PLANTED = b"planted by someone else"
OLD = 1_000_000_000.0   # a timestamp long past: pruning sees the target as unused


class Planted:
    """A file outside the cache whose content and times must not change."""

    def __init__(self, path: pathlib.Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(PLANTED)
        os.utime(path, (OLD, OLD))
        self.path = path

    def assert_untouched(self) -> None:
        assert self.path.exists(), f"the symlink's target {self.path} was deleted"
        assert self.path.read_bytes() == PLANTED, f"{self.path} was written through a symlink"
        assert os.stat(self.path).st_mtime == OLD, f"{self.path}'s times were changed"


def cache_path(cache: pathlib.Path, content: bytes) -> pathlib.Path:
    """Where the cache keeps ``content`` (``ab/cd/<sha256>.blob``)."""
    name = hashlib.sha256(content).hexdigest()
    return cache / name[:2] / name[2:4] / f"{name}.blob"


def plant(link: pathlib.Path, target: pathlib.Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


class Database:
    """A ZODB on one SQLite file; each ``open`` gets its own blob cache directory."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.dbs: list[ZODB.DB] = []

    def open(self, cache: pathlib.Path) -> ZODB.DB:
        db = ZODB.DB(zodbsql.open_storage(self.url, blob_dir=str(cache)))
        self.dbs.append(db)
        return db

    def write(self, cache: pathlib.Path) -> None:
        db = self.open(cache)
        tm = transaction.TransactionManager(explicit=True)
        conn = db.open(tm)
        with tm:
            blob = Blob()
            with blob.open("w") as f:
                f.write(CONTENT)
            conn.root()["blob"] = blob
        conn.close()

    def read(self, db: ZODB.DB) -> "Served":
        """The blob's content and the path the storage handed out for it, or the error."""
        tm = transaction.TransactionManager(explicit=True)
        conn = db.open(tm)
        try:
            with tm:
                blob = conn.root()["blob"]
                try:
                    with blob.open("r") as f:
                        data = f.read()
                    return Served(data, db.storage.loadBlob(blob._p_oid, blob._p_serial))
                except Exception as exc:
                    return Served(error=exc)
        finally:
            conn.close()

    def close(self) -> None:
        for db in self.dbs:
            db.close()


@pytest.fixture
def database(make_scratch: MakeScratch) -> Iterator[Database]:
    database = Database(make_scratch("sqlite").url(True))
    yield database
    database.close()


@dataclasses.dataclass
class Served:
    data: bytes = b""
    path: str = ""
    error: Exception | None = None

    def assert_safe(self, cache: pathlib.Path) -> None:
        """The real blob from a real file in the cache, or a storage error."""
        if self.error is not None:
            assert isinstance(self.error, (POSError, ZodbsqlError)), (
                f"reading the blob failed with an unrelated error: {self.error!r}")
            return
        assert self.data == CONTENT, "the blob read is the planted file, not the blob"
        assert not os.path.islink(self.path), f"the storage handed out a symlink: {self.path}"
        real = os.path.realpath(self.path)
        assert real.startswith(str(cache.resolve()) + os.sep), (
            f"{self.path} leads out of the cache")


def test_symlink_in_place_of_a_cached_blob(database: Database, tmp_path: pathlib.Path) -> None:
    database.write(tmp_path / "writer-cache")
    cache = tmp_path / "reader-cache"
    planted = Planted(tmp_path / "outside" / "secret")
    plant(cache_path(cache, CONTENT), planted.path)
    database.read(database.open(cache)).assert_safe(cache)
    planted.assert_untouched()


def test_symlinked_fan_out_directory(database: Database, tmp_path: pathlib.Path) -> None:
    database.write(tmp_path / "writer-cache")
    cache = tmp_path / "reader-cache"
    outside = tmp_path / "outside"
    outside.mkdir()
    plant(cache_path(cache, CONTENT).parent.parent, outside)   # cache/ab -> outside
    database.read(database.open(cache)).assert_safe(cache)
    assert not any(outside.iterdir()), (
        f"the cache wrote through a symlinked directory: {sorted(outside.rglob('*'))}")


def test_symlink_where_a_commit_installs_its_blob(database: Database,
                                                  tmp_path: pathlib.Path) -> None:
    """The committing process moves its blob into the cache: not onto a planted link."""
    cache = tmp_path / "cache"
    planted = Planted(tmp_path / "outside" / "secret")
    plant(cache_path(cache, CONTENT), planted.path)
    database.write(cache)
    database.read(database.dbs[-1]).assert_safe(cache)
    planted.assert_untouched()


def test_pruning_leaves_symlink_targets_alone(database: Database,
                                              tmp_path: pathlib.Path) -> None:
    cache = tmp_path / "cache"
    database.write(cache)
    planted = [Planted(tmp_path / "outside" / f"secret{n}") for n in range(3)]
    for number, target in enumerate(planted):
        plant(cache_path(cache, b"fake %d" % number), target.path)
    storage: Any = database.dbs[-1].storage
    blob_cache = storage.shared.blob_files.cache
    blob_cache.limit = 1            # everything is over the limit
    blob_cache.prune()
    for target in planted:
        target.assert_untouched()
