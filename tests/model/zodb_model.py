"""What ZODB promises a storage does, kept in memory: the reference the storage is
compared with.

Every revision ever committed is kept (``revisions``), so a snapshot's view is known even
after the storage forgot it; ``floor`` and ``gone`` say what pack removed: revisions
older than an object's floor, and whole objects.  The rules, each as ZODB states them:

* A load at snapshot ``S`` returns the newest revision at or before ``S``.  If pack
  removed that revision a POSKeyError is allowed instead (a cache may still know it);
  history-free, where a snapshot is a read transaction, only if the object was gone
  before the snapshot was taken.
* ``loadBefore(oid, T)``, ``loadSerial``, ``history`` and ``undoLog`` read what is left.
* Undo of transaction ``T`` restores, for each object it wrote, the revision before
  ``T``, if the object was not changed since (same state); else it fails as a whole.
* Pack at ``P`` (history-preserving): objects current at ``P`` that are unreachable from
  the root through the revisions current at ``P`` and every revision after ``P`` go;
  so do objects whose revision current at ``P`` is a deletion and that nothing wrote
  since; of the others only the revisions older than the one current at ``P`` go.
  History-free: objects current at ``P`` and unreachable through the current
  references go.  Objects written after ``P`` are roots, never garbage.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

ROOT = 0


@dataclasses.dataclass(frozen=True)
class Revision:
    tid: int
    state: bytes | None          # None: a deletion (undo of a creation)
    refs: frozenset[int]


@dataclasses.dataclass(frozen=True)
class Txn:
    tid: int
    writes: dict[int, Revision]
    by: int                      # the instance that committed it


class Model:
    def __init__(self, keep_history: bool) -> None:
        self.keep_history = keep_history
        self.revisions: dict[int, list[Revision]] = {}
        self.txns: list[Txn] = []
        self.floor: dict[int, int] = {}
        self.gone: set[int] = set()
        self.gone_at: dict[int, int] = {}   # oid -> the pack (epoch) that removed it
        self.epoch = 0                      # packs so far
        self.packed_tid = 0

    # -- committing -----------------------------------------------------------------------
    def commit(self, tid: int, writes: dict[int, tuple[bytes | None, Iterable[int]]],
               by: int) -> None:
        assert not self.txns or tid > self.txns[-1].tid
        revs = {oid: Revision(tid, state, frozenset(refs))
                for oid, (state, refs) in writes.items()}
        for oid, rev in revs.items():
            self.revisions.setdefault(oid, []).append(rev)
            if not self.keep_history:
                self.floor[oid] = tid
        self.txns.append(Txn(tid, revs, by))

    @property
    def last_tid(self) -> int:
        return self.txns[-1].tid if self.txns else 0

    # -- what exists now ------------------------------------------------------------------
    def oids(self) -> list[int]:
        return sorted(self.revisions)

    def exists(self, oid: int) -> bool:
        return oid in self.revisions and oid not in self.gone

    def current(self, oid: int) -> Revision | None:
        """The current revision, None if the object is gone or never existed."""
        return self.revisions[oid][-1] if self.exists(oid) else None

    def live(self) -> list[int]:
        """Objects that exist and are not deleted: what a commit may write or link."""
        return [oid for oid in self.oids() if (rev := self.current(oid)) and rev.state]

    def reachable(self) -> set[int]:
        """Reachable from the root through the current revisions."""
        return _closure({ROOT}, lambda oid: rev.refs if (rev := self.current(oid)) else ())

    def count(self) -> int:
        """len(storage): objects with a current row (history-preserving: deletions too)."""
        return sum(1 for oid in self.revisions if self.exists(oid))

    def kept(self, oid: int) -> list[Revision]:
        """The revisions the storage still has."""
        if not self.exists(oid):
            return []
        floor = self.floor.get(oid, 0)
        return [rev for rev in self.revisions[oid] if rev.tid >= floor]

    # -- reading ---------------------------------------------------------------------------
    def at(self, oid: int, snapshot: int, epoch: int) -> tuple[Revision | None, bool]:
        """The revision a load at ``snapshot`` (taken after ``epoch`` packs) returns
        (None: POSKeyError), and whether a POSKeyError is allowed instead."""
        found = None
        for rev in self.revisions.get(oid, ()):
            if rev.tid <= snapshot:
                found = rev
        if found is None or found.state is None:
            return None, True
        if not self.keep_history:
            return found, self.gone_at.get(oid, epoch + 1) <= epoch
        return found, oid in self.gone or found.tid < self.floor.get(oid, 0)

    def load_before(self, oid: int, tid: int) -> tuple[Revision, int | None] | None | KeyError:
        """``(revision, end)``, None, or KeyError (POSKeyError) for ``loadBefore``."""
        kept = self.kept(oid)
        if not kept:
            return KeyError(oid)
        before = [rev for rev in kept if rev.tid < tid]
        if not before:
            return None
        rev = before[-1]
        if rev.state is None:
            return KeyError(oid)
        later = [r.tid for r in kept if r.tid > rev.tid]
        return rev, (later[0] if later else None)

    def undoable(self) -> list[int]:
        """Transaction ids undoLog lists, newest first."""
        if not self.keep_history:
            return []
        return [txn.tid for txn in reversed(self.txns) if txn.tid > self.packed_tid]

    # -- undo ------------------------------------------------------------------------------
    def undo_writes(self, tid: int) -> dict[int, tuple[bytes | None, frozenset[int]]] | None:
        """What undoing ``tid`` writes, or None if undo must fail."""
        if tid not in self.undoable():
            return None
        txn = next(t for t in self.txns if t.tid == tid)
        writes = {}
        for oid, undone in txn.writes.items():
            current = self.current(oid)
            if current is None or current.state != undone.state:
                return None
            older = [rev for rev in self.kept(oid) if rev.tid < tid]
            if older:
                writes[oid] = (older[-1].state, older[-1].refs)
            else:
                writes[oid] = (None, frozenset())
        return writes

    # -- pack ------------------------------------------------------------------------------
    def pack_plan(self, pack_tid: int, gc: bool) -> "PackPlan | None":
        """The pack's view when it starts; None when it has nothing to do."""
        pack_tid = min(pack_tid, self.last_tid)
        if pack_tid <= 0 or (self.keep_history and pack_tid <= self.packed_tid):
            return None
        if not self.keep_history and not gc:
            return None
        plan = PackPlan(pack_tid, gc, {})
        for oid in self.oids():
            kept = [rev for rev in self.kept(oid) if rev.tid <= pack_tid]
            if kept:
                plan.candidates[oid] = kept[-1]
        plan.start_reach = self._reach(plan, set())
        return plan

    def _reach(self, plan: "PackPlan", dead: set[int]) -> set[int]:
        """What the pack's walk reaches, never passing through ``dead`` objects."""
        after = {oid for oid in self.oids() if self.exists(oid)
                 and self.revisions[oid][-1].tid > plan.pack_tid}
        if self.keep_history:
            def edges(oid: int) -> Iterable[int]:
                refs: set[int] = set()
                keep = plan.candidates.get(oid)
                if keep is not None:
                    refs |= keep.refs
                for rev in self.kept(oid):
                    if rev.tid > plan.pack_tid:
                        refs |= rev.refs
                return refs
        else:
            def edges(oid: int) -> Iterable[int]:
                rev = self.current(oid)
                return rev.refs if rev else ()
        return _closure({ROOT} | after, edges, dead)

    def finish_pack(self, plan: "PackPlan", alive_at_commit: set[int] | None,
                    ) -> set[int]:
        """Apply ``plan`` after a pack during which a commit may have happened
        (``alive_at_commit``: the objects that existed when it did).  Returns the objects
        whose fate can't be told (history-free: reachable when the pack began, unlinked by
        a commit during it before or after the walk got to them); the caller looks."""
        uncertain: set[int] = set()
        self.epoch += 1
        if plan.gc:
            # Garbage the pack deleted before the commit: nothing reaches through it.
            dead = set() if alive_at_commit is None else {
                oid for oid in plan.candidates
                if oid not in plan.start_reach and oid not in alive_at_commit}
            end_reach = self._reach(plan, dead)
            for oid in plan.candidates:
                if oid in end_reach:
                    continue
                if not self.keep_history and oid in plan.start_reach:
                    uncertain.add(oid)
                else:
                    self.remove(oid)
        if self.keep_history:
            for oid, keep in plan.candidates.items():
                if oid in self.gone:
                    continue
                if keep.state is None and self.revisions[oid][-1] is keep:
                    self.remove(oid)
                else:
                    self.floor[oid] = max(self.floor.get(oid, 0), keep.tid)
            self.packed_tid = plan.pack_tid
        return uncertain

    def remove(self, oid: int) -> None:
        """The last pack removed ``oid``."""
        self.gone.add(oid)
        self.gone_at[oid] = self.epoch


@dataclasses.dataclass
class PackPlan:
    pack_tid: int
    gc: bool
    candidates: dict[int, Revision]      # objects current at the pack tid: their revision
    start_reach: set[int] = dataclasses.field(default_factory=set)


def _closure(start: set[int], edges: Callable[[int], Iterable[int]],
             dead: set[int] = frozenset()) -> set[int]:  # type: ignore[assignment]
    seen = set(start) - dead
    todo = list(seen)
    while todo:
        for target in edges(todo.pop()):
            if target not in seen and target not in dead:
                seen.add(target)
                todo.append(target)
    return seen
