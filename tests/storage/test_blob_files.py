"""The blob files themselves: the cache's layout and what a prune removes (the least
recently used, down to nine tenths of the limit, never a file used within a minute,
never anything but the cache's own files), the memo of revisions' hashes, and the shared
directory's revision files (placed, linked, collected after a pack)."""
from __future__ import annotations

import hashlib
import os
import pathlib
import threading
import time
from typing import Any, Callable

import pytest
from ZODB.POSException import POSKeyError
from ZODB.utils import p64, u64

from zodbsql.storage.blobs import BlobCache, RevisionHashes

storage_backends = ("sqlite",)
storage_backends_reason = "the blob directory is local files, the same on every backend"

KB = 1000


def hash_of(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def writing(data: bytes) -> Callable[[Callable[[bytes], object]], None]:
    """A ``write_to`` for ``BlobCache.fill``: passes ``data`` in one piece."""
    def write_to(write: Callable[[bytes], object]) -> None:
        write(data)
    return write_to


def filled(cache: BlobCache, data: bytes, used: float | None = None) -> str:
    """``data`` written into the cache (as a download does), last used at ``used``."""
    path = cache.fill(hash_of(data), len(data), writing(data))
    if used is not None:
        os.utime(path, (used, used))
    return path


def earlier(cache: BlobCache, datas: list[bytes], used: list[float]) -> list[str]:
    """Files another process put in ``cache``'s directory (a cache with room for them:
    its own first prune removes none), last used at ``used``."""
    other = BlobCache(cache.directory, 10**9)
    paths = [filled(other, data, when) for data, when in zip(datas, used)]
    other.wait()
    for path, when in zip(paths, used):
        os.utime(path, (when, when))     # the other's prune touched nothing, but be sure
    return paths


def files_in(folder: str) -> list[str]:
    """The files in ``folder``, the prune lock left out."""
    return sorted(os.path.relpath(os.path.join(top, name), folder)
                  for top, _, names in os.walk(folder) for name in names
                  if name != ".prune.lock")


@pytest.fixture
def cache(tmp_path: pathlib.Path) -> BlobCache:
    folder = tmp_path / "cache"
    folder.mkdir()
    return BlobCache(str(folder), 5 * KB)


# -- the cache's files ---------------------------------------------------------------------
def test_a_content_is_cached_by_its_hash_and_written_whole(cache: BlobCache) -> None:
    data = b"x" * KB
    name = hash_of(data).hex()
    folder = os.path.join(cache.directory, name[:2], name[2:4])
    seen: list[list[str]] = []

    def write_to(write: Any) -> None:
        write(data[:10])
        seen.append(os.listdir(folder))    # half written: a hidden part file only
        write(data[10:])
    path = cache.fill(hash_of(data), len(data), write_to)
    assert path == cache.path(hash_of(data)) == os.path.join(folder, name + ".blob")
    (part,) = seen[0]
    assert part.startswith(".") and part.endswith(".part")
    assert os.listdir(folder) == [name + ".blob"]
    assert pathlib.Path(path).read_bytes() == data
    assert not os.stat(path).st_mode & 0o222       # read-only, as ZODB's blob files
    assert cache.lookup(hash_of(data)) == path
    assert cache.lookup(hash_of(b"other")) is None
    cache.evict(hash_of(data))
    assert cache.lookup(hash_of(data)) is None
    cache.evict(hash_of(data))        # gone already: nothing to do
    cache.evict(None)


def test_a_download_that_is_not_the_content_leaves_nothing(cache: BlobCache) -> None:
    data = b"y" * KB
    with pytest.raises(POSKeyError):
        cache.fill(hash_of(data), len(data), writing(data[:-1]))
    with pytest.raises(POSKeyError):
        cache.fill(hash_of(data), len(data), writing(b"z" * KB))
    assert files_in(cache.directory) == []


def test_a_lookup_touches_the_file(cache: BlobCache) -> None:
    path = filled(cache, b"touched", used=time.time() - 3600)
    cache.lookup(hash_of(b"touched"))
    assert time.time() - os.stat(path).st_atime < 60


def test_only_the_caches_own_files_are_listed(cache: BlobCache,
                                              tmp_path: pathlib.Path) -> None:
    outside = tmp_path / "outside"
    (outside / "ab").mkdir(parents=True)
    (outside / "ab" / "f.blob").write_bytes(b"not ours")
    (outside / "g.blob").write_bytes(b"not ours")
    top = pathlib.Path(cache.directory)
    ours = []
    # Interleaved with what is not a cached file, whatever order the folders list in.
    for i in range(6):
        data = f"content {i}".encode()
        ours.append((filled(cache, data), len(data)))
        folder = pathlib.Path(ours[-1][0]).parent
        (folder / f".junk{i}.part").write_bytes(b"half")
        (folder / f"notes{i}.txt").write_bytes(b"x")
        (folder / f"link{i}.blob").symlink_to(outside / "g.blob")
        (folder.parent / f"file{i}").write_bytes(b"a file where folders are")
        (folder.parent / f"l{i}").symlink_to(outside / "ab")
        (top / f"tmp{i}").mkdir()
        (top / f"tmp{i}" / "ab").mkdir()
        (top / f"{i}z").symlink_to(outside)
        (top / f"z{i}").write_bytes(b"a file at the top")
    listed = sorted((path, size) for path, size, _ in cache._files())
    assert listed == sorted(ours)


# -- pruning -------------------------------------------------------------------------------
def test_a_prune_removes_the_least_recently_used_down_to_nine_tenths(
        cache: BlobCache) -> None:
    now = time.time()
    paths = earlier(cache, [bytes([i]) * KB for i in range(10)],
                    [now - 1000 + i for i in range(10)])
    assert cache.prune() == 6             # 10 KB -> 4 KB, under 4.5 KB
    assert [os.path.exists(p) for p in paths] == [False] * 6 + [True] * 4
    assert cache._estimate == 4 * KB
    assert cache.pruned_files == 6
    assert cache.prune() == 0             # under the limit: nothing
    assert cache.pruned_files == 6
    assert not [name for name in files_in(cache.directory) if ".prune" in name]


def test_a_prune_keeps_files_used_within_a_minute(cache: BlobCache) -> None:
    now = time.time()
    recent, newest, *old = earlier(
        cache, [b"r" * KB, b"n" * KB] + [bytes([i]) * KB for i in range(6)],
        [now - 30, now - 100] + [now - 1000 + i for i in range(6)])
    # 8 KB -> 4 KB: the four oldest; `recent`, the second oldest of all, stays.
    assert cache.prune() == 4
    assert os.path.exists(recent) and os.path.exists(newest)
    assert [os.path.exists(p) for p in old] == [False] * 4 + [True] * 2
    # All used just now: over the limit, and nothing is removed.
    for path in files_in(cache.directory):
        os.utime(os.path.join(cache.directory, path))
    filled(cache, b"m" * KB)
    filled(cache, b"o" * KB)
    cache.wait()
    assert cache.prune() == 0
    assert len(files_in(cache.directory)) == 6


def test_a_file_used_while_it_is_pruned_stays(cache: BlobCache) -> None:
    (path,) = earlier(cache, [b"in use"], [time.time() - 1000])
    assert cache._remove_unused(path)
    assert not os.path.exists(path)
    assert not cache._remove_unused(path)      # gone already
    (path,) = earlier(cache, [b"in use"], [time.time()])   # used after the listing
    assert not cache._remove_unused(path)
    assert pathlib.Path(path).read_bytes() == b"in use"
    assert files_in(cache.directory) == [os.path.relpath(path, cache.directory)]


def test_the_first_file_added_measures_the_cache(cache: BlobCache) -> None:
    # Another process (or this one before a restart) filled the cache past its limit.
    now = time.time()
    old = earlier(cache, [bytes([i]) * KB for i in range(8)],
                  [now - 1000 + i for i in range(8)])
    started: list[threading.Thread] = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        started.append(thread)
        real_start(thread)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threading.Thread, "start", start)
        filled(cache, b"new" * 100)                   # 300 bytes: far under the limit
        cache.wait()
    (pruner,) = started
    assert pruner.name == "zodbsql-blob-prune" and pruner.daemon
    assert [os.path.exists(p) for p in old] == [False] * 4 + [True] * 4
    assert cache._estimate == 4 * KB + 300
    assert cache.pruned_files == 4


