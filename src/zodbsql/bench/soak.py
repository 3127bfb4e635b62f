"""The soak workload: a catalog that keeps growing while it is queried, for a set time.

Worker 0 loads documents into a catalog-like structure (several OOBTree indexes, a
``BTrees.Length``), ten per transaction, as a site's bulk import does; the other
workers query it (the newest documents of a tag, then each document), each query its
own transaction.  Every worker counts what it finished per time slot and samples its
process's memory, so throughput and RSS can be charted over time; the figure that
matters is the last tenth's throughput over the first tenth's (a storage that slows
down as the database grows, or leaks, shows it there).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from BTrees.IOBTree import IOBTree
from BTrees.Length import Length
from BTrees.OOBTree import OOBTree, OOTreeSet
from persistent import Persistent
from persistent.mapping import PersistentMapping

#: Documents each loading transaction adds.
DOCUMENTS_PER_TRANSACTION = 10
#: Tags a document carries, out of TAGS.
TAGS_PER_DOCUMENT = 3
TAGS = 50
#: Documents a query reads (the newest of one tag).
QUERY_SIZE = 20
#: Documents a transaction of ``fill`` adds (before the timed run).
FILL_BATCH = 1_000
#: Time slots a run is divided into (fewer for runs under 30 s: one a second).
SLOTS = 30


class Document(Persistent):
    def __init__(self, number: int, tags: list[str]) -> None:
        self.number = number
        self.title = f"document {number}"
        self.text = f"body of document {number} " * 8
        self.tags = tags


def new_catalog() -> PersistentMapping:
    return PersistentMapping(
        documents=IOBTree(), by_title=OOBTree(), by_tag=OOBTree(), count=Length())


@dataclass
class Series:
    """What one worker finished per time slot, and its memory at the end of each."""

    duration: float
    done: list[int] = field(default_factory=list)
    rss_mb: list[float | None] = field(default_factory=list)

    @property
    def slots(self) -> int:
        return min(SLOTS, max(1, int(self.duration)))

    @property
    def slot_seconds(self) -> float:
        return self.duration / self.slots

    def record(self, elapsed: float, memory: Callable[[], float | None]) -> None:
        # What ends after the deadline (the work under way then) counts in the last
        # slot: every slot is the same length of time.
        slot = min(int(elapsed / self.slot_seconds), self.slots - 1)
        while len(self.done) <= slot:
            self.done.append(0)
            self.rss_mb.append(None)
        self.done[slot] += 1
        self.rss_mb[slot] = memory()


def load(tm: Any, catalog: Callable[[], Any], duration: float, worker: int,
         memory: Callable[[], float | None]) -> Series:
    """Add documents until ``duration`` has passed; one transaction per batch."""
    series = Series(duration)
    rng = random.Random(worker)
    start = time.perf_counter()
    while time.perf_counter() - start < duration:
        tm.begin()
        add_documents(catalog(), DOCUMENTS_PER_TRANSACTION, rng)
        tm.commit()
        series.record(time.perf_counter() - start, memory)
    return series


def add_documents(cat: Any, count: int, rng: random.Random) -> None:
    """Add ``count`` documents after the catalog's last, to every index and the Length."""
    first = cat["count"]()
    for number in range(first, first + count):
        tags = [f"tag{rng.randrange(TAGS)}" for _ in range(TAGS_PER_DOCUMENT)]
        cat["documents"][number] = Document(number, tags)
        cat["by_title"][f"document {number}"] = number
        for tag in tags:
            members = cat["by_tag"].get(tag)
            if members is None:
                members = cat["by_tag"][tag] = OOTreeSet()
            members.add(f"{number:012d}")
    cat["count"].change(count)


def fill_allowance(documents: int) -> float:
    """Seconds the other workers wait at the barrier beyond the usual while worker 0
    fills the catalog: at 100 documents a second (a tenth of this machine's slowest)."""
    return documents / 100


