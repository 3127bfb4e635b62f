"""PostgreSQL and MariaDB stopped hard and started again while writers commit.

Private servers only (``tests.fault.servers``): PostgreSQL is stopped with ``pg_ctl stop
-m immediate``, MariaDB killed with SIGKILL, each a few times under load.  The writers
retry what a TransientError says may be retried.  Afterwards no acknowledged transfer
is lost, none is applied twice (each balance matches the transfers recorded with it),
``zodbsql verify`` is clean, and the writers made progress after the last restart.
"""
from __future__ import annotations

import pathlib
import random
import time

import pytest

from tests.fault.checks import assert_consistent, create_bank
from tests.fault.conftest import MakeScratch
from tests.fault.servers import PrivateServer
from tests.fault.targets import private_address
from tests.fault.writers import (ACCOUNTS, acknowledged, logged, start_ready,
                                 unknown_outcome, wait_for_progress, writer_config)

pytestmark = pytest.mark.fault

WRITERS = 2
RESTARTS = 3
PROGRESS_TIMEOUT = 60.0
SERVERS = {"postgresql": "private_postgresql", "mysql": "private_mariadb"}


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
@pytest.mark.parametrize("backend", sorted(SERVERS))
def test_server_restarts_under_load(backend: str, keep_history: bool,
                                    request: pytest.FixtureRequest,
                                    make_scratch: MakeScratch, tmp_path: pathlib.Path,
                                    rng: random.Random) -> None:
    server: PrivateServer = request.getfixturevalue(SERVERS[backend])
    server.ensure_running()
    scratch = make_scratch(backend, private_address(server))
    url = scratch.url(keep_history, commit_lock_timeout=10)
    create_bank(url, ACCOUNTS)
    configs = [writer_config(url, tmp_path, f"w{n}", rng) for n in range(WRITERS)]
    children = start_ready(configs, tmp_path)
    try:
        for _ in range(RESTARTS):
            wait_for_progress(configs, len(acknowledged(*configs)), PROGRESS_TIMEOUT)
            time.sleep(rng.uniform(0.2, 1.0))
            server.restart(down_seconds=rng.uniform(0.0, 1.0))
        wait_for_progress(configs, len(acknowledged(*configs)), PROGRESS_TIMEOUT)
        pathlib.Path(configs[0].stop_file).touch()
        for child in children:
            child.wait_for("done")
            assert child.wait() == 0, child.stderr_tail()
    finally:
        server.ensure_running()
        for child in children:
            child.kill()
    unknown = unknown_outcome(*configs)
    applied = assert_consistent(url, acknowledged(*configs),
                                retried=logged("retried", *configs))
    print(f"{len(acknowledged(*configs))} acknowledged, {len(applied)} applied,"
          f" {len(unknown)} of unknown outcome ({len(unknown & applied)} applied)")
