"""The storage's settings: one typed, immutable object, built from ZConfig, a URL or Python.

Every setting is declared once, as a dataclass field made by :func:`setting`: its
default, what it means (``doc``) and its ZConfig datatype.  The keyword arguments of
``open_storage`` are the dataclass's own; the URL query parser (:func:`from_query`) and
the ZConfig datatypes (:func:`from_section`) read the fields, so a new setting is one
new field here (or in a backend's options class), its line in ``component.xml`` and
the README.  ``tests/test_options.py`` checks that ZConfig's schema, the URL parser and
the dataclasses agree.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar
from urllib.parse import SplitResult

from zodbsql.errors import ConfigurationError

if TYPE_CHECKING:
    from zodbsql.backends.base.adapter import Backend

BOOLEANS = {"true": True, "yes": True, "on": True, "1": True,
            "false": False, "no": False, "off": False, "0": False}

T = TypeVar("T")


def setting(default: Any = dataclasses.MISSING, *, doc: str, zconfig: str | None = None,
            in_query: bool = True, required: bool = False, repr: bool = True) -> Any:
    """Declare a setting: a dataclass field with its ``doc`` and ZConfig datatype
    (``zconfig``; by default the one of its Python type, see :func:`zconfig_datatype`).

    ``in_query`` False: a URL gives it in its location (host, path), not as a query
    parameter.  A setting without a default is required (in ZConfig too), and so is one
    declared ``required`` whose default only stands for "not given" (refused by the
    class's checks).
    """
    metadata = {"doc": doc, "zconfig": zconfig, "in_query": in_query,
                "required": required or default is dataclasses.MISSING}
    return dataclasses.field(default=default, repr=repr, metadata=metadata)


def settings(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """The declared settings of an options class, in declaration order."""
    return dataclasses.fields(cls)


def zconfig_key(field: dataclasses.Field[Any]) -> str:
    """The setting's name in ZConfig and the README: ``keep-history``."""
    return field.name.replace("_", "-")


#: The ZConfig datatype of a setting that names none, by its Python type.
ZCONFIG_DATATYPES = {bool: "boolean", int: "integer", float: "float", str: "string"}


def zconfig_datatype(cls: type, field: dataclasses.Field[Any]) -> str:
    """The name of the ZConfig datatype that reads a setting (``component.xml``)."""
    return field.metadata["zconfig"] or ZCONFIG_DATATYPES[value_type(cls, field.name)]


@functools.cache
def value_type(cls: type, name: str) -> type:
    """The Python type a setting's value has (``float`` for ``float | None``)."""
    hint = typing.get_type_hints(cls)[name]
    if isinstance(hint, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return typing.cast(type, hint)


def convert(cls: type, name: str, text: str) -> Any:
    """A URL query value as the setting's type; the error names the setting."""
    kind = value_type(cls, name)
    if kind is bool:
        try:
            return BOOLEANS[text.lower()]
        except KeyError:
            raise ConfigurationError(f"{name} must be true or false, got {text!r}") from None
    try:
        return kind(text)
    except ValueError:
        raise ConfigurationError(f"{name} must be a {kind.__name__}, got {text!r}") from None


def query_names(cls: type) -> frozenset[str]:
    """The settings a URL may give as query parameters."""
    return frozenset(f.name for f in settings(cls) if f.metadata["in_query"])


def from_query(cls: type, query: dict[str, str]) -> dict[str, Any]:
    """Keyword arguments of ``cls`` from query parameters it declares."""
    return {name: convert(cls, name, text) for name, text in query.items()}


def from_section(cls: type[T], section: Any) -> T:
    """An options object from a ZConfig section: every declared setting, by its
    attribute name; a key the section leaves unset keeps the dataclass default."""
    values = {f.name: getattr(section, f.name) for f in settings(cls)}
    return cls(**{name: value for name, value in values.items() if value is not None})


@dataclasses.dataclass(frozen=True)
class Options:
    """Settings that the storage core reads; backend settings live in the backend's options."""

    name: str | None = setting(
        None, doc="The storage's name (defaults to where the data is).")
    keep_history: bool = setting(
        True, doc="Keep old revisions for undo, history and loadBefore (history-preserving); "
                  "false stores current states only (history-free).  Fixed when the database "
                  "is created: opening it in the other mode is refused.")
    read_only: bool = setting(
        False, doc="Open read-only; writes raise ReadOnlyError.")
    create_schema: bool = setting(
        True, doc="Create the tables when the database is empty.")
    cache_size_mb: float = setting(
        64.0, doc="Size of the state cache shared by all connections of this storage in the "
                  "process, in MB (0 turns it off); what prefetch and compression take beside "
                  "it counts against it too.")
    cache_compress: str = setting(
        "auto", doc="auto: once the state cache has been full, it keeps the states it holds "
                   "beyond its window compressed (zstd, level 1), so that about twice as many "
                   "small ones fit in cache-size-mb; a cache that holds all it is given pays "
                   "nothing.  zstd: compressed from the start.  Compressed, a hit costs ~1 us "
                   "more and a state entering ~4 us.  off: kept as they are.")
    heap_trim_interval: float = setting(
        60.0, doc="Seconds between two returns of the memory the process freed to the "
                  "system (glibc's malloc_trim, at a transaction start): glibc keeps freed "
                  "memory, which then counts as resident.  0 turns it off; nothing happens "
                  "where the C library has no malloc_trim.")
    cache_persistent_dir: str | None = setting(
        None, doc="A directory where the state cache is saved (at close and every "
                  "cache-persistent-interval seconds) and read back, in the background, after "
                  "a restart; checked against the database before use.  Processes on one host "
                  "may share it.  Unset: the cache starts empty.")
    cache_persistent_interval: float = setting(
        300.0, doc="Seconds between two saves of the state cache to cache-persistent-dir.")
    cache_redis_url: str | None = setting(
        None, repr=False,
        doc="A Redis server (redis://host:port/db) that the processes of every host share "
            "as a second-level state cache; keys name the database, the oid and a tid, so "
            "no invalidation is needed.  When Redis is down, loads go to the database.  "
            "Needs the redis extra.")
    cache_redis_prefix: str = setting(
        "zodbsql:", doc="What every key this storage writes to Redis starts with.")
    prefetch_count: int = setting(
        1000, doc="At most this many states come along with a load that misses the cache: "
                  "those its object refers to, then the next of the references found before "
                  "(a container's next children).  The process lowers it while what it "
                  "prefetches goes unused; 0 turns prefetch off.")
    prefetch_bytes: int = setting(
        1 << 20, zconfig="byte-size",
        doc="At most this many bytes of states come along with one load, and no more than "
            "the state cache's window holds, where they wait for their loads; also what an "
            "open ZODB connection holds of them until its loads ask (0 turns prefetch off).  "
            "On SQLite no state larger than a 16th of it comes along: it waits for its own "
            "load.")
    poll_changes_limit: int = setting(
        100_000, doc="At most this many changes a transaction start reads (revisions: an "
                     "object written twice counts twice); past it "
                     "(another process imported or rewrote more) it takes everything as "
                     "changed: ZODB's connection drops its objects and the state cache "
                     "starts afresh, rather than the process reading a list that costs "
                     "memory and time for objects it mostly never held.  0: no limit.")
    commit_lock_timeout: float = setting(
        30.0, doc="Seconds a commit waits for the commit lock before it fails with a retryable "
                  "error (CommitLockTimeout).")
    row_lock_timeout: float | None = setting(
        None, doc="Seconds a commit waits for the row locks of the objects it changes "
                  "(PostgreSQL, MySQL); defaults to commit-lock-timeout.")
    pack_gc: bool = setting(
        True, doc="false: pack removes old revisions only, never unreachable objects (for "
                  "sites that collect garbage outside the storage, with deleteObject).")
    pack_batch_size: int = setting(
        1000, doc="Objects one pack step deletes while holding the commit lock.")
    pack_duty_cycle: float = setting(
        1.0, doc="Fraction of time a pack works; 0.5 sleeps as long as it works, so writers "
                 "are held up less.")
    blob_dir: str | None = setting(
        None, zconfig="existing-dirpath",
        doc="Turns on blob support.  With shared-blob-dir false: a local cache of blob files "
            "whose data lives in the database (several processes may share it).  With "
            "shared-blob-dir true: the directory every client shares that holds the blob files "
            "themselves.")
    shared_blob_dir: bool = setting(
        False, doc="true: blob-dir holds the blob files (every client must see the same "
                   "directory); false: blob data is stored in the database, blob-dir is a "
                   "cache.")
    blob_cache_size: int = setting(
        1 << 30, zconfig="byte-size",
        doc="Upper bound of the blob cache in blob-dir (database layout); least recently used "
            "files are removed above it.")
    blob_chunk_size: int = setting(
        1 << 20, zconfig="byte-size",
        doc="Blob data is written to and read from the database in pieces of this size "
            "(database layout).")
    sql_trace: bool = setting(
        False, doc="true: log every SQL statement, with its duration and the ZODB transaction "
                   "it belongs to, to the zodbsql.sql logger at DEBUG.")
    slow_statement: float | None = setting(
        None, doc="Seconds: log the statements that take longer, at WARNING, to the "
                  "zodbsql.sql logger (off when not set).")
    metrics: bool = setting(
        False, doc="true: report loads, commits, conflicts, durations, cache and pool figures "
                   "to prometheus_client's default registry, labelled with the storage's name "
                   "(needs the metrics extra).")
    metrics_port: int | None = setting(
        None, zconfig="port-number",
        doc="With metrics: serve the registry over HTTP on this port of 127.0.0.1 (once per "
            "process), for Prometheus to scrape.")
    slow_statement_explain: bool = setting(
        False, doc="true: a slow statement's log line carries the server's plan (EXPLAIN; "
                   "EXPLAIN QUERY PLAN on SQLite).")

    compress: str = setting(
        "off", doc="zstd: states of compress-threshold bytes or more are stored compressed "
                   "with zstd when that makes them smaller (needs the atrest extra); off: "
                   "stored as they are.  Records of either kind are read alike.")
    compress_level: int = setting(
        3, doc="zstd's compression level (1 fastest to 22 smallest).")
    compress_threshold: int = setting(
        256, doc="States smaller than this many bytes are never compressed.")
    compress_dict: str | None = setting(
        None, doc="A zstd dictionary file (zodbsql train-dict) that new records are "
                  "compressed with, then, comma-separated, the dictionaries older "
                  "records were compressed with: a record needs its dictionary to be "
                  "read.")
    key_file: str | None = setting(
        None, doc="A file holding the encryption key (base64 of 16, 24 or 32 bytes) or "
                  "lines id:base64key: records are then stored encrypted with AES-GCM "
                  "(needs the atrest extra).  The key itself never goes in the "
                  "configuration.")
    key_env: str | None = setting(
        None, doc="The name of an environment variable holding the key (or id:base64key "
                  "entries, separated by commas), as key-file.")
    key_id: str | None = setting(
        None, doc="The id of the key new records are encrypted with (a bare key's id; "
                  "default: the only key, named default); records under the other "
                  "configured ids stay readable until zodbsql rekey re-encrypts them.")

    def __post_init__(self) -> None:
        if self.cache_size_mb < 0:
            raise ConfigurationError(f"cache-size-mb must be 0 or more, got {self.cache_size_mb}")
        if self.heap_trim_interval < 0:
            raise ConfigurationError(
                f"heap-trim-interval must be 0 or more seconds, got {self.heap_trim_interval}"
                " (0 turns it off)")
        if self.cache_persistent_interval <= 0:
            raise ConfigurationError(
                "cache-persistent-interval must be a positive number of seconds, got"
                f" {self.cache_persistent_interval}")
        for key, value in (("prefetch-count", self.prefetch_count),
                           ("prefetch-bytes", self.prefetch_bytes),
                           ("poll-changes-limit", self.poll_changes_limit)):
            if value < 0:
                raise ConfigurationError(f"{key} must be 0 or more, got {value} (0 turns it off)")
        if self.commit_lock_timeout <= 0:
            raise ConfigurationError(
                f"commit-lock-timeout must be a positive number of seconds, got {self.commit_lock_timeout}")
        if self.row_lock_timeout is not None and self.row_lock_timeout <= 0:
            raise ConfigurationError(
                f"row-lock-timeout must be a positive number of seconds, got {self.row_lock_timeout}")
        if self.slow_statement is not None and self.slow_statement < 0:
            raise ConfigurationError(
                f"slow-statement must be 0 or more seconds, got {self.slow_statement}")
        if self.pack_batch_size < 1:
            raise ConfigurationError(f"pack-batch-size must be at least 1, got {self.pack_batch_size}")
        if not 0 < self.pack_duty_cycle <= 1:
            raise ConfigurationError(
                f"pack-duty-cycle must be in (0, 1], got {self.pack_duty_cycle}")

        if self.cache_compress not in ("off", "zstd", "auto"):
            raise ConfigurationError(
                f"cache-compress must be off, zstd or auto, got {self.cache_compress!r}")
        if self.compress not in ("off", "zstd"):
            raise ConfigurationError(f"compress must be off or zstd, got {self.compress!r}")
        if not 1 <= self.compress_level <= 22:
            raise ConfigurationError(
                f"compress-level must be 1 to 22, got {self.compress_level}")
        if self.compress_threshold < 0:
            raise ConfigurationError(
                f"compress-threshold must be 0 or more bytes, got {self.compress_threshold}")
        if self.encrypted:
            # These caches keep states on a disk or another server, in clear.
            for cache, where in (("cache-persistent-dir", self.cache_persistent_dir),
                                 ("cache-redis-url", self.cache_redis_url)):
                if where:
                    raise ConfigurationError(
                        f"{cache} would keep states unencrypted; it can't be used with"
                        " key-file or key-env")
        if self.shared_blob_dir and not self.blob_dir:
            raise ConfigurationError("shared-blob-dir is true but no blob-dir is set")
        if self.blob_cache_size < 0:
            raise ConfigurationError(
                f"blob-cache-size must be 0 or more bytes, got {self.blob_cache_size}")
        if self.blob_chunk_size < 1024:
            raise ConfigurationError(
                f"blob-chunk-size must be at least 1024 bytes, got {self.blob_chunk_size}")

    @property
    def encrypted(self) -> bool:
        """Are new records encrypted (a key source is configured)?"""
        return self.key_file is not None or self.key_env is not None

    @property
    def row_lock_wait(self) -> float:
        """The row-lock timeout in force."""
        return self.row_lock_timeout if self.row_lock_timeout is not None else self.commit_lock_timeout

    def replace(self, **changes: object) -> "Options":
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


class BackendOptions:
    """What every backend's options dataclass shares (``SQLiteOptions``, ...).

    A subclass declares its settings with :func:`setting` and says how a URL names the
    database (:meth:`from_url`); the registry (``zodbsql.backends.registry``) knows which
    backend it opens.
    """

    #: True: query parameters that are no setting stay in the URL handed to the driver
    #: (PostgreSQL's DSN: ``sslmode``, ``connect_timeout``, ...); False: they are errors.
    keeps_other_query: ClassVar[bool] = False

    @classmethod
    def from_url(cls, url: SplitResult, query: dict[str, Any],
                 other: list[tuple[str, str]]) -> Self:
        """The options a URL names: ``query`` holds its settings given as query
        parameters, already converted; ``other`` the rest, when ``keeps_other_query``."""
        raise NotImplementedError

    def create_backend(self, keep_history: bool, lock_timeout: float,
                       read_only: bool = False) -> Backend:
        """The backend object (``SQLiteBackend``, ...) these options name."""
        from zodbsql.backends.registry import entry_for_options
        backend_class = entry_for_options(self).backend_class()
        return backend_class(self, keep_history, lock_timeout, read_only)
