"""ZODB's reusable blob suite over backend x history mode x blob layout.

``ZODB.tests.testblob.storage_reusable_suite`` (doctests blob_connection.txt,
blob_importexport.txt, blob_transaction.txt, blob_packing.txt, the module's doctests,
RecoveryBlobStorage, BlobUndoTests) runs against a storage the ``storage_factory``
fixture opens, each ``create_storage`` call on a new empty database.  The suite runs in
three parts (packing, undo and the rest), so that a part which applies only to some
cells is reported skipped with its reason (data in ``differences``) in the others.
"""
from __future__ import annotations

import os
import unittest
from typing import Any, Iterator

import pytest
from ZODB.tests.testblob import storage_reusable_suite

from tests.conformance.differences import (BLOB_EXAMPLES_AS_ROOT, BLOB_PACKING_APPLIES,
                                           BLOB_UNDO_APPLIES)

LAYOUTS = ("database", "shared")
#: The parts of the suite that apply to some cells only: what their test ids contain.
PARTS = {"packing": "blob_packing", "undo": "BlobUndoTests"}


def part_of(test: unittest.TestCase) -> str:
    return next((part for part, mark in PARTS.items() if mark in test.id()), "rest")


def not_applying(part: str, layout: str, keep_history: bool) -> str | None:
    """Why a part of the suite does not apply to a cell (None: it does)."""
    if part == "packing" and not (layout == "shared" and keep_history):
        return BLOB_PACKING_APPLIES
    if part == "undo" and not keep_history:
        return BLOB_UNDO_APPLIES
    return None


def blob_suite(storage_factory: Any, layout: str, **options: Any) -> unittest.TestSuite:
    """The suite on new databases of the cell, opened with ``options`` too."""
    keep_history = storage_factory.param.keep_history

    def factory(name: str, blob_dir: str) -> Any:
        return storage_factory.open_other(blob_dir=os.path.abspath(blob_dir),
                                          shared_blob_dir=layout == "shared", **options)

    return storage_reusable_suite(
        f"{storage_factory.param.id}-{layout}-", factory,
        test_blob_storage_recovery=True,
        test_packing=layout == "shared" and keep_history,
        test_undo=keep_history)


def leaves(suite: unittest.TestSuite) -> Iterator[unittest.TestCase]:
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            yield from leaves(test)
        else:
            yield test


def drop_root_examples(test: unittest.TestCase) -> list[str]:
    """As root, leave out the examples BLOB_EXAMPLES_AS_ROOT names; return the reasons."""
    dt = getattr(test, "_dt_test", None)
    if dt is None or os.geteuid() != 0:
        return []
    entry = BLOB_EXAMPLES_AS_ROOT.get(os.path.basename(dt.filename or ""))
    if entry is None:
        return []
    source, reason = entry
    kept = [ex for ex in dt.examples if source not in ex.source]
    if len(kept) == len(dt.examples):
        raise AssertionError(f"{dt.name}: no example {source!r} to leave out any more")
    dt.examples = kept
    return [reason]


def run_suite(suite: unittest.TestSuite,
              part: str) -> tuple[unittest.TestResult, list[str], list[str]]:
    """Run each test of ``part`` inside the suite's layer (ZODB's
    MonotonicallyIncreasingTime)."""
    layer = getattr(suite, "layer", None)
    result = unittest.TestResult()
    names, notes = [], []
    for test in leaves(suite):
        if part_of(test) != part:
            continue
        names.append(test.id())
        notes.extend(drop_root_examples(test))
        if layer is not None:
            layer.testSetUp()
        try:
            test.run(result)
        finally:
            if layer is not None:
                layer.testTearDown()
    return result, names, notes


@pytest.mark.parametrize("part", ["rest", *PARTS])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_zodb_blob_suite(storage_factory, layout: str, part: str, tmp_path, monkeypatch,
                         capsys) -> None:
    keep_history = storage_factory.param.keep_history
    reason = not_applying(part, layout, keep_history)
    if reason:
        pytest.skip(reason)
    monkeypatch.chdir(tmp_path)
    suite = blob_suite(storage_factory, layout)
    result, names, notes = run_suite(suite, part)
    problems = result.failures + result.errors
    assert not problems, "\n".join(f"{test.id()}\n{text}" for test, text in problems)
    assert result.testsRun > 0 and result.testsRun == len(names)
    with capsys.disabled():
        print(f"\n  blob suite {storage_factory.param.id}-{layout} {part}: {result.testsRun}"
              f" run, {len(result.skipped)} skipped"
              + (f"; left out as root: {len(notes)} example(s)" if notes else ""))
