"""The workload the fault tests run: transfers between accounts, each one recorded.

Money only moves, so the sum of the balances never changes.  Every transfer also records
itself (id -> source, destination, amount) in an ``OOBTree`` in the same transaction, so
each balance must equal its opening balance plus the recorded transfers in and out: a
transfer applied twice (the tree keeps one entry, the balances moved twice) or half
applied breaks that, and so does a lost one.  Optionally a transfer also writes a blob
(its content derived from the id) and replaces a scratch object, leaving garbage for pack.

This module is imported by the child processes too: the classes pickled in the database
live here.
"""
from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any

from BTrees.OOBTree import OOBTree
from persistent import Persistent
from persistent.mapping import PersistentMapping
from ZODB.blob import Blob

OPENING_BALANCE = 1000


class Account(Persistent):
    def __init__(self, number: int) -> None:
        self.number = number
        self.balance = OPENING_BALANCE


class Bank(Persistent):
    def __init__(self, accounts: int) -> None:
        self.accounts = [Account(i) for i in range(accounts)]
        self.applied = OOBTree()   # transfer id -> (source, destination, amount)
        self.blobs = OOBTree()     # transfer id -> Blob (when transfers carry one)
        self.scratch = PersistentMapping()


def create(root: Any, accounts: int) -> None:
    root["bank"] = Bank(accounts)


def blob_content(transfer_id: str, size: int) -> bytes:
    """The blob a transfer writes: ``size`` bytes determined by its id."""
    seed = hashlib.sha256(transfer_id.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


@dataclasses.dataclass(frozen=True)
class Transfer:
    id: str
    source: int
    destination: int
    amount: int

    @classmethod
    def random(cls, transfer_id: str, accounts: int, rng: random.Random) -> "Transfer":
        source, destination = rng.sample(range(accounts), 2)
        return cls(transfer_id, source, destination, rng.randint(1, 50))

    def apply(self, root: Any, blob_size: int = 0, garbage: bool = False) -> None:
        """Make the transfer's changes in the current transaction (not committed)."""
        bank = root["bank"]
        bank.accounts[self.source].balance -= self.amount
        bank.accounts[self.destination].balance += self.amount
        bank.applied[self.id] = (self.source, self.destination, self.amount)
        if blob_size:
            blob = Blob()
            with blob.open("w") as f:
                f.write(blob_content(self.id, blob_size))
            bank.blobs[self.id] = blob
        if garbage:
            # The old scratch object becomes unreachable: something for pack to collect.
            bank.scratch = PersistentMapping({"last": self.id, "junk": b"x" * 512})


def discrepancies(root: Any) -> dict[int, int]:
    """Account -> its balance minus what its recorded transfers make, for those off."""
    bank = root["bank"]
    expected = [OPENING_BALANCE] * len(bank.accounts)
    for source, destination, amount in bank.applied.values():
        expected[source] -= amount
        expected[destination] += amount
    return {number: account.balance - wanted
            for number, (account, wanted) in enumerate(zip(bank.accounts, expected))
            if account.balance != wanted}


def audit(root: Any, blob_size: int = 0) -> list[str]:
    """What is wrong with the bank (an empty list: nothing)."""
    bank = root["bank"]
    problems = []
    total = sum(account.balance for account in bank.accounts)
    if total != OPENING_BALANCE * len(bank.accounts):
        problems.append(
            f"the balances sum to {total}, not {OPENING_BALANCE * len(bank.accounts)}")
    for number, off in sorted(discrepancies(root).items()):
        problems.append(
            f"account {number} is off by {off:+d} from its recorded transfers: a transfer"
            " was applied twice, half or lost")
    if blob_size:
        missing = set(bank.applied.keys()) - set(bank.blobs.keys())
        if missing:
            problems.append(f"transfers without their blob: {sorted(missing)[:5]}")
        for transfer_id, blob in bank.blobs.items():
            with blob.open("r") as f:
                if f.read() != blob_content(transfer_id, blob_size):
                    problems.append(f"the blob of transfer {transfer_id} has other content")
    return problems


def applied(root: Any) -> dict[str, tuple[int, int, int]]:
    """Transfer id -> (source, destination, amount) of every transfer in the database."""
    return dict(root["bank"].applied.items())
