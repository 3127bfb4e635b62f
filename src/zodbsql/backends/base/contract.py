"""The backend contract: one ``Protocol`` per role, and the rows the roles hand back.

The storage core (``zodbsql.storage``) and the roles themselves see a backend only
through these types; ``backends/base/`` holds the portable implementation of each role
(``Locker`` is a ``LockerRole``, ``Mover`` a ``MoverRole``, ...) and every backend
subclasses those, overriding what its dialect does differently.  This module imports
nothing of zodbsql's, so every role module can depend on it without an import cycle.

Every method of a role may raise what its connection raises: :class:`DatabaseError`
for an error the database reported (with the statement), its subclass
:class:`ConnectionLost` when the connection went away (retryable), and, where a lock
is waited for, :class:`CommitLockTimeout` or :class:`DatabaseConflict` /
:class:`DeadlockError` (all in :mod:`zodbsql.errors`).  The docstrings below name
these only where the method itself is the reason, and name every other exception.

Oids and tids are Python ints (signed 64-bit in the database); a state is ``bytes`` or
None for a deleted object; a checksum is the signed 64-bit value of
:func:`zodbsql.storage.records.checksum`, or None when the state is None.
"""
from __future__ import annotations

import dataclasses
from typing import (Any, Callable, ClassVar, ContextManager, Final, Iterable, Iterator,
                    Mapping, NamedTuple, Protocol, Sequence)

# -- rows -----------------------------------------------------------------------------------


class StateRow(NamedTuple):
    """One stored revision of an object, as loaded."""

    tid: int
    checksum: int | None
    state: bytes | None     # None: the object was deleted in this revision


class LoadedState(NamedTuple):
    """One object's revision loaded with others (prefetch): which object, and the rest
    as :class:`StateRow`."""

    oid: int
    tid: int
    checksum: int | None
    state: bytes | None


#: A state a commit stages in vote (``temp_store``): ``(oid, prev_tid, data_tid,
#: checksum, size, state, refs)``.  ``prev_tid``: the tid the commit expects to be
#: current (0: a new object); ``data_tid``: the revision this state copies (undo,
#: restore), or None; ``size``: of the state as stored (0 for a deletion, whose state is
#: None); ``refs``: the oids the state refers to, ascending, as a JSON array's text
#: (``records.references_text``), or None when it refers to none.  A plain tuple, not a
#: NamedTuple: vote makes one per stored object, and sqlite3 binds an exact tuple faster
#: than a subclass (10,000 rows: ~10 ms less, made and bound).
StagedState = tuple[int, int, "int | None", "int | None", int, "bytes | None", "str | None"]
#: The positions of ``StagedState``'s fields that are read by name.
STAGED_OID: Final = 0
STAGED_SIZE: Final = 4
STAGED_STATE: Final = 5


class ResolvedState(NamedTuple):
    """A state that replaces a staged one after conflict resolution."""

    oid: int
    prev_tid: int
    checksum: int | None
    size: int
    state: bytes
    #: The oids it refers to, as ``StagedState``'s ``refs``.
    refs: str | None


class Conflict(NamedTuple):
    """An object whose current tid is not the one a commit expected."""

    oid: int
    expected: int
    actual: int             # 0: the object does not exist (any more)


class HistoryEntry(NamedTuple):
    """One revision of an object with its transaction's metadata (history())."""

    tid: int
    size: int
    user: bytes
    description: bytes
    extension: bytes


class UndoEntry(NamedTuple):
    """One undoable transaction (undoLog())."""

    tid: int
    user: bytes
    description: bytes
    extension: bytes


class TransactionHeader(NamedTuple):
    """A committed transaction as the iterator reports it."""

    tid: int
    packed: bool
    user: bytes
    description: bytes
    extension: bytes


class IteratedRecord(NamedTuple):
    """One record a transaction wrote, as the iterator reports it."""

    oid: int
    state: bytes | None
    data_tid: int | None


class WrittenState(NamedTuple):
    """One state written by a given transaction (undo reads these)."""

    oid: int
    checksum: int | None
    state: bytes | None


class CurrentRecord(NamedTuple):
    """The current revision of an existing object (record_iternext)."""

    oid: int
    tid: int
    state: bytes


class CheckedState(NamedTuple):
    """One stored revision as ``verify`` reads it."""

    oid: int
    tid: int
    checksum: int | None
    state: bytes | None


class DanglingReference(NamedTuple):
    """A reference from the current revision ``(oid, tid)`` to a missing object."""

    oid: int
    tid: int
    missing: int


class BlobRef(NamedTuple):
    """Revision ``(oid, tid)`` has the blob whose content is ``content_hash``."""

    oid: int
    tid: int
    content_hash: bytes


class BlobContent(NamedTuple):
    """A blob content stored in the database: its SHA-256, size and chunk count."""

    content_hash: bytes
    size: int
    chunks: int


#: ``(oid, tid)``: one revision of one object.
Revision = tuple[int, int]