def test_a_prune_starts_past_the_limit_and_not_at_it(cache: BlobCache) -> None:
    now = time.time()
    filled(cache, b"a" * KB, used=now - 900)          # the first: measured, 1 KB
    cache.wait()
    assert cache._estimate == KB
    first = cache._pruner
    for i in range(4):                                # 5 KB: at the limit
        filled(cache, bytes([i]) * KB, used=now - 800 + i)
    assert cache._pruner is first
    assert cache._estimate == 5 * KB
    filled(cache, b"b", used=now - 100)               # one byte past it
    assert cache._pruner is not first
    cache.wait()
    assert cache.pruned_files == 1
    assert cache._estimate == 4 * KB + 1
    filled(cache, b"c" * KB, used=now - 50)          # past it again: another prune
    cache.wait()
    assert cache.pruned_files == 2


def test_wait_returns_when_the_prune_is_done(cache: BlobCache) -> None:
    cache.wait()                       # nothing running
    release = threading.Event()
    real_prune = cache.prune

    def slow_prune() -> int:
        release.wait(10)
        return real_prune()
    cache.prune = slow_prune           # type: ignore[method-assign]
    filled(cache, b"w")
    threading.Timer(0.2, release.set).start()
    cache.wait()
    assert release.is_set() and cache._pruner is not None and not cache._pruner.is_alive()


