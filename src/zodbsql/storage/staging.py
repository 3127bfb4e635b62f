"""Where commits stage their blob files (``blob_dir/tmp``), and what a killed writer
left there.

Each storage that stages a file holds an exclusive ``flock`` on a lock file of its
own from then on, ``.commit-<token>.lock`` in the blob directory (the staging
directory is also ZODB's temporary directory), and names its staged files
``commit-<token>-*.blob``.  The
kernel drops the lock when the process dies, so a file whose token's lock can be
taken (or is gone) belongs to no live writer and is removed: when a storage opens
the directory and when it packs.  A shared blob directory may be on a network file
system whose locks other machines don't see, so there a file must also be an hour
old.  Files named before tokens existed are removed after a day.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import tempfile
import threading
import time

from zodbsql.errors import described
from zodbsql.storage.privatedir import NOFOLLOW

log = logging.getLogger(__name__)

PREFIX = "commit-"
#: A file of a dead writer is removed once it is this old (seconds; shared directory).
SHARED_STALE_AGE = 3600.0
#: A staged file without a token (written by an older zodbsql) is removed at this age.
UNTOKENED_STALE_AGE = 86400.0
_TOKENED = re.compile(r"commit-(?P<token>[0-9a-f]{16})-.*\.blob\Z")
_LOCK = re.compile(r"\.commit-(?P<token>[0-9a-f]{16})\.lock\Z")
_UNTOKENED = re.compile(r"commit-[^-]*\.blob\Z")


class StagingArea:
    """The staging directory as one open storage uses it."""

    def __init__(self, directory: str, lock_dir: str, shared: bool = False) -> None:
        self.directory = directory
        self.lock_dir = lock_dir
        #: On a shared blob directory a dead writer's file must also be old.
        self.shared = shared
        self._pid = os.getpid()
        self._lock = threading.Lock()
        #: Taken with the first staged file (a storage that never writes a blob has none).
        self.token: str | None = None
        self._lock_fd = -1

    def _lock_path(self, token: str) -> str:
        return os.path.join(self.lock_dir, f".{PREFIX}{token}.lock")

    def _take_token(self) -> tuple[str, int]:
        while True:
            token = secrets.token_hex(8)
            fd = os.open(self._lock_path(token), os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW,
                         0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            # A cleaner that locked the file before this process did has removed it.
            if os.fstat(fd).st_nlink:
                return token, fd
            os.close(fd)

    def new_file(self) -> str:
        """A new, empty file for one staged blob."""
        with self._lock:
            if self.token is None:
                self.token, self._lock_fd = self._take_token()
        fd, path = tempfile.mkstemp(dir=self.directory, prefix=f"{PREFIX}{self.token}-",
                                    suffix=".blob")
        os.close(fd)
        return path

    def close(self) -> None:
        with self._lock:
            if self.token is None:
                return
            if os.getpid() == self._pid:  # a forked child shares the lock; not its own
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self._lock_path(self.token))
            os.close(self._lock_fd)
            self.token, self._lock_fd = None, -1

    # -- what dead writers left -------------------------------------------------------------
    def remove_stale(self) -> int:
        """Remove the staged files of writers that are gone; return how many."""
        try:
            names = os.listdir(self.directory)
            locks = os.listdir(self.lock_dir)
        except FileNotFoundError:
            return 0
        removed = 0
        tokens: dict[str, list[str]] = {}
        for name in locks:
            if (match := _LOCK.match(name)) is not None:
                tokens.setdefault(match.group("token"), [])
        for name in names:
            if (match := _TOKENED.match(name)) is not None:
                tokens.setdefault(match.group("token"), []).append(name)
            elif _UNTOKENED.match(name) and self._older_than(name, UNTOKENED_STALE_AGE):
                removed += self._remove(name)
        for token, files in tokens.items():
            if token != self.token:
                removed += self._remove_if_dead(token, files)
        if removed:
            log.info("removed %d blob file(s) that killed commits left in %s", removed,
                     self.directory)
        return removed

    def _older_than(self, name: str, seconds: float) -> bool:
        try:
            # ctime: renaming a blob file into place keeps its (maybe old) mtime.
            return time.time() - os.lstat(os.path.join(self.directory, name)).st_ctime >= seconds
        except FileNotFoundError:
            return False

    def _remove(self, name: str) -> int:
        try:
            os.remove(os.path.join(self.directory, name))
        except FileNotFoundError:
            return 0
        return 1

    def _remove_if_dead(self, token: str, files: list[str]) -> int:
        lock_path = self._lock_path(token)
        try:
            fd = os.open(lock_path, os.O_RDONLY | NOFOLLOW)
        except FileNotFoundError:
            fd = -1  # its storage was closed, or a cleaner found it dead
        except OSError as exc:
            log.warning("cannot check %s: %s", lock_path, described(exc))
            return 0
        try:
            if fd >= 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                        return 0  # a live writer holds it
                    raise
            age = SHARED_STALE_AGE if self.shared else 0.0
            removed = sum(self._remove(name) for name in files if self._older_than(name, age))
            if fd >= 0 and removed == len(files):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(lock_path)
            return removed
        finally:
            if fd >= 0:
                os.close(fd)
