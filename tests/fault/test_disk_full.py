"""SQLite running out of space while a writer commits.

Two ways to run out, both in a child process that commits transfers carrying filler
until a commit fails:

* ``RLIMIT_FSIZE`` just above the database's size, with SIGXFSZ ignored: a write past
  the limit fails with EFBIG.  Works anywhere.
* A small tmpfs mounted for the test: a write fails with ENOSPC, a full disk proper.
  Needs the right to mount (root); skipped, saying so, where it is missing.

The failure must be a zodbsql error that says what happened and where (not a traceback
from somewhere unrelated).  Afterwards the file must be intact: every acknowledged
transfer present, the bank adding up, ``zodbsql verify`` clean; and once there is room
again, commits go through.
"""
from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess
from typing import Any, Iterator

import pytest

from tests.fault.checks import assert_consistent, commit_one_more, create_bank
from tests.fault.conftest import MakeScratch
from tests.fault.targets import ScratchDatabase
from tests.fault.writers import ACCOUNTS, acknowledged, start_writer, writer_config

pytestmark = pytest.mark.fault

FILLER = 16384
HEADROOM = 512 * 1024        # bytes the files may grow by before writes fail
TMPFS_SIZE = "2m"
TMPFS_ROOMY = "64m"
# What a clear message about a full disk (or a file size limit) says.
DISK_WORDS = ("full", "too large", "disk i/o", "no space", "file size")


def fill_until_failure(scratch: ScratchDatabase, tmp_path: pathlib.Path,
                       rng: random.Random, **limits: Any) -> tuple[set[str], dict[str, Any]]:
    """Run a writer until its first failed commit: ``(acknowledged ids, the error)``."""
    config = writer_config(scratch.url(True), tmp_path, "w", rng, filler=FILLER,
                           stop_on_error=True, transfers=10000, **limits)
    child = start_writer(config, tmp_path)
    try:
        child.wait_for("ready")
        line = child.wait_for("failed", timeout=120)
        child.wait_for("done")
        assert child.wait() == 0, child.stderr_tail()
    finally:
        child.kill()
    error = json.loads(line.split(" ", 2)[2])
    acked = acknowledged(config)
    print(f"{len(acked)} acknowledged, then: {error['type']}: {error['message']}")
    return acked, error


def assert_clear(error: dict[str, Any], path: pathlib.Path) -> None:
    assert "zodbsql.errors.ZodbsqlError" in error["bases"], (
        f"the full disk surfaced as {error['type']}, not a zodbsql error:\n{error['traceback']}")
    # Said by the error itself: an error that wraps the driver's (a commit found not to
    # have happened, say) must carry its text.
    message = error["message"].lower()
    assert str(path).lower() in message and any(w in message for w in DISK_WORDS), (
        f"the error does not say the disk (file) is full and where: {error['message']}"
        f"\n{error['traceback']}")


def test_sqlite_file_size_limit(make_scratch: MakeScratch, tmp_path: pathlib.Path,
                                rng: random.Random) -> None:
    scratch = make_scratch("sqlite")
    create_bank(scratch.url(True), ACCOUNTS)
    limit = os.path.getsize(scratch.path) + HEADROOM
    acked, error = fill_until_failure(scratch, tmp_path, rng, file_size_limit=limit)
    assert_clear(error, scratch.path)
    assert acked, "the limit was hit before any transfer was committed"
    assert_consistent(scratch.url(True), acked)
    acked.add(commit_one_more(scratch.url(True), "parent"))
    assert_consistent(scratch.url(True), acked, verify=False)


@pytest.fixture
def small_tmpfs(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A tmpfs of TMPFS_SIZE mounted for the test, unmounted after it."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs",
                             str(mount_point)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()}); the"
                    " RLIMIT_FSIZE test covers a full disk instead")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def test_sqlite_disk_full(small_tmpfs: pathlib.Path, tmp_path: pathlib.Path,
                          rng: random.Random) -> None:
    scratch = ScratchDatabase("sqlite", small_tmpfs)
    url = scratch.url(True)
    create_bank(url, ACCOUNTS)
    acked, error = fill_until_failure(scratch, tmp_path, rng)
    assert_clear(error, scratch.path)
    assert acked, "the disk was full before any transfer was committed"
    assert_consistent(url, acked)
    subprocess.run(["mount", "-o", f"remount,size={TMPFS_ROOMY}", str(small_tmpfs)],
                   check=True)
    acked.add(commit_one_more(url, "parent"))
    assert_consistent(url, acked, verify=False)
