"""The SQL trace (``sql-trace``, ``slow-statement``, ``slow-statement-explain``): what the
``zodbsql.sql`` logger gets, on every backend and mode."""
from __future__ import annotations

import logging
import re
from typing import Any

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping

LOGGER = "zodbsql.sql"


def commit_and_read(storage: Any) -> None:
    db = ZODB.DB(storage)
    try:
        tm = transaction.TransactionManager()
        conn = db.open(tm)
        tx = tm.begin()
        tx.note("traced commit")
        conn.root()["m"] = PersistentMapping(secret_value="do-not-log-me")
        tm.commit()
        conn.close()
        db.cacheMinimize()
        conn = db.open(tm)
        with tm:
            assert conn.root()["m"]["secret_value"] == "do-not-log-me"
        conn.close()
    finally:
        db.close()


def test_every_statement_is_logged_with_its_transaction(
        storage_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    storage = storage_factory.open(sql_trace=True)
    before = storage.statement_count()
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        commit_and_read(storage)
    sent = storage.statement_count() - before
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == sent, (len(lines), sent)
    assert all(" ms" in line and "parameters)" in line for line in lines)
    commit = [line for line in lines if "[commit " in line and "'traced commit'" in line]
    assert commit, lines
    assert any("COMMIT (" in line for line in commit), commit   # PostgreSQL: "...; COMMIT"
    # The label ends with the commit: what follows (the next poll) is not counted to it.
    labelled = [number for number, line in enumerate(lines) if "'traced commit'" in line]
    assert labelled == list(range(labelled[0], labelled[-1] + 1)), lines
    assert "COMMIT (" in lines[labelled[-1]], lines[labelled[-1]:]
    assert all(re.search(r" \[(commit [0-9a-f]+|snapshot 0x[0-9a-f]{16}|no transaction)[]' ]",
                         line) for line in lines), lines
    if "sqlite" in type(storage.shared.backend).__module__:
        # The read transaction a poll ends (SQLite reads inside one).
        assert any(" ms: ROLLBACK (" in line for line in lines), lines
    assert any("[snapshot 0x" in line for line in lines)
    assert not any("do-not-log-me" in line for line in lines)
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == LOGGER)


def test_off_by_default_logs_nothing(storage_factory: Any,
                                     caplog: pytest.LogCaptureFixture) -> None:
    storage = storage_factory.open()
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        commit_and_read(storage)
    assert [r for r in caplog.records if r.name == LOGGER] == []
    assert storage.shared.tracer is None


def test_slow_statements_are_logged_with_their_plan(
        storage_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    # A threshold of 0 makes every statement slow: each select gets a plan.
    storage = storage_factory.open(slow_statement=0.0, slow_statement_explain=True)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        commit_and_read(storage)
    slow = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert slow and all(line.startswith("slow statement (over 0 s): ") for line in slow)
    planned = [line for line in slow if "SELECT" in line.split(":", 2)[-1][:400]
               and "\n    " in line]
    assert planned, slow[:5]
    # The commit went through although every statement was explained.
    assert not any("failed" in line for line in slow)


def test_slow_statement_threshold_holds(storage_factory: Any,
                                        caplog: pytest.LogCaptureFixture) -> None:
    storage = storage_factory.open(slow_statement=60.0)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        commit_and_read(storage)
    assert [r for r in caplog.records if r.name == LOGGER] == []


def test_a_negative_threshold_is_refused() -> None:
    from zodbsql.errors import ConfigurationError
    from zodbsql.options import Options
    with pytest.raises(ConfigurationError, match="slow-statement must be 0 or more"):
        Options(slow_statement=-1.0)
