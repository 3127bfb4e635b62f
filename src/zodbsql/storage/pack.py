"""Pack and garbage collection, in batches that never hold the commit lock for long.

1. ``prepare``: record the revision of every object current at the pack tid, and seed
   the walk with the root and everything written after the pack tid.
2. Walk: follow the recorded references one generation per statement (no lock held).
   Then prune the records of deletions made before the previous pack began
   (``_prune_gone``).
3. Delete garbage, one batch of oids per short write transaction.  Before each batch,
   under the commit lock, objects committed since the walk began and their references
   are reached too, so an object a concurrent writer linked again or wrote (after the
   pack time) is never deleted.  Each batch records what it deleted, for the polls of
   every process (``object_gone``: backends/base/poller.py says why).
4. History-preserving: delete objects whose kept revision is a deletion (IExternalGC),
   then the revisions older than each object's kept revision, in batches, then mark
   the packed transactions.
5. Blobs: free the contents (chunks) no blob reference uses any more, found with an
   anti-join, one batch per locked step (a commit that found a content at vote checks
   under the commit lock that it still exists); with a shared blob directory remove
   the files of revisions that are gone.  Both are idempotent, so an interrupted pack
   finishes the job when run again.

``progress`` (if given) is called with ``(phase, done)`` after every batch.
"""
from __future__ import annotations

import time
from typing import Callable

from ZODB import POSException
from ZODB.TimeStamp import TimeStamp

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.options import Options
from zodbsql.storage.history import PACKED_TID, packed_tid
from zodbsql.storage.records import as_int
from zodbsql.storage.shared import HasShared, Shared

Progress = Callable[[str, int], None]


def time_to_tid(t: float) -> int:
    raw: bytes = TimeStamp(*time.gmtime(t)[:5] + (t % 60,)).raw()
    return as_int(raw)


def pack(storage: HasShared, t: float, gc: bool = True,
         progress: Progress | None = None, dry_run: bool = False,
         batch_size: int | None = None, duty_cycle: float | None = None) -> dict[str, int]:
    """Pack to time ``t``; return what was (with ``dry_run``: would be) removed.

    The result counts ``garbage`` objects and ``old_revisions``; a dry run only walks
    the references and deletes nothing.  ``batch_size`` and ``duty_cycle`` override the
    storage's options for this pack.
    """
    shared = storage.shared
    options = shared.options.replace(
        pack_batch_size=batch_size or shared.options.pack_batch_size,
        pack_duty_cycle=duty_cycle or shared.options.pack_duty_cycle)
    if not shared.pack_lock.acquire(blocking=False):
        raise POSException.StorageError("a pack of this storage is already running")
    measured = shared.metrics
    if measured is not None:
        told = progress or (lambda phase, done: None)

        def progress(phase: str, done: int) -> None:
            measured.pack_progress(phase, done)
            told(phase, done)
    conn = shared.connect()
    try:
        counts = _Pack(shared, conn, gc, progress, dry_run, options).run(time_to_tid(t))
        if shared.blob_files is not None:
            shared.blob_files.hashes.clear()  # the memo may name revisions the pack removed
            if not dry_run:
                shared.blob_files.staging.remove_stale()  # what killed commits left
        return counts
    finally:
        conn.rollback()
        conn.close()
        shared.pack_lock.release()


