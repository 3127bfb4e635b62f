"""Freed heap memory handed back to the system, once a minute (glibc's ``malloc_trim``).

glibc keeps the memory a process frees for its next allocations.  A storage's churn
of states of every size (a commit's pickles, a prefetch's rows, BTree nodes of up to
17 KB) leaves free chunks between live ones, which stay resident: in an hour-long soak
a worker's RSS kept growing after its state cache was full, and ``malloc_trim(0)``
at the end of a four-minute load gave back 17 of its 120 MB.  ``malloc_trim`` also
releases whole free pages inside the heap (``madvise``), not only its top.

One trim per process per ``heap-trim-interval``, at a transaction start (the first
comes an interval after import); nothing where the C library has no ``malloc_trim``.
"""
from __future__ import annotations

import ctypes
import threading
import time
from typing import Callable


def _find_trim() -> Callable[[int], int] | None:
    """The C library's ``malloc_trim``, or None (musl, macOS, Windows)."""
    try:
        found = getattr(ctypes.CDLL(None), "malloc_trim", None)
    except (OSError, TypeError):     # no C library of the process to open
        return None
    if found is not None:
        found.argtypes = [ctypes.c_size_t]
        found.restype = ctypes.c_int
    return found


_lock = threading.Lock()
_last = time.monotonic()
#: Looked up once, at import (a dlsym).
_trim = _find_trim()


def maybe_trim(interval: float) -> threading.Thread | None:
    """Trim the heap if ``interval`` seconds (> 0) passed since this process last did,
    in a thread of its own (the thread, or None when it is not time).

    A trim walks the heap: 21 ms for a heap of 220 MB here.  ctypes releases the GIL
    for the call, so no transaction start waits for it."""
    global _last
    if interval <= 0:
        return None
    now = time.monotonic()
    if now - _last < interval:
        return None
    with _lock:
        if now - _last < interval:
            return None        # another thread just did
        _last = now
    if _trim is None:
        return None
    thread = threading.Thread(target=_trim, args=(0,), name="zodbsql-heap-trim", daemon=True)
    thread.start()
    return thread
