"""Metrics of a running storage, through prometheus_client (the ``metrics`` extra).

Off by default, and then free: the storage holds ``None`` and checks it once per
load, poll or commit.  With ``metrics true`` every storage of the process reports into
prometheus_client's default registry, its series labelled ``storage`` with the
storage's name, so several databases in one process stay apart and whatever already
exports that registry (a WSGI app, ``metrics-port``) exports them too.

What is counted: loads by where they were served from (``cache``: the process's state
cache; ``prefetch``: a cache hit on a state a prefetch brought; ``redis``: the shared
second level; ``database``), bytes read and written, commits, conflicts by kind (raised:
``conflict``, ``read_conflict``, ``lock_timeout``, ``deadlock``; and ``resolved``),
vote and finish durations, polls and the invalidations they brought; and, read when
scraped, the state cache's size, entries, hits and misses, the committing connections
in use, and the phase and progress of a running pack.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from zodbsql.backends.base.connections import ConnectionPool
from zodbsql.cache.statecache import StateCache
from zodbsql.errors import ConfigurationError

PREFIX = "zodbsql_"
#: Vote and finish last milliseconds to seconds.
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0)

_lock = threading.Lock()
_families: dict[str, Any] = {}
_servers: dict[int, Any] = {}


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            "metrics need prometheus_client: pip install 'zodbsql[metrics]'") from None
    return prometheus_client


def families() -> dict[str, Any]:
    """The metric families, made once per process in the default registry."""
    with _lock:
        if _families:
            return _families
        client = _client()
        counter, gauge, histogram = client.Counter, client.Gauge, client.Histogram
        made = {
            "loads": counter(PREFIX + "loads", "Object loads, by where they were served from",
                             ["storage", "source"]),
            "read_bytes": counter(PREFIX + "read_bytes", "Bytes of states read from the"
                                  " database (loads and prefetch)", ["storage"]),
            "commits": counter(PREFIX + "commits", "Transactions committed", ["storage"]),
            "written_bytes": counter(PREFIX + "written_bytes", "Bytes of states committed",
                                     ["storage"]),
            "conflicts": counter(PREFIX + "conflicts", "Conflicts raised (by kind) and"
                                 " resolved", ["storage", "kind"]),
            "vote_seconds": histogram(PREFIX + "vote_seconds", "Seconds in tpc_vote",
                                      ["storage"], buckets=DURATION_BUCKETS),
            "finish_seconds": histogram(PREFIX + "finish_seconds", "Seconds in tpc_finish",
                                        ["storage"], buckets=DURATION_BUCKETS),
            "polls": counter(PREFIX + "polls", "Polls for changes (transaction starts)",
                             ["storage"]),
            "invalidations": counter(PREFIX + "invalidations", "Objects polls found changed"
                                     " by others", ["storage"]),
            "cache_bytes": gauge(PREFIX + "cache_bytes", "State cache: bytes held",
                                 ["storage"]),
            "cache_limit_bytes": gauge(PREFIX + "cache_limit_bytes", "State cache: its bound"
                                       " (cache-size-mb)", ["storage"]),
            "cache_entries": gauge(PREFIX + "cache_entries", "State cache: states held",
                                   ["storage"]),
            "cache_hits": gauge(PREFIX + "cache_hits", "State cache: hits so far",
                                ["storage"]),
            "cache_misses": gauge(PREFIX + "cache_misses", "State cache: misses so far",
                                  ["storage"]),
            "pool_in_use": gauge(PREFIX + "pool_in_use", "Committing connections in use",
                                 ["storage"]),
            "pack_done": gauge(PREFIX + "pack_done", "A running pack's progress in its"
                               " phase (objects or batches done)", ["storage", "phase"]),
        }
        _families.update(made)
        return _families


def serve(port: int, address: str = "127.0.0.1") -> None:
    """Serve the default registry over HTTP at ``address:port`` (once per port)."""
    with _lock:
        if port in _servers:
            return
        _servers[port] = _client().start_http_server(port, addr=address)


class StorageMetrics:
    """One storage's series."""

    def __init__(self, name: str, cache: StateCache, pool: ConnectionPool) -> None:
        self.name = name
        found = families()
        labels: Callable[[str], Any] = lambda key: found[key].labels(name)  # noqa: E731
        self._loads = {source: found["loads"].labels(name, source)
                       for source in ("cache", "prefetch", "redis", "database")}
        self._read_bytes = labels("read_bytes")
        self._commits = labels("commits")
        self._written = labels("written_bytes")
        self._vote = labels("vote_seconds")
        self._finish = labels("finish_seconds")
        self._polls = labels("polls")
        self._invalidations = labels("invalidations")
        self._conflicts = found["conflicts"]
        self._pack = found["pack_done"]
        self._callbacks = {
            "cache_bytes": lambda: cache.bytes_used,
            "cache_limit_bytes": lambda: cache.limit,
            "cache_entries": lambda: len(cache),
            "cache_hits": lambda: cache.hits,
            "cache_misses": lambda: cache.misses,
            "pool_in_use": lambda: pool.in_use,
        }
        for key, read in self._callbacks.items():
            found[key].labels(name).set_function(read)

    def loaded(self, source: str, size: int = 0) -> None:
        self._loads[source].inc()
        if size:
            self._read_bytes.inc(size)

    def read(self, size: int) -> None:
        """States a prefetch brought (counted as bytes read, not as loads)."""
        self._read_bytes.inc(size)

    def voted(self, seconds: float) -> None:
        self._vote.observe(seconds)

    def committed(self, seconds: float, size: int) -> None:
        self._finish.observe(seconds)
        self._commits.inc()
        self._written.inc(size)

    def conflict(self, kind: str) -> None:
        self._conflicts.labels(self.name, kind).inc()

    def polled(self, invalidations: int) -> None:
        self._polls.inc()
        if invalidations:
            self._invalidations.inc(invalidations)

    def pack_progress(self, phase: str, done: int) -> None:
        self._pack.labels(self.name, phase).set(done)

    def snapshot(self) -> dict[str, float]:
        """This storage's counters now, by short name (``loads_cache``,
        ``conflicts_resolved``, ``commits``...): what ``zodbsql bench`` records."""
        found: dict[str, float] = {}
        for metric in families().values():
            for sample in metric.collect()[0].samples:
                labels = sample.labels
                if labels.get("storage") != self.name or not sample.name.endswith(
                        ("_total", "_hits", "_misses")):
                    continue
                key = sample.name[len(PREFIX):].removesuffix("_total")
                for extra in ("source", "kind"):
                    if extra in labels:
                        key += "_" + labels[extra]
                found[key] = found.get(key, 0.0) + sample.value
        return found

    def close(self) -> None:
        """Stop reading this storage's cache and pool (its counters stay, as counters do)."""
        found = families()
        for key in self._callbacks:
            try:
                found[key].remove(self.name)
            except KeyError:
                pass


def conflict_kind(error: BaseException) -> str:
    """The ``kind`` label of a conflict raised from vote or finish."""
    from ZODB.POSException import ReadConflictError
    from zodbsql.errors import CommitLockTimeout, DatabaseConflict
    if isinstance(error, CommitLockTimeout):
        return "lock_timeout"
    if isinstance(error, DatabaseConflict):
        return "deadlock"
    if isinstance(error, ReadConflictError):
        return "read_conflict"
    return "conflict"
