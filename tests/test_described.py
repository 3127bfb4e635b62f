"""What log lines say of an exception: ``errors.described``, and the log calls that use it."""
from __future__ import annotations

import logging

import pytest

from zodbsql.errors import described
from zodbsql.storage import records

SECRET = "pa55w0rd"


def test_the_first_line_with_secrets_masked() -> None:
    exc = ValueError(f"cannot connect to postgresql://zodb:{SECRET}@db/zodb\nDETAIL: more")
    assert described(exc) == "cannot connect to postgresql://zodb:***@db/zodb"
    assert described(RuntimeError()) == "RuntimeError()"


def test_a_logged_failure_keeps_no_exception(caplog: pytest.LogCaptureFixture) -> None:
    # A record whose second pickle ZODB's reader can't parse (a persistent reference
    # with nothing before it): its references are logged as unreadable.
    broken = b"\x80\x03cmod\nName\n.\x80\x03Q"
    with caplog.at_level(logging.WARNING, logger="zodbsql"):
        assert records.references(7, broken) == set()
    [record] = [each for each in caplog.records if "references of oid" in each.getMessage()]
    # A record that held the exception held its traceback and every frame on it.
    assert not any(isinstance(arg, BaseException) for arg in record.args or ())
    assert record.exc_info is None
    assert "0x0000000000000007" in record.getMessage()
