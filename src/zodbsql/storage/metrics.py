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

The counters are plain integers on a :class:`Counts` per storage name, which one
collector in the registry reads when scraped: a prometheus_client ``Counter`` takes a
lock on every ``inc``, and with one per load a script reading 1,000 objects cold and hot
(PostgreSQL) measured 7-8% slower with metrics on.  (An increment lost to two threads
racing is possible in principle, as with any unlocked Python counter: a lock per load
is a price a monitoring counter need not pay.)  Durations stay prometheus_client histograms:
they come once per commit.
"""
from __future__ import annotations

import threading
from typing import Any

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
#: Every storage name's counts, kept after its storage closes (as counters are); with
#: a lock of its own, as the registry collects them while ``families`` holds ``_lock``.
_counts: dict[str, "Counts"] = {}
_counts_lock = threading.Lock()

#: Where a load was served from (the ``source`` label).
SOURCES = ("cache", "prefetch", "redis", "database")
#: The counters: attribute of :class:`Counts`, and help text.
COUNTERS = {
    "read_bytes": "Bytes of states read from the database (loads and prefetch)",
    "commits": "Transactions committed",
    "written_bytes": "Bytes of states committed",
    "polls": "Polls for changes (transaction starts)",
    "invalidations": "Objects polls found changed by others",
}
LOADS_HELP = "Object loads, by where they were served from"
CONFLICTS_HELP = "Conflicts raised (by kind) and resolved"


class Counts:
    """One storage name's counters, as plain integers."""

    def __init__(self) -> None:
        self.loads = dict.fromkeys(SOURCES, 0)
        self.conflicts: dict[str, int] = {}
        self.read_bytes = 0
        self.commits = 0
        self.written_bytes = 0
        self.polls = 0
        self.invalidations = 0


def counts_for(name: str) -> Counts:
    with _counts_lock:
        found = _counts.get(name)
        if found is None:
            found = _counts[name] = Counts()
        return found


class _CountsCollector:
    """Turns every storage's :class:`Counts` into counter families when scraped."""

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily
        with _counts_lock:
            named = list(_counts.items())
        loads = CounterMetricFamily(PREFIX + "loads", LOADS_HELP, labels=["storage", "source"])
        conflicts = CounterMetricFamily(PREFIX + "conflicts", CONFLICTS_HELP,
                                        labels=["storage", "kind"])
        plain = {key: CounterMetricFamily(PREFIX + key, text, labels=["storage"])
                 for key, text in COUNTERS.items()}
        for name, counts in named:
            for source, count in list(counts.loads.items()):
                loads.add_metric([name, source], count)
            for kind, count in list(counts.conflicts.items()):
                conflicts.add_metric([name, kind], count)
            for key, family in plain.items():
                family.add_metric([name], getattr(counts, key))
        yield loads
        yield conflicts
        yield from plain.values()


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            "metrics need prometheus_client: pip install 'zodbsql[metrics]'") from None
    return prometheus_client


def families() -> dict[str, Any]:
    """The metric families prometheus_client keeps (histograms and gauges), made once
    per process in the default registry with the collector of the counters."""
    with _lock:
        if _families:
            return _families
        client = _client()
        gauge, histogram = client.Gauge, client.Histogram
        made = {
            "vote_seconds": histogram(PREFIX + "vote_seconds", "Seconds in tpc_vote",
                                      ["storage"], buckets=DURATION_BUCKETS),
            "finish_seconds": histogram(PREFIX + "finish_seconds", "Seconds in tpc_finish",
                                        ["storage"], buckets=DURATION_BUCKETS),
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
        client.REGISTRY.register(_CountsCollector())
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
        self.counts = counts = counts_for(name)
        self._loads = counts.loads
        self._vote = found["vote_seconds"].labels(name)
        self._finish = found["finish_seconds"].labels(name)
        self._pack = found["pack_done"]
        self._cache = cache
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
        self._loads[source] += 1
        if size:
            self.counts.read_bytes += size

    def read(self, size: int) -> None:
        """States a prefetch brought (counted as bytes read, not as loads)."""
        self.counts.read_bytes += size

    def voted(self, seconds: float) -> None:
        self._vote.observe(seconds)

    def committed(self, seconds: float, size: int) -> None:
        self._finish.observe(seconds)
        self.counts.commits += 1
        self.counts.written_bytes += size

    def conflict(self, kind: str) -> None:
        conflicts = self.counts.conflicts
        conflicts[kind] = conflicts.get(kind, 0) + 1

    def polled(self, invalidations: int) -> None:
        self.counts.polls += 1
        if invalidations:
            self.counts.invalidations += invalidations

    def pack_progress(self, phase: str, done: int) -> None:
        self._pack.labels(self.name, phase).set(done)

    def snapshot(self) -> dict[str, float]:
        """This storage's counters now, by short name (``loads_cache``,
        ``conflicts_resolved``, ``commits``...) with the state cache's hits and misses:
        what ``zodbsql bench`` records."""
        counts = self.counts
        found: dict[str, float] = {f"loads_{source}": count
                                   for source, count in counts.loads.items()}
        found.update((f"conflicts_{kind}", count) for kind, count in counts.conflicts.items())
        found.update((key, getattr(counts, key)) for key in COUNTERS)
        found["cache_hits"] = self._cache.hits
        found["cache_misses"] = self._cache.misses
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
