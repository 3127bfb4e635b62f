"""What a worker process holds in memory, read the cheapest way the OS offers."""
from __future__ import annotations

import os
import resource
from typing import Any


def memory(db: Any) -> dict[str, float | None]:
    """This worker process's memory now, its peak so far (MB), and what the storage's
    own cache counts, where it has one (zodbsql's state cache)."""
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * page / 1e6
    except OSError:      # not Linux: the peak only
        rss = None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6
    if rss is not None:     # the kernel updates its high-water mark lazily
        peak = max(peak, rss)
    cache = getattr(getattr(db.storage, "shared", None), "cache", None)
    counted = getattr(cache, "bytes_used", None)
    return {"rss_mb": rss, "peak_rss_mb": peak,
            "cache_mb": counted / 1e6 if counted is not None else None}
