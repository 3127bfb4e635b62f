"""Blob files: where a commit's blob files wait, where committed ones are found.

Two layouts, chosen by ``shared_blob_dir``:

* Database (default): blob data lives in the database, each distinct content once
  (SHA-256), in chunks.  ``blob_dir`` is a local cache of content-addressed files
  (``blob_dir/ab/cd/<sha256>.blob``), shared safely by several processes: a file
  appears with an atomic rename once complete, and the least recently used files are
  pruned in a background thread when the cache grows past ``blob_cache_size``.
* Shared directory: every client sees ``blob_dir``, which holds one file per revision
  in ZODB's ``bushy`` layout; the database records only each revision's content hash.

Either way files being committed wait in ``blob_dir/tmp``; savepoints also use it
(``temporaryDirectory``).
"""
from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterator

import ZODB.blob
from ZODB.POSException import POSKeyError
from ZODB.utils import p64

from zodbsql.backends.base.contract import BlobsRole, ConnectionRole
from zodbsql.storage.privatedir import NOFOLLOW, make_private_dir, no_links_below, real_dir
from zodbsql.storage.staging import StagingArea

if TYPE_CHECKING:
    from zodbsql.options import Options

log = logging.getLogger(__name__)

#: A cached file used (loaded or opened) this recently is never pruned, so a path
#: ``loadBlob`` returned stays valid at least this long.
KEEP_RECENT_SECONDS = 60.0
#: Pruning removes files until the cache is this fraction of its limit.
PRUNE_TARGET = 0.9
READ_SIZE = 1 << 20