# -- the memo of revisions' content hashes --------------------------------------------------
def test_the_memo_keeps_the_most_recently_used() -> None:
    memo = RevisionHashes(size=2)
    memo.put(1, 10, b"a")
    memo.put(2, 10, b"b")
    assert memo.get(1, 10) == b"a"      # now the most recent
    memo.put(3, 10, b"c")
    assert (memo.get(1, 10), memo.get(2, 10), memo.get(3, 10)) == (b"a", None, b"c")
    assert memo.get(1, 11) is None
    memo.clear()
    assert memo.get(1, 10) is None
    assert RevisionHashes().size == 10000


# -- the shared directory ----------------------------------------------------------------
@pytest.fixture
def shared(storage_factory: Any, tmp_path: pathlib.Path) -> Any:
    return storage_factory.open(blob_dir=str(tmp_path / "shared"), shared_blob_dir=True)


def staged(files: Any, data: bytes) -> str:
    path = files.staging.new_file()
    pathlib.Path(path).write_bytes(data)
    return path


def test_a_revision_file_is_placed_linked_or_moved(shared: Any) -> None:
    files = shared.shared.blob_files
    files.place(5, 100, staged(files, b"first"), None)
    assert pathlib.Path(files.revision_path(5, 100)).read_bytes() == b"first"
    # The same content again: a link to the first file.
    files.place(6, 101, staged(files, b"first"), (5, 100))
    assert os.path.samefile(files.revision_path(6, 101), files.revision_path(5, 100))
    # Its file gone (collected): the staged file itself.
    os.remove(files.revision_path(6, 101))
    files.place(7, 102, staged(files, b"again"), (6, 101))
    assert pathlib.Path(files.revision_path(7, 102)).read_bytes() == b"again"
    assert not os.stat(files.revision_path(7, 102)).st_mode & 0o222
    assert os.listdir(files.temp_dir) == []
    assert files.load_shared(7, 102) == files.revision_path(7, 102)
    with pytest.raises(POSKeyError) as caught:
        files.load_shared(7, 103)
    assert caught.value.args == (f"No blob file at {files.revision_path(7, 103)}",
                                 p64(7), p64(103))


