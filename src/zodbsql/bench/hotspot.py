"""The hotspot workload: every worker inserts into one shared OOBTree and bumps one
shared ``BTrees.Length``, the everyday pattern of a Zope catalog or a counter.

Every transaction is retried on the errors ``transaction.manager.attempts()`` retries
(``TransientError``: conflicts, lock timeouts, lost connections), as Zope does; the
retries are counted by error class.  Keys are spread over the whole tree (a hash of
worker, transaction and position), so inserts land in many buckets and bucket splits
meet, and are known in advance, so the result can be checked exactly.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from BTrees.Length import Length
from BTrees.OOBTree import OOBTree
from persistent.mapping import PersistentMapping
from ZODB.POSException import ConflictError

#: Keys each transaction inserts (the issue's workload).
KEYS_PER_TRANSACTION = 10
#: Attempts of one transaction before a worker gives up: far above what contention needs.
MAX_ATTEMPTS = 1000


class GaveUp(RuntimeError):
    """A transaction did not commit within MAX_ATTEMPTS attempts."""


@dataclass
class Retries:
    """Retried errors, by error class name."""

    by_error: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.by_error.values())

    def add(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.by_error[name] = self.by_error.get(name, 0) + 1

    def merge(self, other: dict[str, int]) -> None:
        for name, count in other.items():
            self.by_error[name] = self.by_error.get(name, 0) + count


def key(tag: str, worker: int, txn: int, position: int) -> str:
    """A fresh key, spread over the key space; the same for every attempt."""
    text = f"{tag}/{worker}/{txn}/{position}".encode()
    return hashlib.blake2b(text, digest_size=8).hexdigest()


def expected_keys(tag: str, workers: int, transactions: int, keys: int) -> set[str]:
    return {key(tag, w, t, k) for w in range(workers) for t in range(transactions)
            for k in range(keys)}


def commit_with_retries(tm: Any, change: Callable[[], None], retries: Retries) -> None:
    """Run ``change`` in a transaction until it commits, as attempts() would."""
    for _ in range(MAX_ATTEMPTS):
        tm.begin()
        try:
            change()
            tm.commit()
            return
        except Exception as exc:
            retryable = tm.get().isRetryableError(exc)   # asks the data managers too
            tm.abort()
            if not retryable:
                raise
            retries.add(exc)
    raise GaveUp(f"no commit after {MAX_ATTEMPTS} attempts; retried {retries.by_error}")


def make_shared(tm: Any, container: Callable[[], Any], name: str) -> None:
    """Create ``container()[name]`` (the tree and the Length) unless a worker did."""
    for attempt in range(50):
        tm.begin()
        try:
            if name not in container():
                container()[name] = PersistentMapping(tree=OOBTree(), length=Length())
            tm.commit()
            return
        except ConflictError:   # workers creating it together: look again
            tm.abort()
            time.sleep(0.01 * (attempt + 1))
    raise GaveUp(f"could not create the shared tree {name!r}: too many conflicts")


def run(tm: Any, shared: Callable[[], Any], tag: str, worker: int, transactions: int,
        keys: int = KEYS_PER_TRANSACTION) -> Retries:
    """``transactions`` commits, each inserting ``keys`` keys and adding them to the
    Length; ``shared()`` gives the mapping made by ``make_shared`` (in the current
    transaction)."""
    retries = Retries()
    for txn in range(transactions):
        def change(txn: int = txn) -> None:
            hot = shared()
            for position in range(keys):
                hot["tree"][key(tag, worker, txn, position)] = worker
            hot["length"].change(keys)
        commit_with_retries(tm, change, retries)
    return retries


def problems(hot: Any, tag: str, workers: int, transactions: int, keys: int) -> list[str]:
    """What is wrong with the shared tree and Length after the workload (nothing: [])."""
    expected = expected_keys(tag, workers, transactions, keys)
    found = set(hot["tree"].keys())
    wrong = []
    if hot["length"]() != len(expected):
        wrong.append(f"the Length is {hot['length']()}, expected {len(expected)}")
    if found != expected:
        wrong.append(f"the tree holds {len(found)} keys, expected {len(expected)}:"
                     f" {len(expected - found)} missing, {len(found - expected)} unexpected")
    return wrong
