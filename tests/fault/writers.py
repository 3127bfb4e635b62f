"""The parent's side of the writer processes (``tests.fault.writer``): their settings,
starting them, and what they acknowledged."""
from __future__ import annotations

import pathlib
import random
import time
from typing import Any

from tests.fault.children import Child
from tests.fault.writer import WriterConfig, read_log

ACCOUNTS = 10


def writer_config(url: str, tmp_path: pathlib.Path, name: str, rng: random.Random,
                  **settings: Any) -> WriterConfig:
    """A writer on ``url`` logging to ``tmp_path/NAME.log``, stopped by ``tmp_path/stop``."""
    return WriterConfig(url=url, log=str(tmp_path / f"{name}.log"), name=name,
                        accounts=ACCOUNTS, stop_file=str(tmp_path / "stop"),
                        seed=rng.randrange(1 << 30), **settings)


def start_writer(config: WriterConfig, tmp_path: pathlib.Path) -> Child:
    return Child("tests.fault.writer", vars(config), tmp_path / f"{config.name}.err")


def start_ready(configs: list[WriterConfig], tmp_path: pathlib.Path) -> list[Child]:
    """A writer for each of ``configs``, each past its ``ready`` (killed if one fails)."""
    children = [start_writer(c, tmp_path) for c in configs]
    try:
        for child in children:
            child.wait_for("ready")
    except BaseException:
        for child in children:
            child.kill()
        raise
    return children


def wait_for_progress(configs: list[WriterConfig], beyond: int,
                      timeout: float = 60.0) -> int:
    """Until more than ``beyond`` transfers are acknowledged; how many are."""
    deadline = time.monotonic() + timeout
    while (count := len(acknowledged(*configs))) <= beyond:
        assert time.monotonic() < deadline, (
            f"no transfer acknowledged within {timeout}s (still {count}, waiting for"
            f" more than {beyond})")
        time.sleep(0.1)
    return count


def logged(kind: str, *configs: WriterConfig) -> dict[str, str]:
    """Transfer id -> detail of the writers' log entries of ``kind``."""
    entries: dict[str, str] = {}
    for config in configs:
        entries.update(read_log(config.log)[kind])
    return entries


def acknowledged(*configs: WriterConfig) -> set[str]:
    """The transfers the writers acknowledged (commit returned, logged, fsynced)."""
    return set(logged("ack", *configs))


def unknown_outcome(*configs: WriterConfig) -> set[str]:
    """The transfers whose commit failed with an error that was not retryable."""
    return set(logged("unknown", *configs))
