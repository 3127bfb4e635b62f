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

from typing import Sequence

from zodbsql.backends.base.contract import BackendContract, ConnectionRole, Revision

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
UNREACHED = "SELECT zoid FROM pack_object p WHERE zoid IN ({oids}) AND NOT EXISTS" \
    " (SELECT 1 FROM pack_reach x WHERE x.zoid = p.zoid)"
HP_STILL_DELETED = (
    "SELECT p.zoid FROM pack_object p"
    " JOIN object_state s ON s.zoid = p.zoid AND s.tid = p.keep_tid"
    " WHERE p.zoid IN ({oids}) AND s.state IS NULL"
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
    "DELETE FROM blob_ref WHERE zoid IN ({oids})",
    "DELETE FROM object_ref WHERE zoid IN ({oids})",
    "DELETE FROM current_object WHERE zoid IN ({oids})",
    "DELETE FROM object_state WHERE zoid IN ({oids})",
)
HF_DELETE_OBJECTS = (
    "DELETE FROM blob_ref WHERE zoid IN ({oids})",
    "DELETE FROM object_ref WHERE zoid IN ({oids})",
    "DELETE FROM object_state WHERE zoid IN ({oids})",
)
DELETE_OLD_STATES = "DELETE FROM object_state WHERE zoid = %s AND tid < %s"
DELETE_OLD_REFS = "DELETE FROM object_ref WHERE zoid = %s AND tid < %s"
DELETE_OLD_BLOB_REFS = "DELETE FROM blob_ref WHERE zoid = %s AND tid < %s"
COUNT_GARBAGE = (
    "SELECT COUNT(*) FROM pack_object p"
    " WHERE NOT EXISTS (SELECT 1 FROM pack_reach x WHERE x.zoid = p.zoid)")
COUNT_OLD_REVISIONS = "SELECT COALESCE(SUM(old_count), 0) FROM pack_object"
MARK_PACKED = "UPDATE transactions SET packed = 1 WHERE tid <= %s AND packed = 0"
DELETE_EMPTY_TRANSACTIONS = (
    "DELETE FROM transactions WHERE tid <= %s"
    " AND NOT EXISTS (SELECT 1 FROM object_state s WHERE s.tid = transactions.tid)")


class Packer:
    """The SQL steps of a pack; :mod:`zodbsql.storage.pack` drives them (a
    ``PackerRole``)."""

    #: Statements creating the work tables (temporary where the backend allows).
    CREATE_WORK_TABLES: tuple[str, ...] = ()

    def __init__(self, backend: BackendContract) -> None:
        self.backend = backend
        self.keep_history = backend.keep_history

    def prepare(self, conn: ConnectionRole, pack_tid: int, gc: bool) -> None:
        """Fill ``pack_object`` and seed ``pack_reach`` with the walk's roots."""
        for statement in self.CREATE_WORK_TABLES:
            conn.execute(statement)
        conn.execute(CLEAR_PACK_OBJECT)
        conn.execute(CLEAR_PACK_REACH)
        hp = self.keep_history
        conn.execute(HP_FILL_PACK_OBJECT if hp else HF_FILL_PACK_OBJECT, (pack_tid,))
        if gc:
            conn.execute(ADD_ROOT)
            conn.execute(HP_ADD_NEWER if hp else HF_ADD_NEWER, (pack_tid,))

    def walk_step(self, conn: ConnectionRole, generation: int, pack_tid: int) -> int:
        """Add generation ``generation + 1``; return how many objects it added."""
        if self.keep_history:
            return conn.execute(HP_WALK_STEP, (generation + 1, generation, pack_tid))
        return conn.execute(HF_WALK_STEP, (generation + 1, generation))

    def new_targets(self, conn: ConnectionRole, since_tid: int) -> list[int]:
        """Oids written after ``since_tid`` and the targets of their references, not
        reached yet."""
        sql = HP_NEW_TARGETS if self.keep_history else HF_NEW_TARGETS
        return [int(row[0]) for row in conn.fetchall(sql, (since_tid, since_tid))]

    def add_reached(self, conn: ConnectionRole, oids: Sequence[int], generation: int) -> None:
        conn.executemany(ADD_REACHED, [(oid, generation) for oid in oids])

    def next_garbage(self, conn: ConnectionRole, after: int, limit: int) -> list[int]:
        """Candidates: unreached objects with oid > after (read without the lock)."""
        return [int(row[0]) for row in conn.fetchall(NEXT_GARBAGE, (after, limit))]

    def unreached(self, conn: ConnectionRole, oids: Sequence[int]) -> list[int]:
        """Those of ``oids`` still unreached (after a rescue; commit lock held)."""
        sql = UNREACHED.format(oids=", ".join(["%s"] * len(oids)))
        return [int(row[0]) for row in conn.fetchall(sql, list(oids))]

    def next_deleted(self, conn: ConnectionRole, after: int, limit: int) -> list[int]:
        """Candidates: objects left with nothing but a deletion (read without the lock)."""
        return [int(row[0]) for row in conn.fetchall(HP_NEXT_DELETED, (after, limit))]

    def still_deleted(self, conn: ConnectionRole, oids: Sequence[int]) -> list[int]:
        """Those of ``oids`` that nothing recreated meanwhile (commit lock held)."""
        sql = HP_STILL_DELETED.format(oids=", ".join(["%s"] * len(oids)))
        return [int(row[0]) for row in conn.fetchall(sql, list(oids))]

    def delete_objects(self, conn: ConnectionRole, oids: Sequence[int]) -> None:
        marks = ", ".join(["%s"] * len(oids))
        for template in (HP_DELETE_OBJECTS if self.keep_history else HF_DELETE_OBJECTS):
            conn.execute(template.format(oids=marks), list(oids))

    def next_with_old_revisions(self, conn: ConnectionRole, after: int,
                                limit: int) -> list[Revision]:
        return [(int(o), int(t)) for o, t in conn.fetchall(NEXT_WITH_OLD_REVISIONS,
                                                            (after, limit))]

    def delete_old_revisions(self, conn: ConnectionRole, keep: Sequence[Revision]) -> None:
        conn.executemany(DELETE_OLD_STATES, keep)
        conn.executemany(DELETE_OLD_REFS, keep)
        conn.executemany(DELETE_OLD_BLOB_REFS, keep)

    def count(self, conn: ConnectionRole, gc: bool) -> dict[str, int]:
        """What the prepared pack would remove: garbage objects and old revisions."""
        garbage = conn.fetchone(COUNT_GARBAGE) if gc else None
        old = conn.fetchone(COUNT_OLD_REVISIONS) if self.keep_history else None
        return {"garbage": int(garbage[0]) if garbage else 0,
                "old_revisions": int(old[0]) if old else 0}

    def finish(self, conn: ConnectionRole, pack_tid: int) -> None:
        if self.keep_history:
            conn.execute(MARK_PACKED, (pack_tid,))
            conn.execute(DELETE_EMPTY_TRANSACTIONS, (pack_tid,))
        conn.execute(CLEAR_PACK_OBJECT)
        conn.execute(CLEAR_PACK_REACH)
