"""heap-trim-interval: the memory the process freed goes back to the system, once per
interval, from a transaction start."""
from __future__ import annotations

import platform
import time
from typing import Any

import pytest
import transaction
import ZODB

from zodbsql.errors import ConfigurationError
from zodbsql.options import Options
from zodbsql.storage import heap


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The trims asked for (the C library's function replaced by a recorder)."""
    made: list[int] = []

    def trim(pad: int) -> int:
        made.append(pad)
        return 1
    monkeypatch.setattr(heap, "_trim", trim)
    return made


def test_one_trim_per_interval_and_none_when_off(calls: list[int],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_last", time.monotonic())
    assert heap.maybe_trim(60) is None                    # not an interval yet
    monkeypatch.setattr(heap, "_last", time.monotonic() - 61)
    assert heap.maybe_trim(0) is None                     # 0: off
    thread = heap.maybe_trim(60)
    assert thread is not None
    assert thread.name == "zodbsql-heap-trim" and thread.daemon   # never holds up exit
    thread.join()
    assert calls == [0]
    assert heap.maybe_trim(60) is None                    # the next one waits again
    assert calls == [0]
    monkeypatch.setattr(heap, "_last", time.monotonic() - 1)
    thread = heap.maybe_trim(0.5)                         # any positive interval
    assert thread is not None
    thread.join()
    assert calls == [0, 0]


def test_a_transaction_start_asks_with_the_storage_setting(
        storage_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[float] = []
    monkeypatch.setattr(heap, "maybe_trim", lambda interval: asked.append(interval))
    db = ZODB.DB(storage_factory.open(heap_trim_interval=7.5))
    try:
        tm = transaction.TransactionManager(explicit=True)
        conn = db.open(tm)
        asked.clear()
        with tm:
            conn.root()["x"] = 1
        tm.begin()
        tm.abort()
        conn.close()
        assert asked and set(asked) == {7.5}
    finally:
        db.close()


def test_a_negative_interval_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="heap-trim-interval"):
        Options(heap_trim_interval=-1)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_memory_goes_back_to_the_system(monkeypatch: pytest.MonkeyPatch) -> None:
    """glibc's own function, for real: 190 MB of 16 KB blocks, three in four freed
    (free chunks between live ones, which glibc keeps resident), then one trim."""
    found = heap._find_trim()
    assert found is not None
    monkeypatch.setattr(heap, "_trim", found)
    blocks = [bytes(16_000) + bytes([i % 256]) for i in range(12_000)]
    kept = blocks[::4]
    del blocks
    before = resident_mb()
    monkeypatch.setattr(heap, "_last", time.monotonic() - 10)
    thread = heap.maybe_trim(5)
    assert thread is not None
    thread.join()
    assert before - resident_mb() > 100, (before, resident_mb())
    assert len(kept) == 3_000
