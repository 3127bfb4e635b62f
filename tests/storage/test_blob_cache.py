"""The local blob cache trusts nothing planted in it: it is created 0700, refused when
another user owns it, and no symbolic link in it is followed when serving, pruning,
evicting or locking; what lies outside stays as it was."""
from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import stat
from typing import Any

import pytest
import transaction
import ZODB
from ZODB.blob import Blob

from zodbsql.errors import ConfigurationError

storage_backends = ("sqlite",)
storage_backends_reason = "the blob cache is local files, the same on every backend"
CONTENT = b"the blob's own bytes " * 100
PLANTED = b"a file another user planted"


@pytest.fixture
def outside(tmp_path: pathlib.Path) -> pathlib.Path:
    """A directory outside the cache with a file the cache must never touch."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret").write_bytes(b"root only")
    return folder


def committed_blob(storage_factory: Any, cache: pathlib.Path) -> tuple[Any, bytes, bytes]:
    """A storage with one committed blob, evicted from the cache: (storage, oid, serial)."""
    storage = storage_factory.open(blob_dir=str(cache))
    db = ZODB.DB(storage)
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    conn.root()["blob"] = Blob(CONTENT)
    tm.commit()
    blob = conn.root()["blob"]
    blob._p_activate()
    oid, serial = blob._p_oid, blob._p_serial
    conn.close()
    storage.shared.blob_files.cache.evict(hashlib.sha256(CONTENT).digest())
    return storage, oid, serial


def cached_path(storage: Any) -> pathlib.Path:
    return pathlib.Path(storage.shared.blob_files.cache.path(hashlib.sha256(CONTENT).digest()))


def snapshot(folder: pathlib.Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_new_cache_is_private_and_a_loose_one_is_tightened(storage_factory: Any,
                                                             tmp_path: pathlib.Path) -> None:
    storage_factory.open(blob_dir=str(tmp_path / "new"))
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    storage_factory.open_other(blob_dir=str(loose))
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700


def test_a_cache_another_user_owns_is_refused(storage_factory: Any,
                                              tmp_path: pathlib.Path) -> None:
    if os.geteuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir()
        os.chown(foreign, 65534, 65534)
    else:
        foreign = pathlib.Path("/")  # root's
    with pytest.raises(ConfigurationError) as info:
        storage_factory.open(blob_dir=str(foreign))
    message = str(info.value)
    assert str(foreign) in message and "is owned by" in message
    assert f"uid {os.stat(foreign).st_uid}" in message
    if os.geteuid() == 0:
        assert list(foreign.iterdir()) == []  # nothing was written into it


def test_a_planted_file_link_is_never_served(storage_factory: Any, tmp_path: pathlib.Path,
                                             outside: pathlib.Path) -> None:
    storage, oid, serial = committed_blob(storage_factory, tmp_path / "cache")
    path = cached_path(storage)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(outside / "secret")
    before = snapshot(outside)
    served = storage.loadBlob(oid, serial)
    assert pathlib.Path(served).read_bytes() == CONTENT
    assert not os.path.islink(served)
    with storage.openCommittedBlobFile(oid, serial) as f:
        assert f.read() == CONTENT
    assert snapshot(outside) == before


def test_a_planted_directory_link_is_never_followed(storage_factory: Any,
                                                    tmp_path: pathlib.Path,
                                                    outside: pathlib.Path) -> None:
    storage, oid, serial = committed_blob(storage_factory, tmp_path / "cache")
    path = cached_path(storage)
    top = path.parent.parent          # cache/ab
    shutil.rmtree(top, ignore_errors=True)
    planted = outside / path.parent.name / path.name   # outside/cd/<hash>.blob
    planted.parent.mkdir()
    planted.write_bytes(PLANTED)
    top.symlink_to(outside)
    before = snapshot(outside)
    storage.shared.blob_files.cache.evict(hashlib.sha256(CONTENT).digest())
    assert snapshot(outside) == before    # evict went nowhere through the link
    assert pathlib.Path(storage.loadBlob(oid, serial)).read_bytes() == CONTENT
    assert top.is_dir() and not top.is_symlink()
    assert snapshot(outside) == before


def test_pruning_never_leaves_the_cache(storage_factory: Any, tmp_path: pathlib.Path,
                                        outside: pathlib.Path) -> None:
    storage, oid, serial = committed_blob(storage_factory, tmp_path / "cache")
    cache = storage.shared.blob_files.cache
    storage.loadBlob(oid, serial)
    # outside/cd/*.blob behind a planted cache/ab, and a file link cache/ef/gh/x.blob
    (outside / "cd").mkdir()
    for i in range(3):
        (outside / "cd" / f"{i}.blob").write_bytes(PLANTED)
    (tmp_path / "cache" / "ab").symlink_to(outside)
    (tmp_path / "cache" / "ef" / "gh").mkdir(parents=True)
    (tmp_path / "cache" / "ef" / "gh" / "x.blob").symlink_to(outside / "secret")
    old = 1_000_000_000
    for p in outside.rglob("*"):
        os.utime(p, (old, old))
    before = snapshot(outside)
    cache.limit, cache.keep_recent = 1, 0.0
    cache.prune()
    assert snapshot(outside) == before
    assert not cached_path(storage).exists()  # its own file was pruned


def test_a_planted_prune_lock_creates_nothing(storage_factory: Any, tmp_path: pathlib.Path,
                                              outside: pathlib.Path) -> None:
    storage, oid, serial = committed_blob(storage_factory, tmp_path / "cache")
    cache = storage.shared.blob_files.cache
    cache.wait()
    lock = tmp_path / "cache" / ".prune.lock"
    lock.unlink(missing_ok=True)    # the first file's prune made it: a link replaces it
    lock.symlink_to(outside / "made-through-the-link")
    cache.limit, cache.keep_recent = 1, 0.0
    storage.loadBlob(oid, serial)
    assert cache.prune() == 0
    assert not (outside / "made-through-the-link").exists()
    assert cached_path(storage).exists()  # no pruning without its own lock
