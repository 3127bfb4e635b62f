"""Points inside a commit (or a pack) where a writer stops for the parent to kill it.

Each phase wraps one method of the storage's backend roles (or of the storage) in the
child process only.  At the ``at``-th passage the wrapper prints ``phase NAME`` and
sleeps ``hold`` seconds; the parent's SIGKILL lands there.  Where each one stops:

* ``store``: the transaction's objects are buffered in memory, nothing sent.
* ``vote``: states staged and row locks taken, or (SQLite, ``writes_at_vote``) the
  tid taken and the states written; the database transaction is open.
* ``finish``: tid allocated, states moved into place; COMMIT not sent yet.
* ``blob``: a blob's first chunk uploaded, the rest not yet (database layout).
* ``pack``: one batch of a pack deleted, its short transaction not committed.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable, Iterable, Iterator

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.storage import SQLStorage
from zodbsql.storage.commit import PendingCommit

PHASES = ("store", "vote", "finish", "blob", "pack")


class Stopper:
    """Counts passages; at the chosen one, announces it and sleeps."""

    def __init__(self, name: str, at: int, hold: float, say: Callable[..., None]) -> None:
        self.name = name
        self.at = at
        self.hold = hold
        self.say = say
        self.passages = 0

    def passage(self) -> None:
        self.passages += 1
        if self.passages == self.at:
            self.say("phase", self.name)
            time.sleep(self.hold)

    def after(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` followed by a passage."""
        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            self.passage()
            return result
        return wrapper

    def chunks(self, pieces: Iterable[bytes]) -> Iterator[bytes]:
        """``pieces``, with a passage once the first one was taken."""
        for number, piece in enumerate(pieces):
            if number == 1:
                self.passage()
            yield piece


def arm(storage: SQLStorage, phase: str, at: int, hold: float,
        say: Callable[..., None]) -> None:
    """Install the hook of ``phase`` on ``storage`` (and every instance of it)."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    stopper = Stopper(phase, at, hold, say)
    backend = storage.shared.backend
    if phase == "store":
        # Instances are made per ZODB connection: patch the class (this process only).
        SQLStorage.store = stopper.after(SQLStorage.store)  # type: ignore[method-assign]
    elif phase == "vote":
        # A commit passes one of the two: staging, or writing its states at vote.
        backend.locker.stage_and_lock = stopper.after(  # type: ignore[method-assign]
            backend.locker.stage_and_lock)
        backend.mover.write_states = stopper.after(  # type: ignore[method-assign]
            backend.mover.write_states)
    elif phase == "finish" and backend.features.writes_at_vote:
        # The backend's finish ran in vote; finish's last step before COMMIT is this.
        PendingCommit._raise_oid_counter = stopper.after(  # type: ignore[method-assign]
            PendingCommit._raise_oid_counter)
    elif phase == "finish":
        backend.txncontrol.finish = stopper.after(  # type: ignore[method-assign]
            backend.txncontrol.finish)
    elif phase == "blob":
        upload = backend.blobs.upload

        def slow_upload(conn: ConnectionRole, content_hash: bytes, size: int,
                        chunks: Iterator[bytes]) -> int:
            return upload(conn, content_hash, size, stopper.chunks(chunks))
        backend.blobs.upload = slow_upload  # type: ignore[method-assign]
    elif phase == "pack":
        packer = backend.packer
        packer.delete_objects = stopper.after(  # type: ignore[method-assign]
            packer.delete_objects)
        packer.delete_old_revisions = stopper.after(  # type: ignore[method-assign]
            packer.delete_old_revisions)
