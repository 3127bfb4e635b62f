"""doctor's own checks (``selfcheck``) report a storage that misbehaves, each with
what went wrong, not only one that works."""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import pytest
import ZODB
from ZODB.MappingStorage import MappingStorage
from ZODB.POSException import POSKeyError

import zodbsql
from zodbsql.atrest.codec import MAGIC
from tests.storage.test_blob_rows import rows
from zodbsql.backends.base.contract import ERROR, OK, Finding
from zodbsql.storage import selfcheck


class NoPack(MappingStorage):
    """A storage whose pack removes nothing."""

    def pack(self, t: float, referencesf: Any, gc: bool = True) -> None:
        pass


def test_each_check_reports_what_it_did_on_a_working_storage() -> None:
    db = ZODB.DB(MappingStorage())
    try:
        findings = [selfcheck._check(name, check, db) for name, check in selfcheck.CHECKS]
    finally:
        db.close()
    assert [(f.level, f.name, f.found) for f in findings] == [
        (OK, "check: store and load",
         "a 100 kB object written and read back by another connection"),
        (OK, "check: conflicts", "a conflict was detected and a resolvable one resolved"),
        (OK, "check: pack", "pack removed 1 unreachable object(s)")]


def finding_on(storage: Any, name: str, check: Any) -> Finding:
    """What one check reports on a database over ``storage``."""
    db = ZODB.DB(storage)
    try:
        return selfcheck._check(name, check, db)
    finally:
        db.close()


def test_a_pack_that_removes_nothing_is_an_error_naming_the_counts() -> None:
    finding = finding_on(NoPack(), "pack", selfcheck._pack)
    assert finding.level == ERROR and finding.name == "check: pack"
    assert finding.found == "AssertionError: pack left 2 of 2 objects"
    assert finding.fix == "see the error; the storage can't work on this database as it is"


def test_a_check_that_raises_is_an_error_but_an_interrupt_is_not_caught() -> None:
    def broken(db: Any) -> str:
        raise RuntimeError("the server went away")

    def interrupted(db: Any) -> str:
        raise KeyboardInterrupt

    finding = selfcheck._check("broken", broken, None)
    assert (finding.level, finding.name, finding.found) == (
        ERROR, "check: broken", "RuntimeError: the server went away")
    with pytest.raises(KeyboardInterrupt):
        selfcheck._check("interrupted", interrupted, None)


class AcceptsConflicts(MappingStorage):
    """A storage that stores over whatever revision is current: no conflict, ever."""

    def store(self, oid: bytes, serial: bytes, data: bytes, version: str,
              transaction: Any) -> Any:
        try:
            serial = self.load(oid)[1]
        except POSKeyError:
            pass
        return super().store(oid, serial, data, version, transaction)


def test_a_storage_that_accepts_conflicting_commits_is_an_error() -> None:
    finding = finding_on(AcceptsConflicts(), "conflicts", selfcheck._conflicts)
    assert (finding.level, finding.found) == (
        ERROR, "AssertionError: a conflicting commit was accepted")


def test_the_checks_run_on_the_scratch_database_with_the_sites_options(
        tmp_path: pathlib.Path) -> None:
    """doctor's checks write to the scratch database it gives them, with the site's
    options (compression here) but writable and with a schema whatever the site's."""
    site = zodbsql.open_storage(f"sqlite://{tmp_path}/site.sqlite")
    scratch = tmp_path / "scratch.sqlite"
    backend_options = dataclasses.replace(site.backend.options, path=str(scratch))
    options = site.options.replace(read_only=True, create_schema=False, compress="zstd",
                                   compress_threshold=0)
    site.close()
    findings = selfcheck.run_checks(backend_options, options)
    assert [f.level for f in findings] == [OK, OK, OK], findings
    db = zodbsql.open_db(f"sqlite://{scratch}", compress="zstd")
    try:
        with db.transaction() as conn:
            root = conn.root()
            assert root["data"]["payload"] == b"x" * 100_000
            assert root["counter"].value == 2
            assert root["plain"]["n"] == 1         # the first commit's; the second conflicted
            assert "garbage" not in root
        states = [bytes(state) for (state,) in rows(db.storage, "SELECT state FROM object_state")
                  if state is not None]
        # The 100 kB payload's record at least was compressed (small ones that would
        # not save over 8 bytes are stored as they are).
        assert any(state.startswith(MAGIC) and len(state) < 10_000 for state in states)
    finally:
        db.close()
