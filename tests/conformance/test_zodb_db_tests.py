"""ZODB's database-level tests (``ZODB.tests.testZODB``) over backend x history mode.

Each method runs alone through unittest; its failures and errors become the pytest
failure text and a unittest skip becomes a pytest skip.  Methods that can't apply to
history-free storage are listed in ``differences.HISTORY_FREE_SKIPS``.
"""
from __future__ import annotations

import pytest

from tests.conformance import zodbtests
from tests.conformance.differences import HISTORY_FREE_SKIPS

CASES = [(cls_name, name) for cls_name, cls in zodbtests.ZODB_CLASSES.items()
         for name in zodbtests.method_names(cls)]


def test_cases_collected() -> None:
    # An empty list would make the parametrized test below vanish without a failure.
    assert len(CASES) >= 11, CASES
    # A class testZODB gains (or regains, like ReadConflictTests) must be added here.
    assert zodbtests.upstream_classes() == set(zodbtests.ZODB_CLASSES)


@pytest.mark.parametrize("cls_name,name", CASES, ids=[f"{c}.{n}" for c, n in CASES])
def test_zodb(cls_name: str, name: str, storage_factory) -> None:
    reason = HISTORY_FREE_SKIPS.get(f"{cls_name}::{name}")
    if reason and not storage_factory.param.keep_history:
        pytest.skip(f"history-free: {reason}")
    result = zodbtests.run_one(zodbtests.ZODB_CLASSES[cls_name], name, storage_factory)
    problems = result.failures + result.errors
    assert not problems, "\n".join(text for _, text in problems)
    if result.skipped:
        pytest.skip(result.skipped[0][1])
    assert result.testsRun == 1