class Polled(NamedTuple):
    """What a poll read in one snapshot."""

    #: The snapshot's tid: the last committed.
    upto: int
    #: The objects changed after the poll's ``since``, each with its newest tid.
    changes: list[Revision]
    #: The objects deleted (by pack, or by a history-free deletion) after the poll's
    #: ``gone_since`` (or, without it, since the last commit before ``since``): their
    #: rows are gone, so ``changes`` can't name them (backends/base/poller.py).
    gone: list[int]
    #: The number of the newest deletion record in the snapshot (the next poll's
    #: ``gone_since``).
    gone_seq: int
    #: The newest record number pruned: a caller whose ``gone_since`` is below it may
    #: have missed deletions.
    gone_floor: int
    #: False when the deletions since ``since`` (asked without ``gone_since``) can't
    #: all be named any more: their records were pruned.
    complete: bool = True
    #: True when more objects changed than the poll's ``limit``: ``changes`` is then
    #: empty, and whoever keeps objects from before must take them all as changed.
    truncated: bool = False

    @property
    def lists_everything(self) -> bool:
        """Does the poll name every change and deletion since its ``since``?"""
        return self.complete and not self.truncated

#: Levels of a :class:`Finding`.
OK, WARNING, ERROR = "ok", "warning", "error"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing ``zodbsql doctor`` checked."""

    level: str      # ok, warning or error
    name: str       # what was checked
    found: str      # what was found
    fix: str = ""   # what to do about it (warnings and errors)

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

# -- the connection -------------------------------------------------------------------------


class StatementCounter(Protocol):
    """A running total of statements, shared by several connections."""

    total: int


class ConnectionRole(Protocol):
    """A database connection: the one place that knows the driver.

    SQL is written with ``%s`` placeholders; the connection converts it for its driver.
    Every driver error is raised as a :mod:`zodbsql.errors` exception with the
    statement attached and the driver's exception as ``__cause__``.
    """

    driver_name: str
    #: Where counted statements are also added (the owning storage's tally), or None.
    tally: StatementCounter | None
    #: The SQL trace (``sql-trace``, ``slow-statement``), or None: off.
    tracer: Any
    #: The server's id of this session, for ending it from another connection.
    session_id: int | None
    #: The tid of this connection's commit, when a lost COMMIT's lookup found it before
    #: the tid was known (a finish that sends COMMIT with it; ``TransactionControlRole``).
    commit_tid: int | None
    #: The last tid before this connection's last commit, when finish tells it (None:
    #: it doesn't): the committing instance then knows whether anyone else committed
    #: since its snapshot.
    commit_previous: int | None
    #: The largest state one statement may carry on this connection, in bytes (None:
    #: no limit known), and what sets it (for the error message).  Known per server
    #: (MySQL's max_allowed_packet is read at connect), so held per connection.
    max_state_size: int | None
    max_state_size_detail: str | None
    #: The driver's own connection.
    raw: Any
    in_transaction: bool
    #: Do history-preserving loads read inside a read transaction (SQLite)?
    reads_in_transaction: bool
    #: Set when the connection is unusable (lost); a pool closes it instead of reusing it.
    broken: bool

    @property
    def statements(self) -> int:
        """Statements sent so far on this connection."""

    @statements.setter
    def statements(self, value: int) -> None: ...

    def begin_read(self) -> None:
        """Start a transaction that reads one consistent snapshot.  Returns nothing."""

    def begin_write(self) -> None:
        """Start a transaction that will write.  Raises :class:`CommitLockTimeout` when
        the database's write lock is not granted in time (SQLite)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return the number of rows it changed (-1: unknown)."""

    def execute_script(self, sql: str | bytes, shown: str | None = None) -> None:
        """Run SQL text as written, without parameters (procedure definitions, or a
        statement built with its values in it, traced as ``shown``)."""

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement for each row of parameters."""

    def fetchall(self, sql: str, params: Sequence[Any] = (), binary: bool = False,
                 prepare: bool = False) -> list[tuple[Any, ...]]:
        """Run a query; return all its rows.  ``binary``: the results may travel in the
        driver's binary format (PostgreSQL: no hex text to decode for BYTEA); the rows
        hold the same Python values either way.  ``prepare``: a long statement run
        again and again, worth preparing on the server at its first run (PostgreSQL);
        a driver that prepares nothing ignores it."""

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """Run a query; return its first row, or None when it has none."""

    def commit(self) -> None:
        """Commit the open transaction.  Raises :class:`DatabaseError` (the transaction
        had failed, or COMMIT did) or :class:`ConnectionLost` (whether it committed is
        then unknown: the caller asks ``TransactionControlRole.commit_outcome``)."""

    def rollback(self) -> None:
        """Roll back the open transaction, if any.  Never raises: a connection that is
        gone is marked ``broken`` instead."""

    def close(self) -> None:
        """Close the connection.  Never raises."""


# -- the roles ----------------------------------------------------------------------------------


class FeaturesRole(Protocol):
    """Capability flags: each a question with a conservative default, read by the core
    or a role (``tests/contract/test_features.py`` fails on a flag nobody reads).
    Values a backend learns only from its server live on the connection instead."""

    #: Are the staging tables empty at the start of every transaction (ON COMMIT DELETE
    #: ROWS)?  Then a commit does not clear them first.
    @property
    def staging_emptied_by_transaction_end(self) -> bool: ...

    #: Does a commit hold the database's only write lock from vote to finish?  Then a
    #: commit of states alone writes them at vote (``MoverRole.write_states``).
    @property
    def writes_at_vote(self) -> bool: ...


class SchemaRole(Protocol):
    """Creates the tables on first open and refuses a database the storage can't use."""

    def list_tables(self, conn: ConnectionRole) -> set[str]:
        """Names (lower case) of the tables in the database or schema in use."""

    def read_meta(self, conn: ConnectionRole) -> dict[str, str] | None:
        """The meta table as a dict, or None when the database has no zodbsql schema."""

    def check(self, meta: dict[str, str], keep_history: bool) -> None:
        """Return if ``meta`` describes a schema this storage can use.  Raises
        :class:`SchemaError` naming the version or history mode found and wanted."""

    def prepare(self, conn: ConnectionRole, keep_history: bool, create: bool,
                read_only: bool, remake: bool = False) -> None:
        """Check the schema, creating it first when the database is empty and ``create``
        and not ``read_only``.  Raises :class:`SchemaError` for a foreign database,
        another schema version or history mode, or a missing schema that may not be
        created; nothing was written then.  ``remake``: the schema zap just dropped is
        made again, tables that are not zodbsql's beside it or not (it was zodbsql's
        database)."""

    def create(self, conn: ConnectionRole, keep_history: bool) -> None:
        """Create every table (in the caller's write transaction)."""

    def add_blob_tables(self, conn: ConnectionRole, keep_history: bool) -> None:
        """Add the blob tables to a database made before blobs (in the caller's
        transaction)."""

    def drop_all(self, conn: ConnectionRole) -> None:
        """Drop zodbsql's own tables, functions and sequences, and nothing else."""


