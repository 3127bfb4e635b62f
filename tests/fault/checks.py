"""What every fault test asserts about a database after the fault.

* Every acknowledged transfer is in the database (no acknowledged commit lost).
* The bank's audit is clean: the sum of the balances is exact and every balance
  matches its recorded transfers (nothing applied twice or half).
* ``zodbsql verify`` (the command line) exits 0.
"""
from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import subprocess
from typing import Any, Iterator

import transaction
import ZODB

import zodbsql
from tests.fault import bank
from tests.fault.children import ROOT, child_env, zodbsql_command


def run_verify(url: str) -> str:
    """Run ``zodbsql verify URL``; assert it exits 0; return its output."""
    result = subprocess.run(zodbsql_command() + ["verify", "--quiet", "zodbsql+" + url],
                            cwd=ROOT, env=child_env(), capture_output=True, text=True,
                            timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"zodbsql verify exited {result.returncode}:\n{output}"
    return output


@contextlib.contextmanager
def transaction_on(url: str, **options: Any) -> Iterator[Any]:
    """The root of a new DB on ``url``, in one transaction committed at the end."""
    db = ZODB.DB(zodbsql.open_storage(url, **options))
    try:
        tm = transaction.TransactionManager(explicit=True)
        conn = db.open(tm)
        try:
            with tm:
                yield conn.root()
        finally:
            conn.close()
    finally:
        db.close()


@dataclasses.dataclass
class BankState:
    applied: dict[str, tuple[int, int, int]]   # transfer id -> (source, destination, amount)
    problems: list[str]
    off: dict[int, int]                        # account -> how far off its balance is


def read_bank(url: str, blob_dir: pathlib.Path | None = None, blob_size: int = 0) -> BankState:
    """The bank as a new storage reads it."""
    options: dict[str, Any] = {"blob_dir": str(blob_dir)} if blob_dir else {}
    with transaction_on(url, **options) as root:
        return BankState(bank.applied(root), bank.audit(root, blob_size),
                         bank.discrepancies(root))


def assert_consistent(url: str, acknowledged: set[str], blob_dir: pathlib.Path | None = None,
                      blob_size: int = 0, verify: bool = True,
                      retried: dict[str, str] | None = None) -> set[str]:
    """The three assertions above; returns the transfer ids the database holds.

    ``retried`` (transfer id -> the error its commit raised before it was retried) names
    the suspects when a balance is off: a retried commit that had in fact happened.
    """
    state = read_bank(url, blob_dir, blob_size)
    lost = acknowledged - set(state.applied)
    assert not lost, f"{len(lost)} acknowledged transfers are missing: {sorted(lost)[:10]}"
    problems = list(state.problems)
    for transfer_id, error in sorted((retried or {}).items()):
        source, destination, amount = state.applied.get(transfer_id, (-1, -1, 0))
        if source in state.off and destination in state.off:
            problems.append(f"suspect: transfer {transfer_id} of {amount} from account"
                            f" {source} to {destination}, retried after its commit raised"
                            f" {error}")
    assert not state.problems, "the bank does not add up:\n" + "\n".join(problems)
    if verify:
        run_verify(url)
    return set(state.applied)


def commit_one_more(url: str, name: str, blob_dir: pathlib.Path | None = None,
                    blob_size: int = 0) -> str:
    """Commit a transfer after the fault (the database still accepts commits); its id."""
    options = {"blob_dir": str(blob_dir)} if blob_dir else {}
    with transaction_on(url, **options) as root:
        bank.Transfer(f"{name}-after", 0, 1, 1).apply(root, blob_size)
    return f"{name}-after"


def create_bank(url: str, accounts: int) -> None:
    with transaction_on(url) as root:
        bank.create(root, accounts)
