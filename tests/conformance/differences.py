"""Inherited tests that cannot apply to a history mode, with the reason.

Keys are ``Class::test``; the conftest skips them in the named mode and shows the reason
in the report.  Nothing inherited is overridden to pass.
"""
NEEDS_OLD_REVISIONS = (
    "loads old revisions with loadSerial before packing; a history-free storage keeps"
    " only the current revision")

HISTORY_FREE_SKIPS = {
    "TestPackable::testPackAllRevisions": NEEDS_OLD_REVISIONS,
    "TestPackable::testPackAllRevisionsNoGC": NEEDS_OLD_REVISIONS,
    "TestPackable::testPackJustOldRevisions": NEEDS_OLD_REVISIONS,
    "TestPackable::testPackOnlyOneObject": NEEDS_OLD_REVISIONS,
    # tests/conformance/test_external_gc.py
    "TestExternalGC::test_load_before_deletion": (
        "loads the revision a deletion replaced; a history-free storage drops it at once"),
    # tests/conformance/test_zodb_db_tests.py (ZODB.tests.testZODB)
    "ZODBTests::testMultipleUndoInOneTransaction": (
        "undoes five transactions; a history-free storage keeps no undo log"),
}