class LockerRole(Protocol):
    """Who may commit, and which staged states conflict (see ``base/locker.py``)."""

    @property
    def skip_empty_lock(self) -> bool:
        """Whether a commit that stages nothing and read nothing current may skip
        ``stage_and_lock`` (it has no row to lock and no conflict to find)."""

    def begin_commit(self, conn: ConnectionRole, timeout: float) -> None:
        """Open the transaction a commit (or a pack step) writes in, its row-lock waits
        bounded by ``timeout`` seconds.  Raises :class:`CommitLockTimeout` when the
        database's write lock is not granted in time (SQLite)."""

    def stage_and_lock(self, conn: ConnectionRole, mover: MoverRole,
                       states: Sequence[StagedState], read_current: dict[int, int],
                       begin: float | None = None) -> tuple[list[Conflict], list[Conflict]]:
        """Vote's writes: stage ``states`` (as ``mover.stage``), then lock
        the rows of the staged objects and of ``read_current`` (oid -> tid read); in one
        round trip where the backend can (PostgreSQL: one function call).  ``begin``:
        no transaction is open yet; open it first, as ``begin_commit(conn, begin)``
        would (PostgreSQL: in the same round trip, for a small commit).  Return
        ``(write conflicts, read conflicts)``.  Raises :class:`CommitLockTimeout` when a
        row lock is not granted within the timeout, and ``ReadConflictError`` when a row
        read-current is being written by another commit (backends with row locks)."""

    def current_tids(self, conn: ConnectionRole, oids: list[int]) -> dict[int, int]:
        """oid -> current tid of those of ``oids`` that exist."""

    def wait_for_voted_commits(self, conn: ConnectionRole) -> None:
        """First in a pack batch that deletes objects: wait until no commit is between
        vote and finish, and keep others from voting until this transaction ends (a
        voted commit may link an object the batch would delete, and the batch can see
        that only once the commit is finished).  Bounded by ``begin_commit``'s timeout;
        nothing to do where a voted commit holds the only write lock."""

    def lock_for_pack(self, conn: ConnectionRole, oids: list[int]) -> list[int]:
        """Lock, without waiting, the rows of objects a pack batch may delete (before
        the commit lock); return the oids locked, in order.  Rows a commit holds are
        skipped.  Without row locks: all of ``oids``."""

    def lock_commit(self, conn: ConnectionRole, timeout: float) -> int | None:
        """Take the database-wide commit lock (held until the transaction ends); return
        the last committed tid when taking the lock read it, else None.  Raises
        :class:`CommitLockTimeout` when it is not granted in time."""


class PendingLoad(Protocol):
    """A pick sent ahead (``MoverRole.send_load_many_with_references``)."""

    def result(self) -> tuple[list[LoadedState], list[Revision]]:
        """What ``load_many_with_references`` would have returned; waits for it."""