def test_an_undone_revision_links_or_copies_the_file(shared: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    files = shared.shared.blob_files
    files.place(5, 100, staged(files, b"undone"), None)
    files.link_revision(5, 100, 110)
    assert os.path.samefile(files.revision_path(5, 110), files.revision_path(5, 100))
    files.link_revision(5, 105, 111)       # that revision had no blob: nor has this one
    assert not os.path.exists(files.revision_path(5, 111))

    def no_links(source: str, target: str) -> None:
        raise OSError("hard links are not supported here")
    monkeypatch.setattr(os, "link", no_links)
    files.link_revision(5, 100, 112)
    copied = files.revision_path(5, 112)
    assert pathlib.Path(copied).read_bytes() == b"undone"
    assert not os.path.samefile(copied, files.revision_path(5, 100))
    assert not os.stat(copied).st_mode & 0o222
    assert sorted(os.listdir(os.path.dirname(copied))) == sorted(
        os.path.basename(files.revision_path(5, tid)) for tid in (100, 110, 112))


def test_collecting_removes_what_no_reference_names(shared: Any) -> None:
    files = shared.shared.blob_files
    blobs = shared.shared.backend.blobs
    # Real references: none here, so every revision file up to last_tid is unnamed.
    for oid in range(1, 6):
        files.place(oid, 100, staged(files, b"v%d" % oid), None)
    for top in range(1, 9):     # empty chains of folders beside tmp, whatever the order
        files.place(top << 56, 100, staged(files, b"top %d" % top), None)
    files.place(1, 0, staged(files, b"at tid 0"), None)
    files.place(2, 200, staged(files, b"at last_tid"), None)
    files.place(3, 201, staged(files, b"being committed"), None)
    oid_folder = os.path.dirname(files.revision_path(4, 100))
    pathlib.Path(oid_folder, "0x10000000000000000.blob").write_bytes(b"tid past 64 bits")
    pathlib.Path(oid_folder, "notes.blob").write_bytes(b"not a tid")
    pathlib.Path(oid_folder, "readme.txt").write_bytes(b"not a blob")
    conn = shared.backend.connect()
    try:
        assert files.collect_files(conn, blobs, 200, batch=2) == 15
    finally:
        conn.close()
    assert os.path.exists(files.revision_path(3, 201))
    assert sorted(os.listdir(oid_folder)) == [
        "0x10000000000000000.blob", "notes.blob", "readme.txt"]
    # Emptied folders are gone, up to the top; the tmp folder and the top stay.
    kept = {files.directory, files.temp_dir}
    for oid in (3, 4):
        folder = os.path.dirname(files.revision_path(oid, 100))
        while folder != files.directory:
            kept.add(folder)
            folder = os.path.dirname(folder)
    assert {top for top, _, _ in os.walk(files.directory)} == kept


def test_collecting_keeps_what_a_reference_names(storage_factory: Any,
                                                 tmp_path: pathlib.Path) -> None:
    import transaction
    import ZODB
    from ZODB.blob import Blob
    storage = storage_factory.open(blob_dir=str(tmp_path / "shared"), shared_blob_dir=True)
    db = ZODB.DB(storage)
    try:
        conn = db.open()
        for i in range(5):
            conn.root()[i] = Blob(b"kept %d" % i)
        transaction.commit()
        files = storage.shared.blob_files
        before = files_in(files.directory)
        raw = storage.backend.connect()
        try:
            assert files.collect_files(raw, storage.shared.backend.blobs,
                                       u64(storage.lastTransaction()), batch=2) == 0
        finally:
            raw.close()
        assert files_in(files.directory) == before
        assert len([name for name in before if name.endswith(".blob")]) == 5
    finally:
        db.close()


def test_a_shared_directory_of_another_layout_is_refused(storage_factory: Any,
                                                         tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "lawn"
    folder.mkdir()
    (folder / ".layout").write_text("lawn")
    with pytest.raises(ValueError, match="lawn"):
        storage_factory.open(blob_dir=str(folder), shared_blob_dir=True)


def test_a_file_touched_after_the_listing_is_kept_and_the_next_pruned(
        cache: BlobCache) -> None:
    now = time.time()
    paths = earlier(cache, [bytes([i]) * KB for i in range(8)],
                    [now - 1000 + i for i in range(8)])
    listing = cache._files

    def listed_then_used() -> Any:
        files = list(listing())
        os.utime(paths[0])            # a reader opens the oldest file meanwhile
        return iter(files)
    cache._files = listed_then_used    # type: ignore[method-assign]
    assert cache.prune() == 4          # 8 KB -> 4 KB without the oldest
    assert [os.path.exists(p) for p in paths] == [True] + [False] * 4 + [True] * 3


def test_a_file_downloaded_again_while_pruned_is_the_one_kept(
        cache: BlobCache, monkeypatch: pytest.MonkeyPatch) -> None:
    (path,) = earlier(cache, [b"again"], [time.time()])
    rename = os.rename

    def renamed_then_downloaded(source: str, target: str) -> None:
        rename(source, target)
        pathlib.Path(source).write_bytes(b"again")     # another process's download
    monkeypatch.setattr(os, "rename", renamed_then_downloaded)
    assert not cache._remove_unused(path)
    assert pathlib.Path(path).read_bytes() == b"again"
    assert files_in(cache.directory) == [os.path.relpath(path, cache.directory)]


def test_a_prune_another_process_runs_is_left_to_it(cache: BlobCache) -> None:
    import fcntl
    paths = earlier(cache, [bytes([i]) * KB for i in range(8)],
                    [time.time() - 1000 + i for i in range(8)])
    lock = os.path.join(cache.directory, ".prune.lock")
    assert os.stat(lock).st_mode & 0o777 == 0o600   # made by the other's first prune
    with open(lock, "w") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert cache.prune() == 0
        assert all(os.path.exists(p) for p in paths)
    assert cache.prune() == 4


def test_a_prune_that_fails_says_so(cache: BlobCache, caplog: pytest.LogCaptureFixture,
                                    tmp_path: pathlib.Path) -> None:
    def unreadable() -> Any:
        raise OSError("the disk went away")
    cache._files = unreadable           # type: ignore[method-assign]
    with caplog.at_level("ERROR", logger="zodbsql.storage.blobs"):
        assert cache.prune() == 0
    (record,) = caplog.records
    assert record.getMessage() == f"pruning the blob cache {cache.directory} failed"
    assert "the disk went away" in caplog.text           # with its traceback
    caplog.clear()
    lock = os.path.join(cache.directory, ".prune.lock")
    os.remove(lock)                     # the prune's own, replaced by a planted link
    os.symlink(tmp_path / "elsewhere", lock)
    with caplog.at_level("WARNING", logger="zodbsql.storage.blobs"):
        assert cache.prune() == 0
    assert [r.getMessage() for r in caplog.records] == [
        f"not pruning the blob cache {cache.directory}: {lock} is a symbolic link;"
        " remove it"]
    assert not (tmp_path / "elsewhere").exists()


def test_collecting_skips_an_object_folder_removed_meanwhile(
        shared: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    files = shared.shared.blob_files
    for oid in (1, 2, 3):
        files.place(oid, 100, staged(files, b"v%d" % oid), None)
    listed = list(files.fshelper.listOIDs())
    gone = (p64(9), os.path.join(files.directory, "removed-by-another-pack"))
    monkeypatch.setattr(files.fshelper, "listOIDs", lambda: iter([gone] + listed))
    conn = shared.backend.connect()
    try:
        assert files.collect_files(conn, shared.shared.backend.blobs, 200) == 3
    finally:
        conn.close()


def test_collecting_removes_empty_folders_left_before_it_opened(
        storage_factory: Any, tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "shared"
    (folder / "0x0a" / "0x00").mkdir(parents=True)     # a crash's leftovers
    (folder / "0x0b").mkdir()
    storage = storage_factory.open(blob_dir=str(folder), shared_blob_dir=True)
    files = storage.shared.blob_files
    conn = storage.backend.connect()
    try:
        assert files.collect_files(conn, storage.shared.backend.blobs, 200) == 0
    finally:
        conn.close()
    assert {top for top, _, _ in os.walk(files.directory)} == {files.directory,
                                                                files.temp_dir}
