"""The storage matrix leaves no cell out silently: narrowing the backends or history
modes of a test needs a reason, and the cells outside become skips that give it."""
from __future__ import annotations

import types
from typing import cast

import pytest

from tests.conftest import narrowed


def test_narrowing_without_a_reason_is_refused() -> None:
    holder = types.SimpleNamespace(history_modes=(True,))
    with pytest.raises(TypeError, match="history_modes_reason"):
        narrowed(holder, "history_modes")
    holder.history_modes_reason = "why"
    assert narrowed(holder, "history_modes") == (True,)
    assert narrowed(types.SimpleNamespace(), "storage_backends") is None


class TestHistoryPreservingOnly:
    history_modes = (True,)
    history_modes_reason = "shows the cells a class leaves out"

    def test_cells(self, request: pytest.FixtureRequest, storage_factory) -> None:
        assert storage_factory.param.keep_history


def test_every_cell_is_collected(request: pytest.FixtureRequest) -> None:
    """The class above collects a history-free cell per backend, marked skipped."""
    from tests.databases import PARAMS
    # The class's test functions (a pytest.Function has the callspec).
    items = [cast(pytest.Function, item) for item in request.session.items
             if item.nodeid.startswith(f"{__name__.replace('.', '/')}.py::"
                                       "TestHistoryPreservingOnly")]
    if not items:
        pytest.skip("TestHistoryPreservingOnly is not collected in this run (-k, a node id)")
    assert sorted(item.callspec.id for item in items) == sorted(p.id for p in PARAMS)
    skipped = {item.callspec.id: [m.kwargs["reason"] for m in item.iter_markers("skip")]
               for item in items}
    for param in PARAMS:
        if param.keep_history:
            assert not skipped[param.id]
        else:
            assert skipped[param.id] == ["history-free: shows the cells a class leaves out"]
