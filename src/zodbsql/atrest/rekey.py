"""Re-encrypt every stored state and blob chunk that is not under the current key id.

Each batch is its own short write transaction against the rows as they are then, so
writers keep committing meanwhile; a row a commit replaced since it was read (another
tid, history-free) or a pack removed is left alone.  Rows already under the current
key are skipped, so a run that was killed is resumed by running it again.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from zodbsql.atrest.codec import RecordCodec
from zodbsql.backends.base.contract import BackendContract, ConnectionRole
from zodbsql.errors import ConfigurationError, DatabaseConflict
from zodbsql.storage.records import checksum, verified

# One statement set for every backend (the rewrite in two forms, by history mode):
# object_state has zoid, tid and state in both; rows are walked in key order from where
# the last batch ended.
COUNT_STATES = "SELECT COUNT(*) FROM object_state WHERE state IS NOT NULL"
STATES_AFTER = (
    "SELECT zoid, tid, checksum, state FROM object_state WHERE state IS NOT NULL"
    " AND (zoid > %s OR (zoid = %s AND tid > %s)) ORDER BY zoid, tid LIMIT %s")
RESEAL_STATE = ("UPDATE object_state SET state = %s, state_size = %s, checksum = %s"
                " WHERE zoid = %s AND tid = %s")
# History-free, the row is found by its primary key (zoid) alone and its tid checked
# after: MariaDB otherwise reads it through the tid index (tid, zoid), locking the
# index entry before the row, while a commit replacing the object holds the row (from
# vote) and needs that entry to change its tid in finish: a deadlock.  (History-
# preserving, commits only insert, and the primary key is (zoid, tid): kept as is.)
RESEAL_STATE_HF = ("UPDATE object_state SET state = %s, state_size = %s, checksum = %s"
                   " WHERE zoid = %s AND tid + 0 = %s")
COUNT_CHUNKS = "SELECT COUNT(*) FROM blob_chunk"
CHUNKS_AFTER = (
    "SELECT content_hash, chunk_num, data FROM blob_chunk"
    " WHERE content_hash > %s OR (content_hash = %s AND chunk_num > %s)"
    " ORDER BY content_hash, chunk_num LIMIT %s")
RESEAL_CHUNK = "UPDATE blob_chunk SET data = %s WHERE content_hash = %s AND chunk_num = %s"

#: Times a batch the database cancelled (a deadlock with a commit) is tried again.
RETRIES = 5


@dataclasses.dataclass
class RekeyProgress:
    """What a run has seen and rewritten so far."""

    states: int = 0
    states_total: int = 0
    states_rewritten: int = 0
    chunks: int = 0
    chunks_total: int = 0
    chunks_rewritten: int = 0


def rekey(backend: BackendContract, codec: RecordCodec, batch: int = 500,
          progress: Callable[[RekeyProgress], None] | None = None,
          lock_timeout: float = 30.0) -> RekeyProgress:
    """Rewrite the states, then the blob chunks, not under ``codec``'s current key.

    The connection is set up, and each batch's transaction begun, as a commit's
    (``lock_timeout``: seconds a row lock is waited for; a lock held longer stops the
    run with ``CommitLockTimeout``, and running it again resumes).  On MySQL and MariaDB
    that means READ COMMITTED: at REPEATABLE READ an UPDATE that found its row through
    the tid index kept next-key locks on the rows of other objects written at the same
    tid, and a commit replacing one of them in finish deadlocked with the batch (the
    server then cancels one of the two: the commit, in its second phase, if the batch
    had written more); see RESEAL_STATE_HF for the other half."""
    if codec.keys is None:
        raise ConfigurationError("rekey needs key-file or key-env: the key new records use")
    done = RekeyProgress()
    report = progress or (lambda _: None)
    conn = backend.connect_for_commit(lock_timeout)

    def begin() -> None:
        # As a commit's vote does: PostgreSQL bounds the transaction's lock waits here.
        backend.locker.begin_commit(conn, lock_timeout)
    try:
        done.states_total = _count(conn, COUNT_STATES)
        done.chunks_total = _count(conn, COUNT_CHUNKS)
        report(done)
        after: tuple[Any, ...] = (-1, -1)
        while True:
            rows = conn.fetchall(STATES_AFTER, (after[0], after[0], after[1], batch))
            if not rows:
                break
            rewritten = [_resealed(codec, int(o), int(t), c, bytes(s)) for o, t, c, s in rows
                         if not codec.is_current(bytes(s))]
            _write(conn, RESEAL_STATE if backend.keep_history else RESEAL_STATE_HF,
                   rewritten, begin)
            done.states += len(rows)
            done.states_rewritten += len(rewritten)
            after = (int(rows[-1][0]), int(rows[-1][1]))
            report(done)
        hash_after, num_after = b"", -1
        while True:
            rows = conn.fetchall(CHUNKS_AFTER, (hash_after, hash_after, num_after, batch))
            if not rows:
                break
            current = codec.keys.current
            chunks = [(bytes(h), int(n), bytes(d)) for h, n, d in rows]
            resealed = [(codec.seal_chunk(h, n, codec.open_chunk(h, n, d)), h, n)
                        for h, n, d in chunks if codec.chunk_key_id(d) != current]
            _write(conn, RESEAL_CHUNK, resealed, begin)
            done.chunks += len(rows)
            done.chunks_rewritten += len(resealed)
            hash_after, num_after = chunks[-1][0], chunks[-1][1]
            report(done)
    finally:
        conn.close()
    return done


def _resealed(codec: RecordCodec, oid: int, tid: int, stored_checksum: int | None,
              stored: bytes) -> tuple[bytes, int, int | None, int, int]:
    """A RESEAL_STATE row: the record under the current key, with its checksum keyed
    (a record written before encryption had a plain one).  A record that fails its
    checksum is not rewritten: rekey stops, naming it."""
    key = codec.checksum_key
    state = verified(oid, tid, stored_checksum, codec.decode(oid, tid, stored), key)
    assert state is not None
    sealed = codec.encode(oid, state)
    return sealed, len(sealed), checksum(state, key), oid, tid


def _count(conn: ConnectionRole, sql: str) -> int:
    row = conn.fetchone(sql)
    return int(row[0]) if row else 0


def _write(conn: ConnectionRole, sql: str, rows: list[tuple[Any, ...]],
           begin: Callable[[], None]) -> None:
    """One write transaction (``begin`` starts it); again when the database cancels it
    for a deadlock."""
    if not rows:
        return
    for attempt in range(RETRIES + 1):
        begin()
        try:
            conn.executemany(sql, rows)
            conn.commit()
            return
        except DatabaseConflict:
            conn.rollback()
            if attempt == RETRIES:
                raise
        except BaseException:
            conn.rollback()
            raise
