"""What every fault test asserts about a database after the fault.

* Every acknowledged transfer is in the database (no acknowledged commit lost).
* The bank's audit is clean: the sum of the balances is exact and every balance
  matches its recorded transfers (nothing applied twice or half).
* ``zodbsql verify`` (the command line) exits 0.
"""
from __future__ import annotations

import contextlib
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


def read_bank(url: str, blob_dir: pathlib.Path | None = None,
              blob_size: int = 0) -> tuple[set[str], list[str]]:
    """``(applied transfer ids, audit problems)`` read through a new storage."""
    options: dict[str, Any] = {"blob_dir": str(blob_dir)} if blob_dir else {}
    with transaction_on(url, **options) as root:
        return bank.applied_ids(root), bank.audit(root, blob_size)


def assert_consistent(url: str, acknowledged: set[str], blob_dir: pathlib.Path | None = None,
                      blob_size: int = 0, verify: bool = True) -> set[str]:
    """The three assertions above; returns the transfer ids the database holds."""
    applied, problems = read_bank(url, blob_dir, blob_size)
    lost = acknowledged - applied
    assert not lost, f"{len(lost)} acknowledged transfers are missing: {sorted(lost)[:10]}"
    assert not problems, "the bank does not add up:\n" + "\n".join(problems)
    if verify:
        run_verify(url)
    return applied


def create_bank(url: str, accounts: int) -> None:
    with transaction_on(url) as root:
        bank.create(root, accounts)
