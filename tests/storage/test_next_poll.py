"""``zodb_polls_next``: which caller of a storage's ``afterCompletion`` polls right
after it.  ZODB's own callers are covered by the statement counts of test_wakeup.py and
test_round_trips.py; these are the callers ZODB's tests never make."""
from __future__ import annotations

import threading
from typing import Any

import pytest
from ZODB.Connection import Connection

from zodbsql.storage.next_poll import zodb_polls_next


class Answering:
    """A storage's ``afterCompletion`` that records what ``zodb_polls_next`` says."""

    def __init__(self) -> None:
        self.answers: list[bool] = []

    def afterCompletion(self) -> None:
        self.answers.append(zodb_polls_next())


class OldConnection:
    """A connection of a ZODB without ``explicit_transactions``."""

    def __init__(self, storage: Answering) -> None:
        self._storage = storage


def test_a_connection_without_explicit_transactions_is_not_trusted_to_poll() -> None:
    storage = Answering()
    # ZODB's own code, on a connection that lacks the attribute (it fails reading it,
    # after the storage answered).
    with pytest.raises(AttributeError):
        Connection.afterCompletion(OldConnection(storage), None)
    assert storage.answers == [False]


class Answer(threading.Thread):
    """A thread whose own ``run`` asks: the shallowest stack Python gives, where the
    frames above the asker end within those looked at."""

    answer: bool | None = None

    def run(self) -> None:
        self.answer = zodb_polls_next()


def test_a_shallow_stack_is_not_zodb() -> None:
    thread = Answer()
    thread.start()
    thread.join()
    assert thread.answer is False


def test_any_other_caller_is_not_zodb() -> None:
    storage = Answering()

    def close(connection: Any) -> None:
        connection._storage.afterCompletion()

    close(OldConnection(storage))
    assert storage.answers == [False]


class Wrapping:
    """A storage wrapping another (as zc.zlibstorage wraps one): its
    ``afterCompletion`` delegates, a frame between ZODB's caller and the storage's."""

    def __init__(self, base: Any) -> None:
        self.base = base

    def afterCompletion(self) -> None:
        self.base.afterCompletion()


class PollingConnection:
    """What ZODB's ``Connection.afterCompletion`` reads of its connection: one whose
    transaction manager is not explicit polls (``newTransaction``) right after."""

    def __init__(self, storage: Any, explicit: bool) -> None:
        self._storage = storage
        self.explicit_transactions = explicit
        self.polls = 0
        self._cache = self

    def newTransaction(self, transaction: Any, sync: bool) -> None:
        self.polls += 1

    def incrgc(self) -> None:
        pass


@pytest.mark.parametrize("wrappers", [0, 1, 2])
def test_zodb_is_found_through_wrapping_storages(wrappers: int) -> None:
    storage = Answering()
    outer: Any = storage
    for _ in range(wrappers):
        outer = Wrapping(outer)
    polling = PollingConnection(outer, explicit=False)
    Connection.afterCompletion(polling, None)
    assert storage.answers == [True] and polling.polls == 1
    explicit = PollingConnection(outer, explicit=True)
    Connection.afterCompletion(explicit, None)
    assert storage.answers == [True, False] and explicit.polls == 0


def test_wrappers_deeper_than_looked_at_end_the_read_transaction_at_once() -> None:
    # Past the frames looked at, ZODB is not found: the answer is the safe one.
    storage = Answering()
    outer: Any = storage
    for _ in range(5):
        outer = Wrapping(outer)
    polling = PollingConnection(outer, explicit=False)
    Connection.afterCompletion(polling, None)
    assert storage.answers == [False] and polling.polls == 1
