"""The ``storage_factory`` fixture: every storage test runs over backend x history mode.

A test class narrows the modes it applies to with ``history_modes``, a module the
backends with ``storage_backends`` (data, with the reason in ``history_modes_reason``,
``storage_backends_reason``); the other cells are still generated, as skips that give
the reason, so nothing is left out silently.
"""
from __future__ import annotations

import os
import pathlib
import threading
from typing import Callable, cast

import pytest
import transaction

from tests.conformance.differences import HISTORY_FREE_SKIPS, SERVER_SESSIONS_NEEDED
from tests.databases import FACTORIES, PARAMS, Param, StorageFactory, server_session_limit


def narrowed(holder: object, attribute: str) -> tuple[object, ...] | None:
    """A module's or class's ``attribute`` (None when it has none); narrowing without
    ``<attribute>_reason`` is an error, so no cell is left out without a reason."""
    values = getattr(holder, attribute, None)
    if values is not None and not getattr(holder, f"{attribute}_reason", None):
        raise TypeError(f"{holder!r} sets {attribute} without {attribute}_reason")
    return values


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "storage_factory" not in metafunc.fixturenames:
        return
    # A module about some databases (their files, their server) names them in
    # storage_backends; a class applying to some history modes names them in
    # history_modes.  The cells outside are generated too, as skips with the reason, so
    # every report shows them.
    backends = narrowed(metafunc.module, "storage_backends")
    modes = narrowed(metafunc.cls, "history_modes") if metafunc.cls else None
    mode_name = {True: "history-preserving", False: "history-free"}
    cells = []
    for param in PARAMS:
        reason = None
        if backends is not None and param.backend not in backends:
            reason = f"{param.backend}: {metafunc.module.storage_backends_reason}"
        elif modes is not None and param.keep_history not in modes:
            reason = f"{mode_name[param.keep_history]}: {metafunc.cls.history_modes_reason}"
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        cells.append(pytest.param(param, marks=marks, id=param.id))
    metafunc.parametrize("storage_factory", cells, indirect=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        param = callspec.params.get("storage_factory") if callspec else None
        function = cast(pytest.Function, item)  # if a cell: only functions have a callspec
        if not isinstance(param, Param) or function.cls is None:
            continue  # not a cell of the matrix, or no class to look up
        needed = SERVER_SESSIONS_NEEDED.get(
            f"{function.cls.__name__}::{function.originalname}")
        if needed:
            limit = server_session_limit(param.backend)
            if limit is not None and limit < needed[0]:
                item.add_marker(pytest.mark.skip(
                    reason=f"{param.backend} server allows {limit} sessions"
                           f" (max_connections), this test needs about {needed[0]}: {needed[1]}"))
        if param.keep_history:
            continue
        reason = HISTORY_FREE_SKIPS.get(f"{function.cls.__name__}::{function.originalname}")
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"history-free: {reason}"))


@pytest.fixture(autouse=True)
def _no_leftover_synchronizers():
    """Start each test without ZODB connections an earlier test left registered.

    A test that opens a ``ZODB.DB`` and never closes it (ZODB's testPackUnlinkedFromRoot)
    leaves its connection as a synchronizer of the thread's transaction manager; the
    next ``transaction.abort()`` would poll that connection's storage, which the factory
    has closed and whose server database it has dropped.
    """
    transaction.manager.clearSynchs()
    yield


@pytest.fixture
def storage_factory(request: pytest.FixtureRequest, tmp_path):
    param: Param = request.param
    # Every factory takes these (StorageFactory, FACTORIES' declared type, has no __init__).
    new_factory = cast(Callable[[Param, pathlib.Path], StorageFactory],
                       FACTORIES[param.backend])
    factory = new_factory(param, tmp_path)
    yield factory
    factory.cleanup()


def pytest_report_header(config: pytest.Config) -> list[str]:
    return ["zodbsql storage matrix: " + ", ".join(p.id for p in PARAMS)]


@pytest.fixture
def storage_and_db(storage_factory):
    """A storage of the cell and a ZODB.DB on it, closed afterwards."""
    import ZODB
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    yield storage, db
    db.close()
    transaction.abort()


# ZODBSQL_RSS_LOG=FILE appends "rss_kib threads nodeid" after each test: the way to
# find which tests make the test process grow (a CI run was once killed for memory).
_RSS_LOG = os.environ.get("ZODBSQL_RSS_LOG", "")


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


if _RSS_LOG:

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
        with open(_RSS_LOG, "a") as log:
            log.write(f"{_rss_kib()} {threading.active_count()} {nodeid}\n")