class _Pack:
    def __init__(self, shared: Shared, conn: ConnectionRole, gc: bool,
                 progress: Progress | None, dry_run: bool, options: Options) -> None:
        self.dry_run = dry_run
        self.shared = shared
        self.backend = shared.backend
        self.conn = conn
        self.gc = gc
        self.progress = progress or (lambda phase, done: None)
        self.batch = options.pack_batch_size
        self.duty = options.pack_duty_cycle
        self.timeout = options.commit_lock_timeout
        self.generation = 0

    def run(self, pack_tid: int) -> dict[str, int]:
        conn, backend = self.conn, self.backend
        last = backend.poller.last_tid(conn)
        pack_tid = min(pack_tid, last)
        keep_history = self.shared.options.keep_history
        nothing = {"garbage": 0, "old_revisions": 0}
        if pack_tid <= 0 or (keep_history and pack_tid <= packed_tid(self.backend, conn)):
            return nothing
        if not keep_history and not self.gc:
            if not self.dry_run:
                self._prune_gone()      # the deleteObject commits' records
                self._collect_blobs()
            return nothing
        self.checked = last
        self.pack_tid = pack_tid
        backend.packer.prepare(conn, pack_tid, self.gc)
        if self.gc:
            self._walk()
        counts = backend.packer.count(conn, self.gc)
        if self.dry_run:
            return counts
        self._prune_gone()
        if self.gc:
            self._delete_objects(self.backend.packer.next_garbage, self._still_garbage, "gc")
        if keep_history:
            self._delete_objects(self.backend.packer.next_deleted,
                                 self.backend.packer.still_deleted, "deleted")
            self._delete_old_revisions()
        self._locked(lambda: self._finish(pack_tid))
        self._collect_blobs()
        return counts

    def _collect_blobs(self) -> None:
        blobs, conn = self.backend.blobs, self.conn
        done = 0
        while True:
            freed: list[bytes] = []

            def step() -> None:
                freed.extend(blobs.unused_contents(conn, self.batch))
                if freed:
                    blobs.delete_contents(conn, freed)
            self._locked(step)
            if not freed:
                break
            done += len(freed)
            self.progress("blobs", done)
        files = self.shared.blob_files
        if files is not None and files.shared:
            last = self.backend.poller.last_tid(conn)
            files.collect_files(conn, blobs, last)

    def _prune_gone(self) -> None:
        """The records of deletions made before the previous pack began go (see
        backends/base/poller.py), in one short locked step: a row per batch."""
        packer, conn = self.backend.packer, self.conn
        self._locked(lambda: packer.prune_gone(conn))

    def _walk(self) -> None:
        while self.backend.packer.walk_step(self.conn, self.generation, self.pack_tid) > 0:
            self.generation += 1
            self.progress("walk", self.generation)

    def _locked(self, work: Callable[[], object],
                before_commit_lock: Callable[[], object] | None = None) -> None:
        """Run ``work`` in one short write transaction holding the commit lock;
        ``before_commit_lock`` runs in the same transaction first (row locks must come
        before the commit lock, in the order commits take them)."""
        started = time.monotonic()
        self.backend.locker.begin_commit(self.conn, self.timeout)
        try:
            if before_commit_lock is not None:
                before_commit_lock()
            self.backend.locker.lock_commit(self.conn, self.timeout)
            work()
            self.conn.commit()
        except BaseException:
            self.conn.rollback()
            raise
        if self.duty < 1:
            time.sleep((time.monotonic() - started) * (1 - self.duty) / self.duty)

    def _rescue(self) -> None:
        """Reach what was committed since the walk began (commit lock held)."""
        newest = self.backend.poller.last_tid(self.conn)
        if newest <= self.checked:
            return
        packer = self.backend.packer
        targets = packer.new_targets(self.conn, self.checked)
        if targets:
            self.generation += 1
            packer.add_reached(self.conn, targets, self.generation)
            self._walk()
        self.checked = newest

    def _still_garbage(self, conn: ConnectionRole, oids: list[int]) -> list[int]:
        generation = self.generation
        self._rescue()
        if self.generation == generation:
            # The rescue reached nothing: the candidates were read unreached from the
            # same work tables after the batch before, and only a rescue adds to them,
            # so each is still garbage.  (The re-check was a statement a batch, ~8 ms
            # of the commit lock's time on PostgreSQL: a quarter of a pack of 100,000
            # objects that nothing links again.)
            return oids
        return self.backend.packer.unreached(conn, oids)

    def _delete_objects(self, candidates: Callable[[ConnectionRole, int, int], list[int]],
                        recheck: Callable[[ConnectionRole, list[int]], list[int]],
                        phase: str) -> None:
        """Delete whole objects in batches.  Candidates are found without the commit
        lock; under it, each batch is only re-checked and deleted, so the time the lock
        is held is bounded by the batch, not by the size of the database."""
        packer, conn = self.backend.packer, self.conn
        after, done = -1, 0
        while True:
            found = candidates(conn, after, self.batch)
            if not found:
                return

            locked: list[int] = []

            def lock_rows() -> None:
                # A commit that voted and has not finished may link one of these: its
                # references become visible only when it finishes, so wait for it.
                self.backend.locker.wait_for_voted_commits(conn)
                locked[:] = self.backend.locker.lock_for_pack(conn, found)

            def step() -> None:
                doomed = recheck(conn, locked) if locked else []
                if doomed:
                    packer.delete_objects(conn, doomed)
                    packer.record_gone(conn, doomed)   # for the polls (backends/base/poller.py)
            self._locked(step, lock_rows)
            after = found[-1]
            done += len(found)
            self.progress(phase, done)

    def _delete_old_revisions(self) -> None:
        packer, conn = self.backend.packer, self.conn
        after, done = -1, 0
        while True:
            keep = packer.next_with_old_revisions(conn, after, self.batch)
            if not keep:
                return
            self._locked(lambda: packer.delete_old_revisions(conn, keep))
            after, _ = keep[-1]
            done += len(keep)
            self.progress("history", done)

    def _finish(self, pack_tid: int) -> None:
        self.backend.packer.finish(self.conn, pack_tid)
        self.backend.history.set_meta(self.conn, PACKED_TID, str(pack_tid))
