"""Packer: the set-based steps of pack and garbage collection.

Pack works on two work tables: ``pack_object`` (every object that existed at the pack
tid, with ``keep_tid``, the revision current then) and ``pack_reach`` (objects reachable
from the root, found generation by generation).  Deleting happens afterwards in batches
of explicit oid lists, each batch in its own short write transaction, so writers commit
between batches; deletes name oids instead of using a subquery, which every database
plans well.

Blob references go with the revisions and objects they belong to, in the same batches;
afterwards blob contents no reference uses any more are freed (``storage/pack.py``).

Reachability follows the references recorded at commit: in history-preserving mode the
edges of each object's ``keep_tid`` revision and of every revision after the pack tid.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar, Sequence

from zodbsql.backends.base.contract import BackendContract, ConnectionRole, Revision
from zodbsql.backends.base.statements import for_mode, in_list

CLEAR_PACK_OBJECT = "DELETE FROM pack_object"
CLEAR_PACK_REACH = "DELETE FROM pack_reach"
HP_FILL_PACK_OBJECT = (
    "INSERT INTO pack_object (zoid, keep_tid, old_count)"
    " SELECT zoid, MAX(tid), COUNT(*) - 1 FROM object_state WHERE tid <= %s GROUP BY zoid")
HF_FILL_PACK_OBJECT = (
    "INSERT INTO pack_object (zoid, keep_tid, old_count)"
    " SELECT zoid, tid, 0 FROM object_state WHERE tid <= %s")
ADD_ROOT = "INSERT INTO pack_reach (zoid, gen) VALUES (0, 0)"
HP_ADD_NEWER = (
    "INSERT INTO pack_reach (zoid, gen) SELECT DISTINCT zoid, 0 FROM object_state"
    " WHERE tid > %s AND zoid <> 0")
HF_ADD_NEWER = (
    "INSERT INTO pack_reach (zoid, gen) SELECT zoid, 0 FROM object_state"
    " WHERE tid > %s AND zoid <> 0")
# One generation of the walk: targets of the previous generation's kept edges.
HP_WALK_STEP = (
    "INSERT INTO pack_reach (zoid, gen)"
    " SELECT DISTINCT r.to_zoid, %s FROM pack_reach f"
    " JOIN object_ref r ON r.zoid = f.zoid"
    " LEFT JOIN pack_object p ON p.zoid = r.zoid"
    " WHERE f.gen = %s AND (r.tid > %s OR r.tid = p.keep_tid)"
    " AND NOT EXISTS (SELECT 1 FROM pack_reach x WHERE x.zoid = r.to_zoid)")
HF_WALK_STEP = (
    "INSERT INTO pack_reach (zoid, gen)"
    " SELECT DISTINCT r.to_zoid, %s FROM pack_reach f"
    " JOIN object_ref r ON r.zoid = f.zoid"
    " WHERE f.gen = %s"
    " AND NOT EXISTS (SELECT 1 FROM pack_reach x WHERE x.zoid = r.to_zoid)")
# Objects committed after the walk began, and the targets of their references: a
# writer may have linked garbage again, or written an object the walk found unreachable
# (written after the pack time, it stays, as it would in a pack started later).
# Found through the revisions written since (object_state's tid index), never by
# scanning object_ref: this runs under the commit lock before every batch.
HP_NEW_TARGETS = (
    "SELECT DISTINCT r.to_zoid FROM object_state s"
    " JOIN object_ref r ON r.zoid = s.zoid AND r.tid = s.tid WHERE s.tid > %s"
    " AND NOT EXISTS (SELECT 1 FROM pack_reach x WHERE x.zoid = r.to_zoid)"
    " UNION SELECT s.zoid FROM object_state s WHERE s.tid > %s"
    " AND NOT EXISTS (SELECT 1 FROM pack_reach x WHERE x.zoid = s.zoid)")
HF_NEW_TARGETS = (
    "SELECT DISTINCT r.to_zoid FROM object_ref r JOIN object_state s ON s.zoid = r.zoid"
    " WHERE s.tid > %s"
    " AND NOT EXISTS (SELECT 1 FROM pack_reach x WHERE x.zoid = r.to_zoid)"
    " UNION SELECT s.zoid FROM object_state s WHERE s.tid > %s"
    " AND NOT EXISTS (SELECT 1 FROM pack_reach x WHERE x.zoid = s.zoid)")
ADD_REACHED = "INSERT INTO pack_reach (zoid, gen) VALUES (%s, %s)"
NEXT_GARBAGE = (
    "SELECT p.zoid FROM pack_object p WHERE p.zoid > %s"
    " AND NOT EXISTS (SELECT 1 FROM pack_reach x WHERE x.zoid = p.zoid)"
    " ORDER BY p.zoid LIMIT %s")
# Objects whose kept revision is a deletion (deleteObject, an undone creation) and that
# nothing recreated since: IExternalGC removes them once their older revisions go.
# Re-checks of a batch of candidates, under the commit lock: bounded by the batch.
UNREACHED = "SELECT zoid FROM pack_object p WHERE zoid {listed} AND NOT EXISTS" \
    " (SELECT 1 FROM pack_reach x WHERE x.zoid = p.zoid)"
HP_STILL_DELETED = (
    "SELECT p.zoid FROM pack_object p"
    " JOIN object_state s ON s.zoid = p.zoid AND s.tid = p.keep_tid"
    " WHERE p.zoid {listed} AND s.state IS NULL"
    " AND NOT EXISTS (SELECT 1 FROM object_state n WHERE n.zoid = p.zoid AND n.tid > p.keep_tid)")
HP_NEXT_DELETED = (
    "SELECT p.zoid FROM pack_object p"
    " JOIN object_state s ON s.zoid = p.zoid AND s.tid = p.keep_tid"
    " WHERE p.zoid > %s AND s.state IS NULL"
    " AND NOT EXISTS (SELECT 1 FROM object_state n WHERE n.zoid = p.zoid AND n.tid > p.keep_tid)"
    " ORDER BY p.zoid LIMIT %s")
NEXT_WITH_OLD_REVISIONS = (
    "SELECT zoid, keep_tid FROM pack_object WHERE zoid > %s AND old_count > 0"
    " ORDER BY zoid LIMIT %s")
HP_DELETE_OBJECTS = (
    "DELETE FROM blob_ref WHERE zoid {listed}",
    "DELETE FROM current_object WHERE zoid {listed}",
    "DELETE FROM object_state WHERE zoid {listed}",
)
HF_DELETE_OBJECTS = (
    "DELETE FROM blob_ref WHERE zoid {listed}",
    "DELETE FROM object_state WHERE zoid {listed}",
)
DELETE_OLD_STATES = "DELETE FROM object_state WHERE zoid = %s AND tid < %s"
DELETE_OLD_BLOB_REFS = "DELETE FROM blob_ref WHERE zoid = %s AND tid < %s"
COUNT_GARBAGE = (
    "SELECT COUNT(*) FROM pack_object p"
    " WHERE NOT EXISTS (SELECT 1 FROM pack_reach x WHERE x.zoid = p.zoid)")
COUNT_OLD_REVISIONS = "SELECT COALESCE(SUM(old_count), 0) FROM pack_object"
MARK_PACKED = "UPDATE transactions SET packed = 1 WHERE tid <= %s AND packed = 0"
DELETE_EMPTY_TRANSACTIONS = (
    "DELETE FROM transactions WHERE tid <= %s"
    " AND NOT EXISTS (SELECT 1 FROM object_state s WHERE s.tid = transactions.tid)")


# The record of deleted objects (backends/base/poller.py): a new number per batch, its
# row stamped with the last tid committed.  Pruning keeps the records of the previous
# pack (those after ``mark_seq``): a process that polls once between two packs misses
# none.
NEXT_GONE_SEQ = "UPDATE gone_row SET last_seq = last_seq + 1"
ADD_GONE = ("INSERT INTO object_gone (seq, tid, zoids)"
            " SELECT g.last_seq, c.last_tid, %s FROM gone_row g, commit_row c")
# Assigned in this order, MySQL (which reads the columns assigned before) and the others
# (which read the old values) agree.
RAISE_GONE_FLOOR = (
    "UPDATE gone_row SET floor_tid = CASE WHEN mark_seq > floor_seq"
    " THEN (SELECT last_tid FROM commit_row) ELSE floor_tid END,"
    " floor_seq = mark_seq, mark_seq = last_seq")
PRUNE_GONE = "DELETE FROM object_gone WHERE seq <= (SELECT floor_seq FROM gone_row)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PackerStatements:
    """The packer's statements in one history mode ("": none in this mode)."""

    clear_pack_object: str = CLEAR_PACK_OBJECT
    clear_pack_reach: str = CLEAR_PACK_REACH
    fill_pack_object: str
    add_root: str = ADD_ROOT
    add_newer: str
    #: One generation of the walk: ``(next gen, gen, pack tid)``; history-free
    #: ``(next gen, gen)``.
    walk_step: str
    new_targets: str
    add_reached: str = ADD_REACHED
    next_garbage: str = NEXT_GARBAGE
    unreached: str = UNREACHED
    next_deleted: str = ""
    still_deleted: str = ""
    #: Run in order to delete whole objects (``{listed}``).
    delete_objects: tuple[str, ...]
    next_with_old_revisions: str = NEXT_WITH_OLD_REVISIONS
    delete_old_states: str = DELETE_OLD_STATES
    delete_old_blob_refs: str = DELETE_OLD_BLOB_REFS
    count_garbage: str = COUNT_GARBAGE
    count_old_revisions: str = ""
    mark_packed: str = ""
    delete_empty_transactions: str = ""


