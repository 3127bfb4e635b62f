"""The storage's settings: one typed, immutable object, built from ZConfig, a URI or Python."""
from __future__ import annotations

import dataclasses

from zodbsql.errors import ConfigurationError


@dataclasses.dataclass(frozen=True)
class Options:
    """Settings that the storage core reads; backend settings live in the backend's options.

    ``cache_size_mb`` bounds the process-wide cache of object states (0 turns it off).
    ``prefetch_count`` and ``prefetch_bytes`` bound the states a load that misses the
    cache brings along (those its object refers to, and the next of the references found
    before): at most that many states and bytes per statement; the count adapts below it
    to how many are used.  0 turns reference-driven prefetch off.
    ``commit_lock_timeout`` is in seconds: how long a commit waits for the commit lock
    before it fails with :class:`zodbsql.errors.CommitLockTimeout`.
    ``row_lock_timeout`` bounds the wait for the row locks of the objects a commit
    changes (backends with row locks); None means the same as ``commit_lock_timeout``.
    ``pack_gc`` False makes ``pack`` remove old revisions only, never unreachable objects
    (FileStorage's ``pack_gc``; for sites that collect garbage outside, with
    ``deleteObject``).
    ``pack_batch_size`` is how many objects one pack step deletes while holding the lock.

    Blobs: ``blob_dir`` (None: no blob support) is either a local cache of blob files
    whose data lives in the database (``shared_blob_dir`` false, the default), bounded
    by ``blob_cache_size`` bytes, with data moved in ``blob_chunk_size`` pieces; or a
    directory every client shares that holds the blob files themselves
    (``shared_blob_dir`` true).
    """

    name: str | None = None
    keep_history: bool = True
    read_only: bool = False
    create_schema: bool = True
    cache_size_mb: float = 64.0
    prefetch_count: int = 1000
    prefetch_bytes: int = 1 << 20
    commit_lock_timeout: float = 30.0
    row_lock_timeout: float | None = None
    pack_gc: bool = True
    pack_batch_size: int = 1000
    pack_duty_cycle: float = 1.0
    blob_dir: str | None = None
    shared_blob_dir: bool = False
    blob_cache_size: int = 1 << 30
    blob_chunk_size: int = 1 << 20

    def __post_init__(self) -> None:
        if self.cache_size_mb < 0:
            raise ConfigurationError(f"cache-size-mb must be 0 or more, got {self.cache_size_mb}")
        for key, value in (("prefetch-count", self.prefetch_count),
                           ("prefetch-bytes", self.prefetch_bytes)):
            if value < 0:
                raise ConfigurationError(f"{key} must be 0 or more, got {value} (0 turns it off)")
        if self.commit_lock_timeout <= 0:
            raise ConfigurationError(
                f"commit-lock-timeout must be a positive number of seconds, got {self.commit_lock_timeout}")
        if self.row_lock_timeout is not None and self.row_lock_timeout <= 0:
            raise ConfigurationError(
                f"row-lock-timeout must be a positive number of seconds, got {self.row_lock_timeout}")
        if self.pack_batch_size < 1:
            raise ConfigurationError(f"pack-batch-size must be at least 1, got {self.pack_batch_size}")
        if not 0 < self.pack_duty_cycle <= 1:
            raise ConfigurationError(
                f"pack-duty-cycle must be in (0, 1], got {self.pack_duty_cycle}")

        if self.shared_blob_dir and not self.blob_dir:
            raise ConfigurationError("shared-blob-dir is true but no blob-dir is set")
        if self.blob_cache_size < 0:
            raise ConfigurationError(
                f"blob-cache-size must be 0 or more bytes, got {self.blob_cache_size}")
        if self.blob_chunk_size < 1024:
            raise ConfigurationError(
                f"blob-chunk-size must be at least 1024 bytes, got {self.blob_chunk_size}")

    @property
    def row_lock_wait(self) -> float:
        """The row-lock timeout in force."""
        return self.row_lock_timeout if self.row_lock_timeout is not None else self.commit_lock_timeout

    def replace(self, **changes: object) -> "Options":
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
