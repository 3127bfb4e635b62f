"""Blob files a killed writer left in blob-dir/tmp are removed when a storage opens the
directory and when it packs; a live writer's files stay (both layouts)."""
from __future__ import annotations

import os
import pathlib
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
import transaction
from ZODB.tests.MinPO import MinPO
from ZODB.tests.StorageTestBase import zodb_pickle
from ZODB.utils import z64

from zodbsql.storage import staging

storage_backends = ("sqlite",)
storage_backends_reason = "staging is files in the blob directory, the same on every backend"

WRITER = textwrap.dedent("""
    import pickle, sys, tempfile, time
    import transaction
    from ZODB.tests.MinPO import MinPO
    from ZODB.tests.StorageTestBase import zodb_pickle
    from ZODB.utils import z64
    from zodbsql.api import open_storage
    backend, options = pickle.loads(bytes.fromhex(sys.argv[1]))
    storage = open_storage(backend, **options)
    txn = transaction.Transaction()
    storage.tpc_begin(txn)
    fd, path = tempfile.mkstemp(dir=storage.temporaryDirectory(), prefix="upload-")
    with open(fd, "wb") as f:
        f.write(b"half of a blob")
    storage.storeBlob(storage.new_oid(), z64, zodb_pickle(MinPO(1)), path, "", txn)
    print("staged", flush=True)
    time.sleep(600)
""")


def staged_files(blob_dir: pathlib.Path) -> set[str]:
    return {p.name for p in (blob_dir / "tmp").glob("commit-*.blob")}


def kill_a_writer_while_it_stages(storage_factory: Any, options: dict[str, Any]) -> None:
    options = {"keep_history": storage_factory.param.keep_history, **options}
    spec = pickle.dumps((storage_factory.backend_options(), options)).hex()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, spec], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "staged", writer.stderr
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(30)


def stage_in_this_process(storage: Any, directory: pathlib.Path) -> transaction.Transaction:
    """A live writer: a blob stored in a two-phase commit left open."""
    path = directory / "upload"
    path.write_bytes(b"a blob being committed")
    txn = transaction.Transaction()
    storage.tpc_begin(txn)
    storage.storeBlob(storage.new_oid(), z64, zodb_pickle(MinPO(2)), str(path), "", txn)
    return txn


@pytest.mark.parametrize("shared", [False, True], ids=["cache", "shared-dir"])
def test_a_killed_writers_files_go_at_open_and_at_pack(storage_factory: Any,
                                                       tmp_path: pathlib.Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       shared: bool) -> None:
    monkeypatch.setattr(staging, "SHARED_STALE_AGE", 0.0)  # the hour: see the next test
    blob_dir = tmp_path / "blobs"
    options = {"blob_dir": str(blob_dir), "shared_blob_dir": shared}
    live = storage_factory.open(**options)
    txn = stage_in_this_process(live, tmp_path)
    (own,) = staged_files(blob_dir)
    packer = storage_factory.open(**options)

    kill_a_writer_while_it_stages(storage_factory, options)
    assert len(staged_files(blob_dir)) == 2
    storage_factory.open(**options).close()
    assert staged_files(blob_dir) == {own}       # the dead writer's file went at open

    kill_a_writer_while_it_stages(storage_factory, options)
    assert len(staged_files(blob_dir)) == 2
    packer.pack(time.time(), None)               # opened before: its pack removes it
    assert staged_files(blob_dir) == {own}
    live.tpc_abort(txn)                          # the live writer's file was never touched
    assert staged_files(blob_dir) == set()


def test_a_shared_directory_keeps_a_dead_writers_file_for_an_hour(storage_factory: Any,
                                                                  tmp_path: pathlib.Path
                                                                  ) -> None:
    # Another machine's locks may not be visible on a network file system.
    blob_dir = tmp_path / "blobs"
    options = {"blob_dir": str(blob_dir), "shared_blob_dir": True}
    kill_a_writer_while_it_stages(storage_factory, options)
    storage_factory.open(**options).close()
    assert len(staged_files(blob_dir)) == 1
    assert staging.SHARED_STALE_AGE >= 3600


def test_lock_files_of_closed_and_killed_storages_go(storage_factory: Any,
                                                     tmp_path: pathlib.Path) -> None:
    blob_dir = tmp_path / "blobs"
    kill_a_writer_while_it_stages(storage_factory, {"blob_dir": str(blob_dir)})
    assert len(list(blob_dir.glob(".commit-*.lock"))) == 1
    storage = storage_factory.open(blob_dir=str(blob_dir))
    assert list(blob_dir.glob(".commit-*.lock")) == []   # the dead writer's, with its file
    txn = stage_in_this_process(storage, tmp_path)
    assert len(list(blob_dir.glob(".commit-*.lock"))) == 1
    storage.tpc_abort(txn)
    storage.close()
    assert list(blob_dir.glob(".commit-*.lock")) == []
    assert os.listdir(blob_dir / "tmp") == []