class Packer:
    """The SQL steps of a pack; :mod:`zodbsql.storage.pack` drives them (a
    ``PackerRole``)."""

    #: Statements creating the work tables (temporary where the backend allows).
    CREATE_WORK_TABLES: tuple[str, ...] = ()
    HISTORY_PRESERVING: ClassVar[PackerStatements] = PackerStatements(
        fill_pack_object=HP_FILL_PACK_OBJECT, add_newer=HP_ADD_NEWER, walk_step=HP_WALK_STEP,
        new_targets=HP_NEW_TARGETS, next_deleted=HP_NEXT_DELETED,
        still_deleted=HP_STILL_DELETED, delete_objects=HP_DELETE_OBJECTS,
        count_old_revisions=COUNT_OLD_REVISIONS, mark_packed=MARK_PACKED,
        delete_empty_transactions=DELETE_EMPTY_TRANSACTIONS)
    HISTORY_FREE: ClassVar[PackerStatements] = PackerStatements(
        fill_pack_object=HF_FILL_PACK_OBJECT, add_newer=HF_ADD_NEWER, walk_step=HF_WALK_STEP,
        new_targets=HF_NEW_TARGETS, delete_objects=HF_DELETE_OBJECTS)

    def __init__(self, backend: BackendContract) -> None:
        self.backend = backend
        self.keep_history = backend.keep_history
        self.sql = for_mode(self.keep_history, self.HISTORY_PRESERVING, self.HISTORY_FREE)

    def prepare(self, conn: ConnectionRole, pack_tid: int, gc: bool) -> None:
        """Fill ``pack_object`` and seed ``pack_reach`` with the walk's roots."""
        for statement in self.CREATE_WORK_TABLES:
            conn.execute(statement)
        sql = self.sql
        conn.execute(sql.clear_pack_object)
        conn.execute(sql.clear_pack_reach)
        conn.execute(sql.fill_pack_object, (pack_tid,))
        if gc:
            conn.execute(sql.add_root)
            conn.execute(sql.add_newer, (pack_tid,))

    def walk_step(self, conn: ConnectionRole, generation: int, pack_tid: int) -> int:
        """Add generation ``generation + 1``; return how many objects it added."""
        if self.keep_history:
            return conn.execute(self.sql.walk_step, (generation + 1, generation, pack_tid))
        return conn.execute(self.sql.walk_step, (generation + 1, generation))

    def new_targets(self, conn: ConnectionRole, since_tid: int) -> list[int]:
        """Oids written after ``since_tid`` and the targets of their references, not
        reached yet."""
        rows = conn.fetchall(self.sql.new_targets, (since_tid, since_tid))
        return [int(row[0]) for row in rows]

    def add_reached(self, conn: ConnectionRole, oids: Sequence[int], generation: int) -> None:
        conn.executemany(self.sql.add_reached, [(oid, generation) for oid in oids])

    def next_garbage(self, conn: ConnectionRole, after: int, limit: int) -> list[int]:
        """Candidates: unreached objects with oid > after (read without the lock)."""
        return [int(row[0]) for row in conn.fetchall(self.sql.next_garbage, (after, limit))]

    def listed(self, oids: Sequence[int]) -> tuple[str, list[Any]]:
        """The test of a column against ``oids`` (``{listed}`` in the statements) and
        its parameters: ``IN (%s, ...)`` here, one array on PostgreSQL."""
        return f"IN ({in_list(len(oids))})", list(oids)

    def unreached(self, conn: ConnectionRole, oids: Sequence[int]) -> list[int]:
        """Those of ``oids`` still unreached (after a rescue; commit lock held)."""
        test, params = self.listed(oids)
        return [int(row[0]) for row in conn.fetchall(self.sql.unreached.format(listed=test),
                                                     params)]

    def next_deleted(self, conn: ConnectionRole, after: int, limit: int) -> list[int]:
        """Candidates: objects left with nothing but a deletion (read without the lock)."""
        return [int(row[0]) for row in conn.fetchall(self.sql.next_deleted, (after, limit))]

    def still_deleted(self, conn: ConnectionRole, oids: Sequence[int]) -> list[int]:
        """Those of ``oids`` that nothing recreated meanwhile (commit lock held)."""
        test, params = self.listed(oids)
        return [int(row[0]) for row in conn.fetchall(
            self.sql.still_deleted.format(listed=test), params)]

    def delete_objects(self, conn: ConnectionRole, oids: Sequence[int]) -> None:
        test, params = self.listed(oids)
        for template in self.sql.delete_objects:
            conn.execute(template.format(listed=test), params)

    def record_gone(self, conn: ConnectionRole, oids: Sequence[int]) -> None:
        conn.execute(NEXT_GONE_SEQ)
        conn.execute(ADD_GONE, (json.dumps(list(oids), separators=(",", ":")),))

    def prune_gone(self, conn: ConnectionRole) -> None:
        conn.execute(RAISE_GONE_FLOOR)
        conn.execute(PRUNE_GONE)

    def next_with_old_revisions(self, conn: ConnectionRole, after: int,
                                limit: int) -> list[Revision]:
        return [(int(o), int(t)) for o, t in conn.fetchall(self.sql.next_with_old_revisions,
                                                            (after, limit))]

    def delete_old_revisions(self, conn: ConnectionRole, keep: Sequence[Revision]) -> None:
        conn.executemany(self.sql.delete_old_states, keep)
        conn.executemany(self.sql.delete_old_blob_refs, keep)

    def count(self, conn: ConnectionRole, gc: bool) -> dict[str, int]:
        """What the prepared pack would remove: garbage objects and old revisions."""
        garbage = conn.fetchone(self.sql.count_garbage) if gc else None
        old = conn.fetchone(self.sql.count_old_revisions) if self.keep_history else None
        return {"garbage": int(garbage[0]) if garbage else 0,
                "old_revisions": int(old[0]) if old else 0}

    def finish(self, conn: ConnectionRole, pack_tid: int) -> None:
        if self.keep_history:
            conn.execute(self.sql.mark_packed, (pack_tid,))
            conn.execute(self.sql.delete_empty_transactions, (pack_tid,))
        conn.execute(self.sql.clear_pack_object)
        conn.execute(self.sql.clear_pack_reach)
