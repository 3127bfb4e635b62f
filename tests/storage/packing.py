"""Helpers for pack tests: a pack time between two commits, and what must be gone."""
from __future__ import annotations

import time
from typing import Any, Iterable

import pytest
from ZODB.POSException import POSKeyError
from ZODB.TimeStamp import TimeStamp
from ZODB.utils import p64, u64

from zodbsql.storage.pack import time_to_tid


def time_between(earlier: bytes, later: bytes) -> float:
    """A pack time strictly after tid ``earlier`` and strictly before tid ``later``."""
    t = (TimeStamp(earlier).timeTime() + TimeStamp(later).timeTime()) / 2
    assert u64(earlier) < time_to_tid(t) < u64(later), "commits too close to pack between"
    return t


def pause() -> None:
    """Sleep long enough that the next commit's tid is clearly later than the clock now."""
    time.sleep(0.02)


def assert_gone(storage: Any, oids: Iterable[bytes]) -> None:
    """Every way to read each of ``oids`` says it does not exist."""
    newest = p64(u64(storage.lastTransaction()) + 1)
    for oid in oids:
        with pytest.raises(POSKeyError):
            storage.load(oid)
        with pytest.raises(POSKeyError):
            storage.loadBefore(oid, newest)
        with pytest.raises(POSKeyError):
            storage.history(oid)
