"""Writers killed with SIGKILL at chosen points of a commit or a pack, or at random.

After each kill the database must hold every acknowledged transfer, the bank must add
up, ``zodbsql verify`` must be clean, and a new commit must go through (no lock or
half-written state left behind).  Killing clients needs no private server: the shared
ones are used, with a scratch schema or database.
"""
from __future__ import annotations

import pathlib
import random
import time

import pytest

import zodbsql
from tests.fault.checks import assert_consistent, commit_one_more, create_bank
from tests.fault.conftest import MakeScratch
from tests.fault.phases import PHASES
from tests.fault.targets import BACKENDS
from tests.fault.writer import WriterConfig
from tests.fault.writers import ACCOUNTS, acknowledged, logged, start_writer, writer_config

pytestmark = pytest.mark.fault

BLOB_SIZE = 40000          # three chunks of 16 KiB: the kill lands between two
PACK_AFTER = 15            # transfers (each leaving garbage) before the pack
PACK_BATCH = 3             # objects per pack batch, so a pack has several
RANDOM_KILLS = 3
CASES = [(backend, phase, keep_history)
         for backend in BACKENDS for phase in PHASES for keep_history in (True, False)]


def _id(case: tuple[str, str, bool]) -> str:
    backend, phase, keep_history = case
    return f"{backend}-{phase}-{'hp' if keep_history else 'hf'}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_kill_at_phase(case: tuple[str, str, bool], make_scratch: MakeScratch,
                       tmp_path: pathlib.Path, rng: random.Random) -> None:
    backend, phase, keep_history = case
    blobs = phase == "blob"
    scratch = make_scratch(backend)
    url = scratch.url(keep_history, pack_batch_size=PACK_BATCH, commit_lock_timeout=20)
    create_bank(url, ACCOUNTS)
    settings: dict[str, object] = {"phase": phase, "at": rng.randint(1, 4)}
    if blobs:
        settings.update(blob_size=BLOB_SIZE, blob_dir=str(tmp_path / "writer-blobs"))
    if phase == "pack":
        settings.update(garbage=True, pack_after=PACK_AFTER, at=rng.randint(1, 3))
    config = writer_config(url, tmp_path, "w", rng, **settings)
    child = start_writer(config, tmp_path)
    try:
        child.wait_for("ready")
        child.wait_for("phase")
        time.sleep(rng.uniform(0, 0.05))
    finally:
        child.kill()
    acked = acknowledged(config)
    if phase == "pack":
        assert len(acked) == PACK_AFTER, "the pack started before all transfers were acknowledged"
    check_dir = tmp_path / "check-blobs" if blobs else None
    size = BLOB_SIZE if blobs else 0
    assert_consistent(url, acked, check_dir, size)
    if phase == "pack":
        # The interrupted pack is finished by the next one.
        storage = zodbsql.open_storage(url)
        try:
            storage.pack(time.time(), None)
        finally:
            storage.close()
        assert_consistent(url, acked, check_dir, size)
    acked.add(commit_one_more(url, "parent", check_dir, size))
    assert_consistent(url, acked, check_dir, size, verify=False)


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_at_random(backend: str, keep_history: bool, make_scratch: MakeScratch,
                        tmp_path: pathlib.Path, rng: random.Random) -> None:
    """Two writers on the same accounts (conflicts included), killed at random moments,
    again and again on the same database."""
    scratch = make_scratch(backend)
    url = scratch.url(keep_history, commit_lock_timeout=20)
    create_bank(url, ACCOUNTS)
    configs: list[WriterConfig] = []
    for kill in range(RANDOM_KILLS):
        round_configs = [writer_config(url, tmp_path, f"r{kill}w{n}", rng) for n in range(2)]
        children = [start_writer(c, tmp_path) for c in round_configs]
        try:
            for child in children:
                child.wait_for("ready")
            time.sleep(rng.uniform(0.2, 1.0))
        finally:
            for child in children:
                child.kill()
        configs += round_configs
        applied = assert_consistent(url, acknowledged(*configs),
                                    retried=logged("retried", *configs))
        print(f"kill {kill}: {len(acknowledged(*configs))} acknowledged, {len(applied)} applied")
    assert acknowledged(*configs), "no transfer was acknowledged in any round"