class MoverRole(Protocol):
    """Object states into and out of the database."""

    #: References a prefetching load may return per state it may bring
    #: (``load_with_references``'s ``max_references`` over its ``limit``).
    REFERENCES_PER_STATE: int
    #: Does a miss pick what comes along in the client (``Mover.LOOKS_AHEAD``), and
    #: within which bounds?
    LOOKS_AHEAD: bool
    LOOKAHEAD_LARGEST: int | None
    LOOKAHEAD_AT_LEAST: int | None
    #: Does ``send_load_many_with_references`` return before the rows come?
    SENDS_AHEAD: bool

    def prepare_connection(self, conn: ConnectionRole) -> None:
        """Create the temporary tables a committing connection stages into."""

    def load_current(self, conn: ConnectionRole, oid: int) -> StateRow | None:
        """The current revision of ``oid``, or None when it never existed."""

    def load_at(self, conn: ConnectionRole, oid: int, snapshot_tid: int) -> StateRow | None:
        """The revision current as of ``snapshot_tid`` (history-preserving), the current
        one (history-free: its tid may be newer, which the caller reports as a read
        conflict); None when there is none."""

    def load_serial(self, conn: ConnectionRole, oid: int, tid: int) -> StateRow | None:
        """Revision ``tid`` of ``oid``, or None when it is not stored."""

    def load_before(self, conn: ConnectionRole, oid: int,
                    before_tid: int) -> tuple[StateRow, int | None] | None:
        """The revision current just before ``before_tid`` and the tid that replaced it
        (None: still current); None when there is no such revision."""

    def load_many_at(self, conn: ConnectionRole, oids: Sequence[int],
                     snapshot_tid: int, max_bytes: int | None = None,
                     largest: int | None = None) -> list[LoadedState]:
        """Those of ``oids`` that exist, each as ``load_at`` returns it (prefetch); with
        ``max_bytes``, those that came before that many bytes did; with ``largest``,
        none stored in more bytes than that."""

    def load_walked(self, conn: ConnectionRole, seeds: Sequence[int], snapshot_tid: int,
                    limit: int, largest: int) -> list[LoadedState] | None:
        """Up to ``limit`` states in one statement, each as ``load_at`` returns it:
        ``seeds`` (oids), then those they refer to, then theirs, breadth first, through
        the references of current revisions, never from a state larger than ``largest``
        (a BTree's next buckets and their items).  None: the mover has no such
        statement (its client walks a statement a step)."""

    def load_many_with_references(self, conn: ConnectionRole, oids: Sequence[int],
                                  snapshot_tid: int, max_bytes: int | None,
                                  references_each: int,
                                  ) -> tuple[list[LoadedState], list[Revision]]:
        """``load_many_at``'s states and the first ``references_each`` references
        ``(from, to)`` (ascending) of each of their revisions (a client that picks a
        batch queues the items of a BTree's buckets so)."""

    def send_load_many_with_references(self, conn: ConnectionRole, oids: Sequence[int],
                                       snapshot_tid: int, max_bytes: int | None,
                                       references_each: int) -> PendingLoad:
        """``load_many_with_references`` sent now, its result taken later: the
        server runs it while the client reads what came before.  Any other statement
        on ``conn`` first takes its rows."""

    def load_with_references(self, conn: ConnectionRole, oid: int, snapshot_tid: int,
                             also: Sequence[int], limit: int, max_bytes: int,
                             max_references: int,
                             parents: Sequence[int] = (),
                             ) -> tuple[StateRow | None, list[LoadedState], list[Revision]]:
        """``oid``'s row as ``load_at`` returns it and, in the same statement, up to
        ``limit`` states (``max_bytes`` in all) at the same snapshot: those it refers
        to, then those of ``also``, then its siblings (the references after it of the
        one of ``parents`` that refers to it); and up to ``max_references`` of their
        references ``(from, to)``, with its own and its parent's that were looked at."""

    def references_after(self, conn: ConnectionRole, parent: int, oid: int,
                         snapshot_tid: int, count: int) -> list[int] | None:
        """Up to ``count`` oids after ``oid`` among the references of ``parent``'s
        revision at the snapshot (ascending); None when it does not refer to ``oid``
        (a client that looks ahead asks it of a cached parent too large to read)."""

    def load_and_references(self, conn: ConnectionRole, oid: int, snapshot_tid: int,
                            count: int) -> tuple[StateRow | None, list[int]]:
        """``oid``'s row as ``load_at`` returns it, and the first ``count`` oids its
        revision refers to (a client that looks ahead loads a miss without a parent
        so)."""

    def exists(self, conn: ConnectionRole, oid: int) -> bool:
        """Does any revision of ``oid`` exist?"""

    def current_tid(self, conn: ConnectionRole, oid: int) -> int | None:
        """The tid of the current revision of ``oid``, or None."""

    def count_objects(self, conn: ConnectionRole) -> int:
        """The number of objects (current revisions, deletions included)."""

    def clear_staged(self, conn: ConnectionRole) -> None:
        """Empty the staging tables before a commit stages (unless emptied already);
        called before the commit's transaction begins."""

    def stage(self, conn: ConnectionRole, states: Sequence[StagedState]) -> None:
        """Stage states (each with the oids it refers to) for this commit."""

    def write_states(self, conn: ConnectionRole, tid: int,
                     states: Sequence[StagedState]) -> None:
        """Write states (no deletion, no copy of an older revision) as the revisions of
        ``tid``, current from the commit on; only where ``writes_at_vote``."""

    def load_revisions(self, conn: ConnectionRole, wanted: dict[int, int],
                       ) -> dict[int, tuple[int | None, bytes | None]]:
        """``{oid: (checksum, state)}`` of those revisions ``{oid: tid}`` that exist, in
        one statement (history-free: only where the current revision is the one
        wanted)."""

    def restage_many(self, conn: ConnectionRole, rows: list[ResolvedState]) -> None:
        """Replace staged states (and their references) after conflict resolution."""

    def move_staged(self, conn: ConnectionRole, tid: int, blobs: bool) -> None:
        """Make the staged states the revisions of ``tid`` (commit lock held).
        ``blobs``: the commit may change blob references; otherwise those steps are
        skipped."""