def file_hash(path: str) -> tuple[bytes, int]:
    """SHA-256 and size of a file, read in pieces."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while True:
            data = f.read(READ_SIZE)
            if not data:
                break
            digest.update(data)
            size += len(data)
    return digest.digest(), size


def file_chunks(path: str, chunk_size: int) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while True:
            data = f.read(chunk_size)
            if not data:
                return
            yield data


def remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        ZODB.blob.remove_committed(path)


class BlobCache:
    """Content-addressed blob files in a directory several processes may share."""

    SUFFIX = ".blob"

    def __init__(self, directory: str, limit: int) -> None:
        self.directory = directory
        self.limit = limit
        self.keep_recent = KEEP_RECENT_SECONDS
        self._estimate: int | None = None
        self._lock = threading.Lock()
        self._pruner: threading.Thread | None = None
        self.pruned_files = 0

    def path(self, content_hash: bytes) -> str:
        name = content_hash.hex()
        return os.path.join(self.directory, name[:2], name[2:4], name + self.SUFFIX)

    def lookup(self, content_hash: bytes) -> str | None:
        """The cached file's path (its use time touched), or None on a miss.

        Only a regular file reached through the cache's own directories counts: a
        symbolic link is a miss (and the download replaces it)."""
        path = self.path(content_hash)
        try:
            if not no_links_below(self.directory, path):
                return None
            fd = os.open(path, os.O_RDONLY | NOFOLLOW)
        except OSError:  # missing, or a link planted since
            return None
        try:
            os.utime(fd)
        finally:
            os.close(fd)
        return path

    def _folder(self, path: str) -> str:
        """Make the cache directories of ``path`` (real ones, never through a link)."""
        folder = os.path.dirname(path)
        sub = self.directory
        for name in os.path.relpath(folder, self.directory).split(os.sep):
            sub = os.path.join(sub, name)
            real_dir(sub)
        return folder

    def fill(self, content_hash: bytes, size: int,
             write_to: Callable[[Callable[[bytes], object]], None]) -> str:
        """Write a content into the cache: ``write_to(write)`` passes every piece to
        ``write``; the file appears (atomically) only when complete and verified."""
        path = self.path(content_hash)
        folder = self._folder(path)
        fd, temp = tempfile.mkstemp(dir=folder, prefix=".", suffix=".part")
        try:
            digest = hashlib.sha256()
            written = 0
            with os.fdopen(fd, "wb") as f:
                def write(data: bytes) -> None:
                    nonlocal written
                    digest.update(data)
                    written += len(data)
                    f.write(data)
                write_to(write)
            if digest.digest() != content_hash or written != size:
                raise POSKeyError(
                    f"blob content {content_hash.hex()} read from the database has"
                    f" {written} bytes and another hash (expected {size} bytes)")
            ZODB.blob.set_not_writable(temp)
            os.replace(temp, path)
        except BaseException:
            remove_quietly(temp)
            raise
        self.added(size)
        return path

    def evict(self, content_hash: bytes | None) -> None:
        """Remove one content from the cache (it is downloaded again when loaded)."""
        if content_hash is None:
            return
        path = self.path(content_hash)
        with contextlib.suppress(FileNotFoundError):
            # Removing follows links in the folders (never in the file's own name).
            if no_links_below(self.directory, os.path.dirname(path), is_file=False):
                os.remove(path)

    def install(self, content_hash: bytes, size: int, staged: str) -> None:
        """Move a just committed file (already known to have this hash) into the cache."""
        if self.lookup(content_hash) is not None:
            remove_quietly(staged)
            return
        path = self.path(content_hash)
        self._folder(path)
        ZODB.blob.set_not_writable(staged)
        os.replace(staged, path)
        self.added(size)

    # -- pruning ---------------------------------------------------------------------------
    def added(self, size: int) -> None:
        """Count ``size`` more bytes in the cache; prune in the background when over.

        The first file this instance adds starts a prune whatever the count: the cache
        may be full already (other processes' files, or this one's before a restart),
        and only a prune measures it."""
        with self._lock:
            if self._estimate is None:
                self._estimate = size
                over = True
            else:
                self._estimate += size
                over = self._estimate > self.limit
            if over and (self._pruner is None or not self._pruner.is_alive()):
                self._pruner = threading.Thread(target=self.prune, name="zodbsql-blob-prune",
                                                daemon=True)
                self._pruner.start()

    def wait(self) -> None:
        """Wait for a running prune (tests, close)."""
        pruner = self._pruner
        if pruner is not None:
            pruner.join()

    def _files(self) -> Iterator[tuple[str, int, float]]:
        # Symbolic links are skipped, so pruning never reaches outside the cache.
        for top in os.scandir(self.directory):
            if len(top.name) != 2 or not top.is_dir(follow_symlinks=False):
                continue
            for sub in os.scandir(top.path):
                if not sub.is_dir(follow_symlinks=False):
                    continue
                for entry in os.scandir(sub.path):
                    if (not entry.name.endswith(self.SUFFIX)
                            or not entry.is_file(follow_symlinks=False)):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    yield entry.path, st.st_size, max(st.st_atime, st.st_mtime)

    def _remove_unused(self, path: str) -> bool:
        """Remove a cached file unless it was used within ``keep_recent`` seconds.

        The file is first renamed away (atomic), then its use time is read: a reader
        that touched it before the rename gets it back at once (linked into place
        again), and one that comes after the rename misses and downloads it again.
        """
        hidden = f"{path}.{os.getpid()}.prune"
        try:
            os.rename(path, hidden)
        except FileNotFoundError:
            return False
        st = os.lstat(hidden)
        if time.time() - max(st.st_atime, st.st_mtime) < self.keep_recent:
            with contextlib.suppress(FileExistsError):
                os.link(hidden, path)  # unless it was downloaded again meanwhile
            os.remove(hidden)
            return False
        os.remove(hidden)
        return True

    def prune(self) -> int:
        """Remove least recently used files until the cache fits; one process at a time.
        Returns the number of files removed."""
        lock_path = os.path.join(self.directory, ".prune.lock")
        removed = 0
        try:
            try:
                fd = os.open(lock_path, os.O_WRONLY | os.O_CREAT | NOFOLLOW, 0o600)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                log.warning("not pruning the blob cache %s: %s is a symbolic link; remove"
                            " it", self.directory, lock_path)
                return 0
            with os.fdopen(fd, "w") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                        return 0  # another process is pruning
                    raise
                files = sorted(self._files(), key=lambda f: f[2])
                total = sum(size for _, size, _ in files)
                target = int(self.limit * PRUNE_TARGET)
                now = time.time()
                for path, size, used in files:
                    if total <= target or now - used < self.keep_recent:
                        break   # small enough, or the rest were used more recently
                    if not self._remove_unused(path):
                        continue
                    total -= size
                    removed += 1
                with self._lock:
                    self._estimate = total
        except Exception:
            log.exception("pruning the blob cache %s failed", self.directory)
        self.pruned_files += removed
        return removed


class RevisionHashes:
    """A bounded memo of ``(oid, tid) -> content hash`` (revisions never change), so a
    blob loaded or committed before is found again without a query."""

    def __init__(self, size: int = 10000) -> None:
        self.size = size
        self._map: "collections.OrderedDict[tuple[int, int], bytes]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, oid: int, tid: int) -> bytes | None:
        with self._lock:
            found = self._map.get((oid, tid))
            if found is not None:
                self._map.move_to_end((oid, tid))
            return found

    def clear(self) -> None:
        with self._lock:
            self._map.clear()

    def put(self, oid: int, tid: int, content_hash: bytes) -> None:
        with self._lock:
            self._map[(oid, tid)] = content_hash
            if len(self._map) > self.size:
                self._map.popitem(last=False)


class BlobFiles:
    """The blob directory of one storage (shared by its instances)."""

    def __init__(self, options: "Options") -> None:
        assert options.blob_dir
        self.directory = os.path.abspath(options.blob_dir)
        self.shared = options.shared_blob_dir
        self.chunk_size = options.blob_chunk_size
        self.fshelper: ZODB.blob.FilesystemHelper | None = None
        self.cache: BlobCache | None = None
        if self.shared:
            os.makedirs(self.directory, exist_ok=True)
            self.fshelper = ZODB.blob.FilesystemHelper(self.directory, "bushy")
            self.fshelper.create()
            self.temp_dir: str = self.fshelper.temp_dir
        else:
            make_private_dir(self.directory)
            self.temp_dir = os.path.join(self.directory, "tmp")
            real_dir(self.temp_dir)
            self.cache = BlobCache(self.directory, options.blob_cache_size)
        self.hashes = RevisionHashes()
        self.staging = StagingArea(self.temp_dir, self.directory, self.shared)
        if not options.read_only:
            self.staging.remove_stale()

    def take(self, blobfilename: str) -> str:
        """Move a file handed to storeBlob/restoreBlob into the storage's temp dir."""
        staged = self.staging.new_file()
        ZODB.blob.rename_or_copy_blob(blobfilename, staged, chmod=False)
        return staged

    def close(self) -> None:
        self.staging.close()
        if self.cache is not None:
            # A prune still running would write its lock file into a directory the
            # caller may remove next (a test's teardown, an rmtree after close).
            self.cache.wait()

    # -- shared directory ---------------------------------------------------------------
    def revision_path(self, oid: int, tid: int) -> str:
        assert self.fshelper is not None
        path: str = self.fshelper.getBlobFilename(p64(oid), p64(tid))
        return path

    def place(self, oid: int, tid: int, staged: str, same_as: tuple[int, int] | None) -> None:
        """Put a committed revision's file in place (shared directory), linking to a
        revision with the same content when there is one."""
        assert self.fshelper is not None
        self.fshelper.getPathForOID(p64(oid), create=True)
        target = self.revision_path(oid, tid)
        if same_as is not None:
            existing = self.revision_path(*same_as)
            temp = f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"
            try:
                os.link(existing, temp)
                os.replace(temp, target)
                remove_quietly(staged)
                return
            except OSError:
                remove_quietly(temp)
        ZODB.blob.set_not_writable(staged)
        os.replace(staged, target)

    def link_revision(self, oid: int, from_tid: int, tid: int) -> None:
        """Undo in the shared layout: the new revision's file is the copied revision's."""
        existing = self.revision_path(oid, from_tid)
        if not os.path.exists(existing):
            return  # that revision has no blob
        # The object's folder exists: it holds ``existing``.
        target = self.revision_path(oid, tid)
        temp = f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            os.link(existing, temp)
        except OSError:
            shutil.copyfile(existing, temp)
            ZODB.blob.set_not_writable(temp)
        os.replace(temp, target)

    def load_shared(self, oid: int, tid: int) -> str:
        path = self.revision_path(oid, tid)
        if not os.path.exists(path):
            raise POSKeyError(f"No blob file at {path}", p64(oid), p64(tid))
        return path

    def collect_files(self, conn: ConnectionRole, blobs: BlobsRole, last_tid: int,
                      batch: int = 500) -> int:
        """Remove revision files no ``blob_ref`` row names (packed, deleted, replaced in
        history-free mode, or left by a crash between placing and committing), and empty
        directories.  Files of tids after ``last_tid`` (commits in progress) stay."""
        assert self.fshelper is not None
        removed = 0
        found: dict[int, list[tuple[int, str]]] = {}

        def flush() -> None:
            nonlocal removed
            if not found:
                return
            kept = blobs.revisions_of(conn, list(found))
            for oid, files in found.items():
                for tid, path in files:
                    if tid <= last_tid and (oid, tid) not in kept:
                        remove_quietly(path)
                        removed += 1
            found.clear()

        for oid_bytes, path, tid_bytes in self._revision_files():
            found.setdefault(int.from_bytes(oid_bytes, "big"), []).append(
                (int.from_bytes(tid_bytes, "big"), path))
            if len(found) >= batch:
                flush()
        flush()
        self._remove_empty_dirs()
        return removed

    def _revision_files(self) -> Iterator[tuple[bytes, str, bytes]]:
        assert self.fshelper is not None
        for oid, oid_path in self.fshelper.listOIDs():
            try:
                names = os.listdir(oid_path)
            except FileNotFoundError:
                continue
            for name in names:
                if not name.endswith(ZODB.blob.BLOB_SUFFIX):
                    continue
                try:
                    tid = int(name[:-len(ZODB.blob.BLOB_SUFFIX)], 16)
                except ValueError:
                    continue
                if 0 <= tid < 1 << 64:
                    yield oid, os.path.join(oid_path, name), p64(tid)

    def _remove_empty_dirs(self) -> None:
        temp = os.path.abspath(self.temp_dir)
        for dirpath, _dirnames, _filenames in os.walk(self.directory, topdown=False):
            if dirpath == self.directory or os.path.abspath(dirpath) == temp:
                continue
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)  # only succeeds when empty
