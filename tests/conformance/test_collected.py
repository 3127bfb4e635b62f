"""Guards against conformance tests silently running nothing, and interface claims.

ZODB 6 renamed its suites' ``check*`` methods to ``test*``; another rename would leave
our classes collecting no inherited tests and still passing.  The minimum counts are
what ZODB 6.4 provides; raise them when ZODB adds tests, lower them only on purpose.
"""
from __future__ import annotations

import inspect

import pytest
import zope.interface
from zope.interface.verify import verifyObject
from ZODB.interfaces import IStorageUndoable

from tests.conformance import test_zodb_suites
from tests.conformance.suite import StorageSuite

MIN_TESTS: dict[str, int] = {
    "TestBasicStorage": 19,
    "TestSynchronization": 7,
    "TestMTStorage": 5,
    "TestPersistentStorage": 1,
    "TestReadOnlyStorage": 2,
    "TestConflictResolution": 4,
    "TestConflictResolutionUndo": 2,
    "TestRevisionStorage": 7,
    "TestHistoryStorage": 1,
    "TestIteratorStorage": 9,
    "TestTransactionalUndo": 18,
    "TestPackable": 11,
    "TestPackableUndo": 3,
    "TestMVCC": 3,
    "TestRecoveryToFileStorage": 5,
    "TestRecoveryToSameBackend": 5,
}

SUITE_CLASSES = {name: cls for name, cls in vars(test_zodb_suites).items()
                 if inspect.isclass(cls) and issubclass(cls, StorageSuite)
                 and cls is not StorageSuite}


def _test_names(cls: type) -> list[str]:
    # What pytest collects from a class: callables named test* (python_functions default).
    return [name for name in dir(cls) if name.startswith("test") and callable(getattr(cls, name))]


def test_every_suite_class_has_a_minimum() -> None:
    assert sorted(SUITE_CLASSES) == sorted(MIN_TESTS)


@pytest.mark.parametrize("name", sorted(MIN_TESTS))
def test_suite_class_collects_zodb_tests(name: str) -> None:
    cls = SUITE_CLASSES[name]
    zodb_bases = [base for base in cls.__bases__ if base.__module__.startswith("ZODB.")]
    assert zodb_bases, f"{name} mixes in no ZODB suite"
    for base in zodb_bases:
        assert _test_names(base), f"{base.__module__}.{base.__name__} has no test* methods"
    assert len(_test_names(cls)) >= MIN_TESTS[name], _test_names(cls)


def _verify_claims(storage: object) -> list[zope.interface.interface.InterfaceClass]:
    claimed = list(zope.interface.providedBy(storage).flattened())
    for iface in claimed:
        verifyObject(iface, storage)
    return claimed


def test_storage_interfaces(storage_factory) -> None:
    storage = storage_factory.open()
    instance = storage.new_instance()
    try:
        for obj in (storage, instance):
            claimed = _verify_claims(obj)
            # Undo needs history: only a history-preserving storage may claim it.
            assert (IStorageUndoable in claimed) == storage_factory.param.keep_history, claimed
    finally:
        instance.release()
