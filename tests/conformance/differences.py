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
    # tests/conformance/test_atrest_suites.py
    "TestPackableCompressed::testPackAllRevisions": NEEDS_OLD_REVISIONS,
    "TestPackableCompressed::testPackAllRevisionsNoGC": NEEDS_OLD_REVISIONS,
    "TestPackableCompressed::testPackJustOldRevisions": NEEDS_OLD_REVISIONS,
    "TestPackableCompressed::testPackOnlyOneObject": NEEDS_OLD_REVISIONS,
    "TestPackableEncrypted::testPackAllRevisions": NEEDS_OLD_REVISIONS,
    "TestPackableEncrypted::testPackAllRevisionsNoGC": NEEDS_OLD_REVISIONS,
    "TestPackableEncrypted::testPackJustOldRevisions": NEEDS_OLD_REVISIONS,
    "TestPackableEncrypted::testPackOnlyOneObject": NEEDS_OLD_REVISIONS,
    # tests/conformance/test_external_gc.py
    "TestExternalGC::test_load_before_deletion": (
        "loads the revision a deletion replaced; a history-free storage drops it at once"),
    # tests/conformance/test_zodb_db_tests.py (ZODB.tests.testZODB)
    "ZODBTests::testMultipleUndoInOneTransaction": (
        "undoes five transactions; a history-free storage keeps no undo log"),
}

#: Inherited tests that need more concurrent server sessions than a small server allows:
#: ``Class::test`` -> (sessions needed, why).  For a networked backend the conftest
#: skips them only when the server's own limit (``max_connections``) is lower, and
#: names both numbers; on a server configured for them they run.
RACE_SESSIONS = (
    "runs 64 threads that each open their own storage and DB at once; each holds a"
    " root session, a ZODB connection's load session, a commit session and, on"
    " PostgreSQL history-preserving, the session listening for commits (about 250"
    " sessions in all; the same test with 16 threads peaks at 64 and passes)")
SERVER_SESSIONS_NEEDED = {
    "TestBasicStorage::test_race_external_invalidate_vs_disconnect": (264, RACE_SESSIONS),
    # The same suite with the cache levels on (test_cache_levels.py): the persistent
    # cache's read-back opens one more session per storage for a moment.
    "TestBasicPersistentCache::test_race_external_invalidate_vs_disconnect": (
        328, RACE_SESSIONS + ", and the read-back of each storage's cache file one more"),
    "TestBasicRedisCache::test_race_external_invalidate_vs_disconnect": (264, RACE_SESSIONS),
    # Records compressed or encrypted (test_atrest_suites.py).
    "TestBasicCompressed::test_race_external_invalidate_vs_disconnect": (264, RACE_SESSIONS),
    "TestBasicEncrypted::test_race_external_invalidate_vs_disconnect": (264, RACE_SESSIONS),
}

#: ZODB's reusable blob suite (``ZODB.tests.testblob.storage_reusable_suite``): parts
#: that apply only to some cells of backend x history mode x blob layout, with why.
BLOB_PACKING_APPLIES = (
    "blob_packing.txt checks, after each pack, which per-revision files exist at"
    " fshelper.getBlobFilename(oid, tid): it applies to the shared blob directory"
    " (one file per revision) in history-preserving mode.  The database layout keeps"
    " content-addressed cache files, not per-revision files; history-free mode keeps"
    " no old revisions to pack away one by one")
BLOB_UNDO_APPLIES = "BlobUndoTests undo transactions; a history-free storage keeps no undo log"

#: Doctest examples left out when the tests run as root, keyed by file: the source of
#: the example, and why it cannot pass for any storage then.
BLOB_EXAMPLES_AS_ROOT = {
    "blob_transaction.txt": (
        "open(blob.committed(), 'w')",
        "expects PermissionError opening a read-only committed blob file for writing;"
        " root may open any file for writing (the file is 0444, checked by"
        " test_blob_file_permissions)"),
}
