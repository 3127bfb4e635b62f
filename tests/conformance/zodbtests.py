"""ZODB's ``testZODB.ZODBTests`` on a zodbsql storage.

ZODBTests builds a FileStorage in ``setUp``; this subclass takes the storage from the
``storage_factory`` fixture instead and runs everything else unchanged.  The module isn't
named ``test_*`` and the test module imports it as a module, so pytest never collects
ZODB's own FileStorage-based class.
"""
from __future__ import annotations

import unittest
from typing import Any

import ZODB
import ZODB.tests.util
from ZODB.tests import testZODB


class ZODBTestsOnSQL(testZODB.ZODBTests):
    def __init__(self, methodName: str, storage_factory: Any) -> None:
        super().__init__(methodName)
        self.storage_factory = storage_factory

    def setUp(self) -> None:
        # The base setUp's own setUp (temp dir, chdir, transaction.abort), then our storage.
        ZODB.tests.util.TestCase.setUp(self)
        self._storage = self.storage_factory.open()
        self._db = ZODB.DB(self._storage)


#: ZODB's classes run here, by their name in testZODB.  ReadConflictTests existed in
#: older ZODBs only; ZODB 6 has just ZODBTests (test_zodb_db_tests checks that).
ZODB_CLASSES: dict[str, type[unittest.TestCase]] = {"ZODBTests": ZODBTestsOnSQL}


def upstream_classes() -> set[str]:
    """The TestCase classes testZODB defines, to notice one we don't run."""
    return {name for name, cls in vars(testZODB).items()
            if isinstance(cls, type) and issubclass(cls, unittest.TestCase)
            and cls.__module__ == testZODB.__name__}


def method_names(cls: type[unittest.TestCase]) -> list[str]:
    return list(unittest.TestLoader().getTestCaseNames(cls))


def run_one(cls: type[unittest.TestCase], name: str, storage_factory: Any) -> unittest.TestResult:
    result = unittest.TestResult()
    cls(name, storage_factory).run(result)  # type: ignore[call-arg]
    return result
