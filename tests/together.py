"""Calls made by several threads at the same moment, for the tests of races."""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

Result = TypeVar("Result")


def call_at_once(count: int, call: Callable[[int], Result], timeout: float = 120) -> list[Result]:
    """``count`` threads pass one barrier, then each makes ``call(its number)``; returns
    the results in the threads' order. Fails with every exception raised, and if a thread
    has not returned within ``timeout`` seconds."""
    start = threading.Barrier(count)
    results: dict[int, Result] = {}
    failures: list[BaseException] = []

    def run(number: int) -> None:
        try:
            start.wait()
            results[number] = call(number)
        except BaseException as exc:   # noqa: B902 - every failure is reported below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(number,)) for number in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert failures == []
    assert [thread.name for thread in threads if thread.is_alive()] == []
    return [results[number] for number in range(count)]
