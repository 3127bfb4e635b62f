"""Fixtures of the fault suite: private servers (from ``servers``) and scratch databases."""
from __future__ import annotations

import os
import pathlib
import random
from typing import Callable, Iterator

import pytest

from tests.fault.servers import private_mariadb, private_postgresql  # noqa: F401 (fixtures)
from tests.fault.targets import ScratchDatabase, ServerAddress, shared_server

MakeScratch = Callable[..., ScratchDatabase]


@pytest.fixture
def make_scratch(tmp_path: pathlib.Path) -> Iterator[MakeScratch]:
    """``make_scratch(backend, server=None)``: a new scratch database, dropped after the
    test; server backends default to the shared server."""
    made: list[ScratchDatabase] = []

    def make(backend: str, server: ServerAddress | None = None) -> ScratchDatabase:
        if backend != "sqlite" and server is None:
            server = shared_server(backend)
        scratch = ScratchDatabase(backend, tmp_path, server)
        made.append(scratch)
        return scratch
    yield make
    for scratch in made:
        scratch.drop()


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    """A random generator whose seed is in the failure report (ZODBSQL_FAULT_SEED fixes it)."""
    seed = int(os.environ.get("ZODBSQL_FAULT_SEED") or random.randrange(1 << 32))
    request.node.user_properties.append(("seed", seed))
    print(f"random seed {seed} (ZODBSQL_FAULT_SEED={seed} repeats it)")
    return random.Random(seed)
