"""The ``storage_factory`` fixture: every storage test runs over backend x history mode.

A test class narrows the modes it applies to with ``history_modes`` (data, with the
reason in ``history_modes_reason``); the other cells are still generated, as skips that
give the reason, so nothing is left out silently.
"""
from __future__ import annotations

import pytest
import transaction

from tests.conformance.differences import HISTORY_FREE_SKIPS, SERVER_SESSIONS_NEEDED
from tests.databases import FACTORIES, PARAMS, Param, server_session_limit

HP_AND_HF = (True, False)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "storage_factory" not in metafunc.fixturenames:
        return
    modes = getattr(metafunc.cls, "history_modes", HP_AND_HF)
    # A module about one database (its files, its server) names it in storage_backends.
    backends = getattr(metafunc.module, "storage_backends", None)
    params = [p for p in PARAMS if backends is None or p.backend in backends]
    # Cells outside the class's modes are generated too, as skips with the reason, so
    # every report shows them.
    reason = getattr(metafunc.cls, "history_modes_reason", "no reason given")
    mode_name = {True: "history-preserving", False: "history-free"}
    cells = [p if p.keep_history in modes else pytest.param(
        p, marks=pytest.mark.skip(reason=f"{mode_name[p.keep_history]}: {reason}"), id=p.id)
        for p in params]
    metafunc.parametrize("storage_factory", cells, indirect=True, ids=[p.id for p in params])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        param = callspec.params.get("storage_factory") if callspec else None
        if not isinstance(param, Param) or item.cls is None:
            continue  # no cell, or an empty matrix (a module's backend not tested)
        needed = SERVER_SESSIONS_NEEDED.get(f"{item.cls.__name__}::{item.originalname}")
        if needed:
            limit = server_session_limit(param.backend)
            if limit is not None and limit < needed[0]:
                item.add_marker(pytest.mark.skip(
                    reason=f"{param.backend} server allows {limit} sessions"
                           f" (max_connections), this test needs about {needed[0]}: {needed[1]}"))
        if param.keep_history:
            continue
        reason = HISTORY_FREE_SKIPS.get(f"{item.cls.__name__}::{item.originalname}")
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
    factory = FACTORIES[param.backend](param, tmp_path)
    yield factory
    factory.cleanup()


def pytest_report_header(config: pytest.Config) -> list[str]:
    return ["zodbsql storage matrix: " + ", ".join(p.id for p in PARAMS)]
