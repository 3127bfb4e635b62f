"""A Hypothesis state machine that drives a storage and the model side by side.

Random commits (new objects, changed values, links added and dropped, garbage linked
again or written by a connection that still holds it) through several instances, each
at its own snapshot; loads at those snapshots, ``loadBefore``, ``loadSerial``,
``history``, ``undoLog`` and undo (history-preserving); write conflicts from stale
snapshots; packs at random times, with or without gc, in batches, with a commit made
during the pack.  After every step the storage's current data is compared with the
model, and every rule compares what it read.

The cache is tiny (a few states, an index of three oids), so states are evicted and the
changed-oid index is reset all the time.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, cast

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import ConflictError, POSKeyError, UndoError
from ZODB.TimeStamp import TimeStamp
from ZODB.utils import p64, u64, z64

from tests.model.nodes import node_state
from tests.model.zodb_model import ROOT, Model
from zodbsql.storage import pack as packing

#: A cache of a few small states (a state may use up to a quarter of it).
TINY_CACHE_MB = 0.008
#: Changed oids the cache's index holds before it is emptied (the real minimum is 1000).
TINY_INDEX = 3
#: Changes a poll lists at most (poll-changes-limit): past them it is truncated, and
#: the instance is told everything changed.
POLL_LIMIT = 4
INSTANCES = 3
NEVER_STORED = 10_000_000
#: What one edit of an object does, weighted towards making garbage.
ACTIONS = ["value", "link", "link", "unlink", "unlink", "unlink", "new", "new"]
#: ``{oid: (state, links)}`` of a transaction, as ``Model.commit`` takes them.
Writes = dict[int, tuple[bytes | None, Iterable[int]]]


class StorageMachine(RuleBasedStateMachine):
    #: Set by the test: the ``storage_factory`` of one backend x history mode cell.
    factory: Any = None
    #: The state cache's ``cache-compress`` (set by a test too).
    cache_compress = "off"

    def __init__(self) -> None:
        super().__init__()
        factory = self.factory
        self.keep_history = factory.param.keep_history
        self.storage = factory.open(factory.new_path(), cache_size_mb=TINY_CACHE_MB,
                                    poll_changes_limit=POLL_LIMIT,
                                    cache_compress=self.cache_compress)
        self.storage.shared.cache._max_index = TINY_INDEX   # test knob: reset often
        self.model = Model(self.keep_history)
        self.instances = [self.storage.new_instance() for _ in range(INSTANCES)]
        self.snapshots = [0] * INSTANCES
        self.epochs = [0] * INSTANCES
        self.packing: set[int] = set()      # what the running pack may delete
        # Packs that pruned the records of deletions (every one that got past its
        # checks, history-free ones without GC too), and their count at each
        # instance's last poll.
        self.prunes = 0
        self.prunes_at = [0] * INSTANCES
        # 1 while a running pack has pruned already: it prunes before it deletes, so
        # from its first phase after the walk (a poll then may find a record pruned).
        self.pruning = 0
        self.values = 0

    def teardown(self) -> None:
        for instance in self.instances:
            instance.release()
        self.storage.close()

    # -- helpers ---------------------------------------------------------------------------
    def _state(self, links: set[int]) -> tuple[bytes, frozenset[int]]:
        self.values += 1
        return node_state(self.values, links), frozenset(links)

    def _poll(self, i: int) -> None:
        """Move instance ``i`` to the newest commit; check what it was told changed."""
        instance, model = self.instances[i], self.model
        before = self.snapshots[i]
        # A start may keep its snapshot without reading the deletion records, which a
        # pack writes without committing a transaction: when nothing was committed
        # since its last poll (a commit watch need not hear a pack), or only its own
        # commit (history-preserving: the start after it checks the last tid alone).
        may_skip = model.last_tid == before or (
            self.keep_history and bool(model.txns) and model.txns[-1].by == i)
        invalidated = instance.poll_invalidations()
        if invalidated is None:
            # Everything: the records of deletions since its last poll were pruned,
            # which takes two packs after it (counted from the one it polled during),
            # or more revisions were written since than a poll lists (SQLite counts
            # revisions, the others objects, of which there are no more).
            written = sum(len(txn.writes) for txn in model.txns if txn.tid > before)
            assert before and (self.prunes + self.pruning - self.prunes_at[i] >= 2
                               or written > POLL_LIMIT), (
                self.prunes, self.pruning, self.prunes_at[i], written)
        else:
            changed = {u64(oid) for oid in invalidated}
            expected = {oid for txn in model.txns if before < txn.tid and txn.by != i
                        for oid in txn.writes} if before else set()
            # A pack's deletions are named too (their records: backends/base/poller.py), those
            # of a pack during which this instance committed perhaps at the poll after,
            # and those before a start that skipped its poll (history-preserving, after
            # the instance's own commit) at the next that polls.
            deleted = set(model.gone) | self.packing if before else set()
            assert changed <= expected | deleted, (changed, expected, deleted)
            # An object a pack removed since has no current row left to report.
            assert not any(self._exists(oid) for oid in expected - changed), (
                changed, expected)
        assert u64(instance.lastTransaction()) == model.last_tid
        self.snapshots[i] = model.last_tid
        self.epochs[i] = model.epoch
        if not may_skip:
            self.prunes_at[i] = self.prunes + self.pruning

    def _commit(self, i: int, writes: Writes) -> int:
        self._poll(i)
        instance = self.instances[i]
        txn = TransactionMetaData()
        instance.tpc_begin(txn)
        for oid, (state, _) in writes.items():
            current = self.model.current(oid)
            serial = p64(current.tid) if current else z64
            instance.store(p64(oid), serial, state, "", txn)
        instance.tpc_vote(txn)
        tid = u64(instance.tpc_finish(txn))
        self.model.commit(tid, writes, by=i)
        return tid

    def _draw_writes(self, data: st.DataObject, i: int, allowed: set[int] | None = None,
                     ) -> Writes:
        """1 to 3 edits of live objects (any of them, reachable or not)."""
        live = [oid for oid in self.model.live() if allowed is None or oid in allowed]
        links: dict[int, set[int]] = {}
        for _ in range(data.draw(st.integers(1, 3), label="edits")):
            oid = data.draw(st.sampled_from(live), label="object")
            current = self.model.current(oid)
            edited = links.setdefault(oid, set(current.refs) if current else set())
            action = data.draw(st.sampled_from(ACTIONS), label="action")
            if action == "link":
                edited.add(data.draw(st.sampled_from(live), label="target"))
            elif action == "unlink" and edited:
                edited.discard(data.draw(st.sampled_from(sorted(edited)), label="unlinked"))
            elif action == "new":
                child = u64(self.instances[i].new_oid())
                edited.add(child)
                links[child] = set()
        return {oid: self._state(refs) for oid, refs in links.items()}

    def _exists(self, oid: int) -> bool:
        """Does the storage still hold any revision of ``oid``?"""
        try:
            self.storage.history(p64(oid))
            return True
        except POSKeyError:
            return False

    # -- rules -----------------------------------------------------------------------------
    @initialize()
    def create_root(self) -> None:
        children = {u64(self.instances[0].new_oid()) for _ in range(3)}
        writes: Writes = {ROOT: self._state(children)}
        writes.update((oid, self._state(set())) for oid in children)
        self._commit(0, writes)
        for i in range(INSTANCES):
            self._poll(i)

    @rule(data=st.data(), i=st.integers(0, INSTANCES - 1))
    def commit(self, data: st.DataObject, i: int) -> None:
        self._commit(i, self._draw_writes(data, i))

    @rule(i=st.integers(0, INSTANCES - 1))
    def poll(self, i: int) -> None:
        self._poll(i)

    @rule(i=st.integers(0, INSTANCES - 1))
    def load_at_snapshot(self, i: int) -> None:
        instance, model = self.instances[i], self.model
        for oid in model.oids() + [NEVER_STORED]:
            expected, may_be_missing = model.at(oid, self.snapshots[i], self.epochs[i])
            try:
                got = instance.load(p64(oid))
            except POSKeyError:
                assert expected is None or may_be_missing, (oid, "missing")
                continue
            assert expected is not None, (oid, "loaded", got)
            assert got == (expected.state, p64(expected.tid)), (
                oid, got, expected, self.snapshots[i], self.epochs[i], model.epoch)

    @rule(data=st.data(), i=st.integers(0, INSTANCES - 1))
    def stale_write_conflicts(self, data: st.DataObject, i: int) -> None:
        """Instance ``i`` writes, from its old snapshot, an object changed since."""
        snapshot = self.snapshots[i]
        stale = [oid for oid in self.model.live()
                 if self.model.current(oid).tid > snapshot  # type: ignore[union-attr]
                 and (seen := self.model.at(oid, snapshot, self.epochs[i])[0]) is not None
                 and seen.state is not None]
        if not stale:
            return
        oid = data.draw(st.sampled_from(stale), label="stale object")
        seen = self.model.at(oid, snapshot, self.epochs[i])[0]
        assert seen is not None
        instance = self.instances[i]
        txn = TransactionMetaData()
        instance.tpc_begin(txn)
        try:
            instance.store(p64(oid), p64(seen.tid), self._state(set(seen.refs))[0], "", txn)
            try:
                instance.tpc_vote(txn)
            except ConflictError:
                pass
            else:
                raise AssertionError(f"a stale write of {oid} was accepted")
        finally:
            instance.tpc_abort(txn)

    @rule(data=st.data())
    def read_history(self, data: st.DataObject) -> None:
        model, storage = self.model, self.storage
        oid = data.draw(st.sampled_from(model.oids() + [NEVER_STORED]), label="oid")
        tids = [txn.tid for txn in model.txns]
        tid = data.draw(st.sampled_from(tids), label="tid") + data.draw(
            st.sampled_from([0, 1]), label="plus")
        expected = model.load_before(oid, tid)
        if isinstance(expected, KeyError):
            try:
                storage.loadBefore(p64(oid), p64(tid))
                raise AssertionError(f"loadBefore({oid}, {tid}) found a revision")
            except POSKeyError:
                pass
        else:
            found = storage.loadBefore(p64(oid), p64(tid))
            if expected is None:
                assert found is None, (oid, tid, found)
            else:
                rev, end = expected
                assert found == (rev.state, p64(rev.tid), p64(end) if end else None), (oid, tid)
        kept = model.kept(oid)
        for rev in kept:
            if rev.state is not None:
                assert storage.loadSerial(p64(oid), p64(rev.tid)) == rev.state
        size = data.draw(st.sampled_from([1, 2, 100]), label="size")
        if kept:
            got = [u64(h["tid"]) for h in storage.history(p64(oid), size)]
            want = [rev.tid for rev in reversed(kept)]
            assert got == (want[:size] if self.keep_history else want[:1]), (oid, got, want)
        else:
            try:
                storage.history(p64(oid), size)
                raise AssertionError(f"history({oid}) of an object that is gone")
            except POSKeyError:
                pass

    @precondition(lambda self: self.keep_history)
    @rule(data=st.data(), i=st.integers(0, INSTANCES - 1))
    def undo(self, data: st.DataObject, i: int) -> None:
        model = self.model
        # Any transaction but the root's creation (ZODB never undoes that one).
        undoable = [txn.tid for txn in model.txns[1:]]
        if not undoable:
            return
        tid = data.draw(st.sampled_from(undoable), label="undone")
        writes = model.undo_writes(tid)
        self._poll(i)
        instance = self.instances[i]
        txn = TransactionMetaData()
        instance.tpc_begin(txn)
        try:
            try:
                _, oids = instance.undo(p64(tid), txn)
            except UndoError:
                assert writes is None, f"undo of {tid} refused"
                return
            assert writes is not None, f"undo of {tid} accepted"
            assert {u64(oid) for oid in oids} == set(writes)
            instance.tpc_vote(txn)
            new_tid = u64(instance.tpc_finish(txn))
        finally:
            if instance.tpc_transaction() is txn:
                instance.tpc_abort(txn)
        model.commit(new_tid, cast(Writes, writes), by=i)  # dict is invariant; only read

    @rule(data=st.data(),
          gc=st.sampled_from([True, True, False]),
          batch=st.sampled_from([1, 2, 1000]),
          commit_at=st.sampled_from([None, 1, 2, 3]),
          writer=st.integers(0, INSTANCES - 1))
    def pack(self, data: st.DataObject, gc: bool, batch: int, commit_at: int | None,
             writer: int) -> None:
        model = self.model
        tids = [txn.tid for txn in model.txns]
        # Recent times: packing before the previous pack time does nothing.
        when = data.draw(st.sampled_from(tids[-4:] + [None]), label="pack at (None: now)")
        # A microsecond after the chosen commit: far above a float's rounding at today's
        # times (0.24 us), far below the time between two commits.
        t = time.time() if when is None else TimeStamp(p64(when)).timeTime() + 1e-6
        pack_tid = packing.time_to_tid(t)
        assert when is None or when <= pack_tid < min(
            [tid for tid in tids if tid > when] + [pack_tid + 1])
        plan = model.pack_plan(pack_tid, gc)
        calls: list[str] = []
        alive: set[int] | None = None

        def progress(phase: str, done: int) -> None:
            nonlocal alive
            calls.append(phase)
            if phase != "walk":
                self.pruning = 1
            if len(calls) == commit_at:
                alive = {oid for oid in model.oids() if self._exists(oid)}
                self._commit(writer, self._draw_writes(data, writer, alive))
                # Its snapshot was taken while the pack was deleting.
                self.epochs[writer] = model.epoch + 1

        self.packing = set(plan.candidates) if plan is not None else set()
        try:
            counts = packing.pack(self.storage, t, gc=gc, progress=progress,
                                  batch_size=batch)
        finally:
            self.packing = set()
            self.pruning = 0
        if plan is not None or not (self.keep_history or gc):
            self.prunes += 1
        if plan is None:
            assert not calls
            return
        if alive is None:
            assert counts == self._expected_counts(plan)
        for oid in model.finish_pack(plan, alive):
            if not self._exists(oid):
                model.remove(oid)

    def _expected_counts(self, plan: Any) -> dict[str, int]:
        garbage = len(set(plan.candidates) - plan.start_reach) if plan.gc else 0
        old = 0
        if self.keep_history:
            old = sum(len([r for r in self.model.kept(oid) if r.tid <= plan.pack_tid]) - 1
                      for oid in plan.candidates)
        return {"garbage": garbage, "old_revisions": old}

    # -- after every step -------------------------------------------------------------------
    @invariant()
    def current_data_matches(self) -> None:
        model, storage = self.model, self.storage
        for oid in model.oids():
            rev = model.current(oid)
            try:
                got = storage.load(p64(oid))
            except POSKeyError:
                assert rev is None or rev.state is None, (oid, "missing")
                continue
            assert rev is not None and got == (rev.state, p64(rev.tid)), oid
        assert len(storage) == model.count()
        assert [u64(entry["id"]) for entry in storage.undoLog(0, 20)] == model.undoable()[:20]