class PollerRole(Protocol):
    """The newest committed tid, and what changed since a given tid."""

    #: Does the database record deletions (``object_gone``)?  False only for a database
    #: made before the record and opened read-only (set by the schema's ``prepare``).
    reads_gone: bool

    def last_tid(self, conn: ConnectionRole) -> int:
        """The tid of the last committed transaction (0 for an empty database);
        ``SchemaError`` when ``commit_row`` lost its row."""

    def poll(self, conn: ConnectionRole, since: int | None,
             gone_since: int | None = None, limit: int = 0) -> Polled:
        """The objects changed after ``since`` and deleted after record ``gone_since``
        (None: those deleted since the last commit before ``since``, for a caller that
        has no record number), as of the snapshot tid, in one statement.  With
        ``since`` None only the snapshot tid and the newest record number are read.
        ``limit`` (0: none): more changes than that are not read, the poll is
        ``truncated`` (SQLite counts revisions, at least as many as objects)."""

    @property
    def ends_with_begin(self) -> bool:
        """Does ``begin_and_poll(..., end_first=True)`` end the read transaction still
        open in the same round trip as the new one's BEGIN and the poll?"""

    def begin_and_poll(self, conn: ConnectionRole, since: int | None,
                       gone_since: int | None, end_first: bool, limit: int) -> Polled:
        """``poll`` in a read transaction begun first (``conn.begin_read``), which holds
        the poll's snapshot for the loads after it; in the same round trip where the
        backend can.  ``end_first``: the read transaction still open on ``conn`` ends
        first (ROLLBACK; PostgreSQL sends COMMIT, which ends a read-only transaction the
        same way: its connections.py says why).  Raises as ``begin_read`` or ``poll``
        would, leaving ``conn`` in the transaction (``in_transaction``) if it began."""


class CommitWatchRole(Protocol):
    """May a transaction start keep its snapshot instead of polling (``wakeup.py``)?"""

    @property
    def method(self) -> str: ...
    @property
    def reads_connection(self) -> bool:
        """Does the check send a statement on the load connection?"""

    def start(self) -> None:
        """Begin watching (at storage open)."""

    def quiet(self, conn: Callable[[], ConnectionRole], snapshot: int,
              token: object) -> tuple[bool, object]:
        """``(skip, token)``: skip only if provably nothing committed after ``snapshot``
        (the instance's last poll, made after the check that returned ``token``)."""

    def quiet_after_own_commit(self, conn: Callable[[], ConnectionRole], tid: int,
                               token: object) -> tuple[bool, object]:
        """As ``quiet`` for ``tid``, the instance's own commit, when nothing else was
        committed between its snapshot and ``tid``: may its snapshot move there?"""

    def committed(self, tid: int) -> None:
        """This process committed ``tid``."""

    def reset(self) -> None:
        """The database was emptied and made again: forget what was seen."""

    def close(self) -> None:
        """Stop watching."""


class OidAllocatorRole(Protocol):
    """Blocks of new oids, never handed out twice across processes."""

    #: The largest block the storage asks for while oids run out quickly.
    largest_block: int

    def allocate(self, conn: ConnectionRole, count: int = ...) -> list[int]:
        """Reserve ``count`` new oids; return them in ascending order.  Commits its own
        transaction unless ``conn`` is in one already (then the block is reserved in
        it)."""

    def ensure_above(self, conn: ConnectionRole, oid: int) -> None:
        """Make sure no oid up to ``oid`` is handed out again (copies bring their own)."""


