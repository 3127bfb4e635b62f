"""One exception hierarchy for zodbsql, and its retry taxonomy.

Driver errors are translated at the backend boundary into these classes, keeping the
original as ``__cause__``; each backend classifies them by SQLSTATE, error number or
SQLite result code, never by message text.  Where ZODB has an error with the same
meaning, ours derives from it, so ``transaction``'s retry loop (``attempts()``, Zope's
publisher) treats them as it should.  The same on every backend:

=============================  ==========================  =========================
what happened                  raised                      retry the transaction?
=============================  ==========================  =========================
another commit changed what    ``ConflictError`` /         yes (a ``TransientError``)
this one wrote or read-current ``ReadConflictError``
the database cancelled this    ``DatabaseConflict`` (a     yes
commit to break a deadlock or  ``ConflictError``)
a serialization failure
a lock not granted within      ``CommitLockTimeout``       yes; the message names the
commit-/row-lock-timeout                                   setting
  of which, another commit      ``RowLockTimeout`` (also a  yes, like any conflict
  holding an object's row       ``ConflictError``)
the server restarted or failed ``ServerChangedConflict`` (a yes: the retry's poll
over since the snapshot (seen  ``ConflictError``)          drops what was cached
at vote)                                                   before
the connection went away and   ``ConnectionLost``          yes
nothing was committed
the connection went away while ``CommitOutcomeUnknown``    no: find out first (the
COMMIT was in flight and the                               message names the tid)
outcome could not be learned
anything else                  ``DatabaseError``           no
=============================  ==========================  =========================
"""
from __future__ import annotations

import transaction.interfaces
from ZODB import POSException

from zodbsql.masking import mask_secrets


class ZodbsqlError(Exception):
    """Base class of every error zodbsql raises itself."""


class ConfigurationError(ZodbsqlError, ValueError):
    """An option or a DSN is wrong; the message names it."""


class DriverNotFound(ZodbsqlError, ImportError):
    """No database driver could be loaded; the message lists each one tried."""


class SchemaError(ZodbsqlError, POSException.StorageError):
    """The database does not hold a zodbsql schema this storage can use.

    Raised for a foreign database, another schema version, the other history mode or a
    missing schema with schema creation turned off.  Nothing has been written when it
    is raised.
    """


class DatabaseError(ZodbsqlError, POSException.StorageError):
    """The database server or file reported an error; ``statement`` is the SQL sent."""

    def __init__(self, message: str, statement: str | None = None) -> None:
        if statement:
            message = f"{message}\n  statement: {' '.join(statement.split())[:500]}"
        super().__init__(message)
        self.statement = statement


class ConnectionLost(DatabaseError, transaction.interfaces.TransientError):
    """The connection to the database went away; a retried transaction reconnects."""


class CommitOutcomeUnknown(ZodbsqlError, POSException.StorageError):
    """The connection was lost while COMMIT was in flight and the database could not be
    asked afterwards whether transaction ``tid`` was committed (None: COMMIT went with the
    step that allocates the tid, whose answer was lost too; the message says what to
    look for instead).

    Never retryable: the transaction may be in the database already, and running it
    again could apply it twice.
    """

    def __init__(self, message: str, tid: int | None) -> None:
        super().__init__(message)
        self.tid = tid


class DatabaseConflict(ZodbsqlError, POSException.ConflictError):
    """The database rolled this commit back to settle a conflict with a concurrent one
    (a deadlock victim, a serialization or cluster certification failure); retryable."""


class DeadlockError(DatabaseConflict):
    """The database chose this commit as the victim of a lock deadlock."""


class ServerChangedConflict(DatabaseConflict):
    """The server restarted or failed over after the committing transaction's snapshot
    was taken: what it read may be gone (a MySQL crash loses commits other sessions
    already saw).  A ``ConflictError``: a retry starts from a fresh snapshot."""


class CommitLockTimeout(POSException.StorageTransactionError,
                        transaction.interfaces.TransientError, ZodbsqlError):
    """The commit lock (or a row lock) was not granted within its configured timeout."""


class RowLockTimeout(CommitLockTimeout, POSException.ConflictError):
    """Another commit held the row lock of an object this one changes for longer than
    row-lock-timeout.

    That commit is changing the same object, so this one is in conflict with it: a
    ``ConflictError`` too, which the code that handles conflicts (a retry loop that
    catches ``ConflictError``, as RelStorage's row-lock timeout is one) retries.
    """


class CorruptRecordError(ZodbsqlError, POSException.StorageError):
    """A stored state does not match the checksum written with it."""

    def __init__(self, oid: int, tid: int, detail: str) -> None:
        super().__init__(f"corrupt record for oid 0x{oid:016x} tid 0x{tid:016x}: {detail}")
        self.oid = oid
        self.tid = tid


class BlobContentVanished(ZodbsqlError, POSException.ConflictError):
    """A blob's content that vote found in the database was freed by a concurrent pack
    before the commit finished; retrying the transaction uploads it again."""

    def __init__(self, message: str, oid: bytes | None = None) -> None:
        POSException.ConflictError.__init__(self, message, oid=oid)


class RecordKeyError(ZodbsqlError, POSException.StorageError):
    """A record (or the storage's configuration) needs an encryption key that is not
    configured, or the configured key with that id is not the one the database knows.

    The message names the key id, never the key.  Raised before anything is written.
    """

    def __init__(self, message: str, key_id: str) -> None:
        super().__init__(message)
        self.key_id = key_id


def described(exc: BaseException) -> str:
    """What a log line says of ``exc``: its message's first line, secrets masked (its
    repr when it has no message).  A log call is given this text, never the exception:
    a handler that keeps records (a test's capture, a buffering handler) kept the
    exception's traceback with it, its frames, and what they held, such as storages
    and their open read transactions, which a test's DROP SCHEMA then waited for."""
    text = str(exc).strip()
    return mask_secrets(text.splitlines()[0] if text else repr(exc))