def fill(tm: Any, catalog: Callable[[], Any], documents: int,
         batch: int = FILL_BATCH) -> None:
    """Load ``documents`` before the timed run (``--soak-documents``), ``batch`` a
    transaction, so that the run starts on a catalog of that size: the first tenth is
    then not a catalog small enough for every node to fit in a few pages."""
    rng = random.Random(-1)
    while True:
        tm.begin()
        cat = catalog()
        left = documents - cat["count"]()
        if left <= 0:
            tm.abort()
            return
        add_documents(cat, min(batch, left), rng)
        tm.commit()


def query(tm: Any, catalog: Callable[[], Any], duration: float, worker: int,
          memory: Callable[[], float | None]) -> Series:
    """Read the newest documents of a random tag until ``duration`` has passed."""
    series = Series(duration)
    rng = random.Random(1000 + worker)
    start = time.perf_counter()
    while time.perf_counter() - start < duration:
        tm.begin()
        cat = catalog()
        members = cat["by_tag"].get(f"tag{rng.randrange(TAGS)}")
        if members is not None:
            for key in newest(members):
                cat["documents"][int(key)].title
        tm.abort()
        series.record(time.perf_counter() - start, memory)
    return series


def newest(members: Any) -> list[str]:
    """The last ``QUERY_SIZE`` keys of a tag's set, as a catalog's sorted query reads
    them: a key range below the largest key, widened until it holds enough, so a
    query reads a few buckets however large the set has grown (iterating the whole
    set made each query cost in proportion to the database, and the soak measured
    that instead of the storage)."""
    if not members:
        return []
    top = int(members.maxKey())
    span = QUERY_SIZE * TAGS // TAGS_PER_DOCUMENT      # the numbers that hold ~20
    while True:
        low = max(0, top - span)
        found = list(members.keys(min=f"{low:012d}"))
        if len(found) >= QUERY_SIZE or low == 0:
            return found[-QUERY_SIZE:]
        span *= 2


def problems(cat: Any) -> list[str]:
    """What is wrong with the catalog after the run (nothing: [])."""
    wrong = []
    count, documents = cat["count"](), len(cat["documents"])
    if count != documents:
        wrong.append(f"the Length says {count} documents, the catalog holds {documents}")
    for tag, members in cat["by_tag"].items():
        missing = [k for k in members.keys() if int(k) not in cat["documents"]]
        if missing:
            wrong.append(f"{tag} names {len(missing)} documents that are not there")
    return wrong


def summarise(series: list[dict[str, Any]], slot: float) -> dict[str, Any]:
    """Per-slot rates of the loader and the queriers, the largest RSS, and the ratios:
    the last tenth's loading rate over the first tenth's, and the last tenth's RSS over
    the second tenth's (the first holds the start-up)."""
    def per_slot(rows: list[list[int]]) -> list[float]:
        width = max((len(r) for r in rows), default=0)
        return [sum(r[i] for r in rows if i < len(r)) / slot for i in range(width)]
    loaded = per_slot([s["done"] for s in series if s["role"] == "load"])
    queried = per_slot([s["done"] for s in series if s["role"] == "query"])
    width = max((len(s["rss_mb"]) for s in series), default=0)
    rss = [max((s["rss_mb"][i] for s in series
                if i < len(s["rss_mb"]) and s["rss_mb"][i] is not None), default=None)
           for i in range(width)]
    return {"slot_seconds": slot, "commits_per_s": loaded, "queries_per_s": queried,
            "rss_mb": rss, "last_first": _tenths_ratio(loaded, -1, 0),
            "rss_last_second": _tenths_ratio(rss, -1, 1)}


def _tenths_ratio(values: list[Any], late: int, early: int) -> float | None:
    """Mean of one tenth of ``values`` over the mean of another (None: too few)."""
    present = [v for v in values if v is not None]
    if len(present) < 10:
        return None
    size = len(present) // 10
    last = present[-size:] if late == -1 else present[late * size:(late + 1) * size]
    below = sum(present[early * size:(early + 1) * size]) / size
    return (sum(last) / size) / below if below else None