class HistoryRole(Protocol):
    """Transaction metadata, the undo log, revisions of one object, iteration."""

    def record_commit(self, conn: ConnectionRole, tid: int, user: bytes, description: bytes,
                      extension: bytes) -> None:
        """Advance the commit row to ``tid`` and record the transaction's metadata."""

    def get_meta(self, conn: ConnectionRole, name: str) -> str | None:
        """The meta value ``name``, or None."""

    def set_meta(self, conn: ConnectionRole, name: str, value: str) -> None:
        """Set the meta value ``name`` (in the caller's write transaction)."""

    def add_meta(self, conn: ConnectionRole, name: str, value: str) -> None:
        """Set the meta value ``name`` unless it has one (in the caller's write
        transaction), after a transaction that is recording it has ended: read after
        this in the same transaction, the value is the first one committed."""

    def update_meta(self, conn: ConnectionRole, name: str, value: str) -> None:
        """Change the value of ``name``, which has one (in the caller's write
        transaction)."""

    def object_history(self, conn: ConnectionRole, oid: int, size: int) -> list[HistoryEntry]:
        """Up to ``size`` revisions of ``oid``, newest first (history-free: the one);
        empty when the object does not exist."""

    def undo_log(self, conn: ConnectionRole, after_tid: int, offset: int,
                 limit: int) -> list[UndoEntry]:
        """Undoable transactions newer than ``after_tid``, newest first."""

    def transaction_exists(self, conn: ConnectionRole, tid: int) -> bool:
        """Is ``tid`` a recorded transaction (history-preserving)?"""

    def transaction_states(self, conn: ConnectionRole, tid: int) -> list[WrittenState]:
        """Every state transaction ``tid`` wrote, in oid order."""

    def state_before(self, conn: ConnectionRole, oid: int, tid: int) -> StateRow | None:
        """The revision of ``oid`` current just before ``tid``, or None."""

    def current_records(self, conn: ConnectionRole, after_oid: int,
                        limit: int) -> list[CurrentRecord]:
        """Current, non-deleted objects with oid > ``after_oid``, in oid order."""

    def referrers(self, conn: ConnectionRole, oid: int) -> list[int]:
        """Oids of the objects whose current revision refers to ``oid``."""

    def iter_transactions(self, conn: ConnectionRole, start: int, stop: int, batch: int = ...,
                          ) -> Iterator[tuple[TransactionHeader, list[IteratedRecord]]]:
        """Transactions with ``start <= tid <= stop`` in tid order, each with its
        records (history-free: states grouped by the tid that wrote them)."""


class PackerRole(Protocol):
    """The set-based steps of pack and garbage collection (``storage/pack.py`` drives
    them; each deleting step runs under the commit lock)."""

    def prepare(self, conn: ConnectionRole, pack_tid: int, gc: bool) -> None:
        """Fill the work tables: the revision each object had at ``pack_tid`` and, with
        ``gc``, the roots of the reachability walk.  Raises :class:`DatabaseError` when
        another process is packing (MySQL)."""

    def walk_step(self, conn: ConnectionRole, generation: int, pack_tid: int) -> int:
        """Reach generation ``generation + 1``; return how many objects it added."""

    def new_targets(self, conn: ConnectionRole, since_tid: int) -> list[int]:
        """Oids written after ``since_tid`` and their references' targets, unreached."""

    def add_reached(self, conn: ConnectionRole, oids: Sequence[int], generation: int) -> None:
        """Mark ``oids`` reached in ``generation``."""

    def next_garbage(self, conn: ConnectionRole, after: int, limit: int) -> list[int]:
        """Up to ``limit`` unreached oids greater than ``after``, in order."""

    def unreached(self, conn: ConnectionRole, oids: Sequence[int]) -> list[int]:
        """Those of ``oids`` still unreached."""

    def next_deleted(self, conn: ConnectionRole, after: int, limit: int) -> list[int]:
        """Up to ``limit`` oids greater than ``after`` whose kept revision is a
        deletion that nothing replaced (history-preserving)."""

    def still_deleted(self, conn: ConnectionRole, oids: Sequence[int]) -> list[int]:
        """Those of ``oids`` that nothing recreated meanwhile."""

    def delete_objects(self, conn: ConnectionRole, oids: Sequence[int]) -> None:
        """Delete every revision, reference and blob reference of ``oids`` (skipping
        objects a commit holds, where the backend locks rows)."""

    def record_gone(self, conn: ConnectionRole, oids: Sequence[int]) -> None:
        """Record that ``oids`` were deleted (``object_gone``, one new record number for
        them), so that polls name them (commit lock held)."""

    def prune_gone(self, conn: ConnectionRole) -> None:
        """Drop the deletion records made before the previous pack began, raising the
        floor (a poll that needed one is told everything changed; commit lock held)."""

    def next_with_old_revisions(self, conn: ConnectionRole, after: int,
                                limit: int) -> list[Revision]:
        """Up to ``limit`` ``(oid, kept tid)`` with older revisions to delete."""

    def delete_old_revisions(self, conn: ConnectionRole, keep: Sequence[Revision]) -> None:
        """Delete the revisions older than each ``(oid, kept tid)``."""

    def count(self, conn: ConnectionRole, gc: bool) -> dict[str, int]:
        """What the prepared pack removes: ``{"garbage": n, "old_revisions": n}``."""

    def finish(self, conn: ConnectionRole, pack_tid: int) -> None:
        """Mark the transactions up to ``pack_tid`` packed and empty the work tables."""


class CheckerRole(Protocol):
    """The reads ``zodbsql verify`` makes; all read-only."""

    def count_states(self, conn: ConnectionRole) -> int:
        """The number of stored revisions."""

    def iter_states(self, conn: ConnectionRole, batch: int = ...,
                    ) -> Iterator[list[CheckedState]]:
        """Every stored revision in ``(oid, tid)`` order, in batches."""

    def dangling_references(self, conn: ConnectionRole) -> list[DanglingReference]:
        """Every reference from a current revision to a missing or deleted object."""


