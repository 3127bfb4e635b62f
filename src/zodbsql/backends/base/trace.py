"""The SQL trace: statements logged to ``zodbsql.sql`` with their duration and the ZODB
transaction they belong to.

Off by default, and then free: a connection without a tracer checks one attribute per
statement.  ``sql-trace`` logs every statement at DEBUG; ``slow-statement`` (seconds)
logs at WARNING only those that took longer, with the server's plan when
``slow-statement-explain`` is on (EXPLAIN on PostgreSQL and MySQL, EXPLAIN QUERY PLAN
on SQLite, asked on the same session right after the statement, never for COMMIT or
statements that changed the session).  Parameters are not logged, only their number:
states are large and may hold what a log must not.
"""
from __future__ import annotations

import contextvars
import logging
import time
from typing import Any, Callable, Sequence

log = logging.getLogger("zodbsql.sql")

#: What the statements of this thread belong to: "commit <transaction>" between
#: tpc_begin and tpc_finish/abort, "snapshot 0x..." for the loads of a snapshot.
context: contextvars.ContextVar[str] = contextvars.ContextVar("zodbsql_sql_context",
                                                              default="")
#: The characters of a statement that go into the log.
SHOWN = 400
#: Statements that are asked no plan: they end or shape the session, or can't be explained.
NO_PLAN = ("COMMIT", "ROLLBACK", "BEGIN", "START", "SET", "SAVEPOINT", "RELEASE", "LOCK",
           "CREATE", "DROP", "ALTER", "PRAGMA", "SHOW", "EXPLAIN", "CALL", "LISTEN",
           "NOTIFY", "UNLISTEN", "SELECT PG_", "DO ", "TRUNCATE", "ANALYZE", "VACUUM")


def shorten(sql: str) -> str:
    flat = " ".join(sql.split())
    return flat if len(flat) <= SHOWN else flat[:SHOWN] + "..."


class Tracer:
    """One storage's trace settings; set on each connection the storage uses."""

    def __init__(self, every: bool, slow: float | None, explain: bool, storage: str) -> None:
        self.every = every
        self.slow = slow
        self.explain = explain
        self.storage = storage

    @staticmethod
    def start() -> float:
        return time.perf_counter()

    def done(self, where: str, sql: str, params: Sequence[Any] | None, started: float,
             error: BaseException | None = None,
             plan: Callable[[str, Sequence[Any] | None], list[str]] | None = None) -> None:
        """Log a statement that ran from ``started`` until now."""
        took = time.perf_counter() - started
        slow = self.slow is not None and took >= self.slow
        if not (slow or (self.every and log.isEnabledFor(logging.DEBUG))):
            return
        label = context.get() or "no transaction"
        count = len(params) if params else 0
        outcome = f" failed: {type(error).__name__}" if error is not None else ""
        server = self.storage if where == self.storage else f"{self.storage} via {where}"
        text = (f"{server} [{label}] {took * 1000:.3f} ms{outcome}:"
                f" {shorten(sql)} ({count} parameters)")
        if not slow:
            log.debug("%s", text)
            return
        lines = []
        if self.explain and plan is not None and error is None and explainable(sql):
            try:
                lines = plan(sql, params)
            except Exception as exc:  # a plan is a courtesy: never fail the statement
                lines = [f"(no plan: {type(exc).__name__}: {shorten(str(exc))})"]
        log.warning("slow statement (over %g s): %s%s", self.slow, text,
                    "".join(f"\n    {line}" for line in lines))


def explainable(sql: str) -> bool:
    head = sql.lstrip().upper()
    return not head.startswith(NO_PLAN)
