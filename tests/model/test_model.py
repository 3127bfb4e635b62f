"""The storage, driven at random, always agrees with the model of what ZODB promises.

Runs on every backend and history mode.  The defaults keep CI short; set
``ZODBSQL_MODEL_EXAMPLES`` (sequences per cell) and ``ZODBSQL_MODEL_STEPS`` (steps per
sequence) for a longer search, ``ZODBSQL_MODEL_SHRINK=0`` to report a failure as found
(shrinking a long sequence on a server takes minutes).
"""
from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.model.machine import StorageMachine

EXAMPLES = int(os.environ.get("ZODBSQL_MODEL_EXAMPLES", "40"))
STEPS = int(os.environ.get("ZODBSQL_MODEL_STEPS", "40"))
SHRINK = os.environ.get("ZODBSQL_MODEL_SHRINK", "1") != "0"


def test_storage_agrees_with_the_model(storage_factory: Any) -> None:
    run_model(storage_factory, "off", EXAMPLES)


@pytest.mark.parametrize("cache_compress", ["zstd", "auto"])
def test_storage_with_a_compressed_cache_agrees_with_the_model(storage_factory: Any,
                                                                cache_compress: str) -> None:
    """``cache-compress zstd``: the cache's main segments keep states packed; ``auto``:
    as they came until the (small) cache is first full, then packed and squeezed."""
    run_model(storage_factory, cache_compress, max(1, EXAMPLES // 4))


def run_model(storage_factory: Any, cache_compress: str, examples: int) -> None:
    machine = type("Machine", (StorageMachine,), {"factory": storage_factory,
                                                  "cache_compress": cache_compress})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=STEPS, deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=list(Phase) if SHRINK else [p for p in Phase if p is not Phase.shrink]))