class TransactionControlRole(Protocol):
    """The serialised final step of a commit, and the outcome of a lost COMMIT."""

    @property
    def finishes_with_commit(self) -> bool:
        """Can ``finish`` send COMMIT with its last statement (``commit=True``)?"""

    def finish(self, conn: ConnectionRole, clock_tid: int, requested_tid: int | None,
               user: bytes, description: bytes, extension: bytes, lock_timeout: float,
               has_states: bool = True, check_blobs: bool = False,
               blobs: bool = True, commit: bool = False) -> int:
        """Take the commit lock, allocate the tid (``requested_tid``, else the later of
        ``clock_tid`` and one past the last), record the transaction and move the staged
        states in; return the tid.  The caller commits, unless ``commit`` (only where
        ``finishes_with_commit``): then the same round trip commits, and a
        :class:`ConnectionLost` from it leaves the outcome open (``commit_outcome``
        with no tid).  A connection with no transaction open then commits the finish
        alone (a commit that staged nothing and so began none).  Raises
        :class:`CommitLockTimeout`; ``StorageTransactionError`` when ``requested_tid``
        is not after the last tid; :class:`BlobContentVanished` when ``check_blobs`` and
        a staged blob content was freed by a pack meanwhile."""

    def settle_session(self, conn: ConnectionRole, old: ConnectionRole,
                       deadline: float) -> bool:
        """Make sure the session of ``old`` can no longer commit or roll back; return
        False when that could not be made sure by ``deadline`` (``time.monotonic()``)."""

    def commit_outcome(self, conn: ConnectionRole, old: ConnectionRole, tid: int | None,
                       written: Mapping[int, int | None], deadline: float) -> bool | None:
        """Was the COMMIT of ``tid`` lost on ``old`` made durable?  True, False, or None
        when it can't be told.  ``written``: oid -> checksum the commit wrote.  Runs on
        ``conn``, a new connection.  ``tid`` None: COMMIT went with finish, whose answer
        was lost too; True then comes with the tid found in ``old.commit_tid``."""


class BlobsRole(Protocol):
    """Blob contents (stored once per SHA-256) and the revisions that use them."""

    def stage(self, conn: ConnectionRole, rows: Sequence[tuple[int, bytes]]) -> None:
        """Stage ``(oid, content hash)`` for this commit."""

    def stage_copy(self, conn: ConnectionRole, oid: int, from_tid: int) -> None:
        """Stage the blob reference of revision ``(oid, from_tid)`` for ``oid``."""

    def has_content(self, conn: ConnectionRole, content_hash: bytes) -> bool:
        """Is the content stored?"""

    def upload(self, conn: ConnectionRole, content_hash: bytes, size: int,
               chunks: Iterator[bytes]) -> int:
        """Insert the chunks (if absent), then the content row; return the chunk count."""

    def staged_missing(self, conn: ConnectionRole) -> int | None:
        """An oid whose staged content is gone or incomplete, or None."""

    def revision_with_content(self, conn: ConnectionRole, content_hash: bytes,
                              ) -> Revision | None:
        """Some revision ``(oid, tid)`` whose blob has this content, or None."""

    def content_hash(self, conn: ConnectionRole, oid: int, tid: int) -> bytes | None:
        """The content hash of revision ``(oid, tid)``'s blob, or None."""

    def content(self, conn: ConnectionRole, content_hash: bytes) -> tuple[int, int] | None:
        """``(size, chunks)`` of a stored content, or None."""

    def download(self, conn: ConnectionRole, content_hash: bytes, chunks: int,
                 write: Callable[[bytes], object]) -> None:
        """Pass each chunk to ``write`` in order.  Raises ``KeyError(chunk number)``
        when a chunk is missing."""

    def unused_contents(self, conn: ConnectionRole, limit: int) -> list[bytes]:
        """Up to ``limit`` hashes of contents no reference uses."""

    def delete_contents(self, conn: ConnectionRole, hashes: Sequence[bytes]) -> None:
        """Delete these contents and their chunks."""

    def revisions_of(self, conn: ConnectionRole, oids: Sequence[int]) -> set[Revision]:
        """Every revision of ``oids`` that has a blob reference."""

    def refs_without_content(self, conn: ConnectionRole) -> list[BlobRef]:
        """Blob references whose content is not stored."""

    def iter_contents(self, conn: ConnectionRole, batch: int = ...) -> Iterator[BlobContent]:
        """Every stored content, in hash order."""

    def iter_refs(self, conn: ConnectionRole, batch: int = ...) -> Iterator[BlobRef]:
        """Every blob reference, in ``(oid, tid)`` order."""


class InspectorRole(Protocol):
    """What ``zodbsql doctor`` checks on a live database."""

    def inspect(self, conn: ConnectionRole, clients: int) -> list[Finding]:
        """Findings about the server's settings and the schema, for ``clients``
        processes."""

    def schema_findings(self, conn: ConnectionRole) -> list[Finding]:
        """Findings about the zodbsql schema."""

    def scratch(self) -> ContextManager[BackendOptions]:
        """A context giving backend options for a throw-away database beside this one,
        removed on exit."""

    #: An SQL expression, with ``{state}`` for a state column, giving the class a state
    #: was pickled for (``module.Name``, read from the pickle's first opcode, the way
    #: ZODB writes it) or ``(other)`` (``zodbsql report``).
    CLASS_OF_STATE: str
    #: An SQL expression of column ``tid``: its whole days in ZODB's time stamp
    #: calendar (the tid's high 32 bits count minutes), an integer.
    DAY_OF_TID: str


# -- the backend ------------------------------------------------------------------------------


class BackendOptions(Protocol):
    """What every backend's options object (``SQLiteOptions``, ...) offers.

    A frozen dataclass naming where the data is and how to reach it; its
    ``__post_init__`` raises :class:`ConfigurationError` naming a wrong field.
    """

    __dataclass_fields__: ClassVar[dict[str, Any]]

    def create_backend(self, keep_history: bool, lock_timeout: float,
                       read_only: bool = False) -> BackendContract:
        """A backend over these options.  Raises :class:`ConfigurationError` for
        options that can't work (a missing directory, a bad DSN) and
        :class:`DriverNotFound` when no driver loads."""


class CodecRole(Protocol):
    """How a state is stored (``zodbsql.atrest.codec.RecordCodec``)."""

    #: What every record the codec sealed starts with; any other is stored as it is.
    sealed_prefix: bytes

    def encode(self, oid: int, state: bytes) -> bytes:
        """``state`` as it is stored (compressed, encrypted, or as it is)."""
        ...

    def decode(self, oid: int, tid: int, stored: bytes) -> bytes:
        """The state a stored record holds; raises ``RecordKeyError`` (its key id is not
        configured) or ``CorruptRecordError``."""
        ...

    def seal_chunk(self, content_hash: bytes, num: int, data: bytes) -> bytes:
        """Chunk ``num`` of a blob content as it is stored (encrypted, or as it is)."""
        ...

    def open_chunk(self, content_hash: bytes, num: int, stored: bytes) -> bytes:
        """The data of a stored blob chunk; raises ``RecordKeyError``."""
        ...


class BackendContract(Protocol):
    """One database and its roles, as the storage core and the roles see it."""

    @property
    def name(self) -> str: ...
    @property
    def options(self) -> BackendOptions: ...
    @property
    def keep_history(self) -> bool: ...
    @property
    def lock_timeout(self) -> float: ...
    @property
    def read_only(self) -> bool: ...
    @property
    def features(self) -> FeaturesRole: ...
    @property
    def schema(self) -> SchemaRole: ...
    @property
    def locker(self) -> LockerRole: ...
    @property
    def mover(self) -> MoverRole: ...
    @property
    def poller(self) -> PollerRole: ...
    @property
    def oids(self) -> OidAllocatorRole: ...
    @property
    def history(self) -> HistoryRole: ...
    @property
    def packer(self) -> PackerRole: ...
    @property
    def checker(self) -> CheckerRole: ...
    @property
    def txncontrol(self) -> TransactionControlRole: ...
    @property
    def inspector(self) -> InspectorRole: ...
    @property
    def blobs(self) -> BlobsRole: ...
    @property
    def codec(self) -> CodecRole:
        """How states are stored and read back (``zodbsql.atrest``)."""
        ...

    def use_codec(self, codec: CodecRole) -> None:
        """Store and read states through ``codec`` from now on (set by the storage at
        open, before it reads or writes a state)."""
        ...

    def connect(self) -> ConnectionRole:
        """A new connection (autocommit between explicit transactions).  Raises
        :class:`ConnectionLost` while the server can't be reached (retryable),
        :class:`DatabaseError` when it refuses the login or database,
        :class:`ConfigurationError` for a DSN it can't parse."""

    @property
    def server_generation(self) -> int:
        """Raised by one each time :meth:`connect` reaches another server than before
        (a failover to a promoted standby)."""

    def replica_count(self) -> int:
        """How many replicas (standbys) are configured."""

    def open_replica(self, index: int) -> ConnectionRole:
        """A session on replica ``index``, whatever its lag (doctor).  Raises
        :class:`DatabaseError` when it can't be reached."""

    def connect_replica(self) -> ConnectionRole | None:
        """A connection to a standby (read-only) that may serve polls and loads, or
        None: none configured, or none reachable within its lag bound.  Never raises
        for a standby that is down or lagging (it is skipped)."""

    def replica_in_bounds(self, conn: ConnectionRole) -> bool:
        """Is the standby ``conn`` (from :meth:`connect_replica`) still within its lag
        bound?  False also when it can't be asked."""

    def check_exists(self) -> None:
        """Raise :class:`SchemaError` if the database is missing, before anything
        connects and so creates it (SQLite); return otherwise."""

    def connect_for_commit(self, lock_timeout: float) -> ConnectionRole:
        """A new connection for committing: temporary tables made, lock timeouts set.
        Raises as :meth:`connect`."""

    def describe(self) -> str:
        """Where the data is, for messages (never a password)."""

    def sort_key(self) -> str:
        """A key that is the same for every storage on the same database."""

    def database_size(self, conn: ConnectionRole) -> int:
        """Approximate size of the stored data in bytes."""

    def destroy(self) -> None:
        """Remove every zodbsql table (tests, the benchmark's scratch databases)."""

    def watch_commits(self) -> CommitWatchRole:
        """A new watch for one storage: whether a transaction start may skip its poll."""

    def close(self) -> None:
        """The storage is closed: stop what the backend runs besides its connections."""
