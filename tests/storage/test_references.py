"""References are recorded at commit: "who references this object" is one query."""
from __future__ import annotations

import transaction
import ZODB
from persistent.mapping import PersistentMapping


def test_referrers_follow_the_current_revisions(storage_factory) -> None:
    db = ZODB.DB(storage_factory.open())
    try:
        conn = db.open()
        shared = PersistentMapping()
        conn.root()["a"] = PersistentMapping(child=shared)
        conn.root()["b"] = PersistentMapping(child=shared)
        transaction.commit()
        a, b = conn.root()["a"], conn.root()["b"]
        storage = db.storage
        # In oid order, whatever order the commit wrote them in.
        assert storage.referrers(shared._p_oid) == sorted([a._p_oid, b._p_oid])
        del b["child"]
        transaction.commit()
        # Only current revisions count, also when history keeps the old one.
        assert storage.referrers(shared._p_oid) == [a._p_oid]
        assert storage.referrers(a._p_oid) == [conn.root()._p_oid]
        # A new revision that keeps a reference and adds one (history-free, only the
        # references that changed are written): both are recorded, once.
        added = a["other"] = PersistentMapping()
        transaction.commit()
        assert storage.referrers(shared._p_oid) == [a._p_oid]
        assert storage.referrers(added._p_oid) == [a._p_oid]
        a["other"] = a["child"] = PersistentMapping()
        transaction.commit()
        assert storage.referrers(shared._p_oid) == []
        assert storage.referrers(added._p_oid) == []
        assert storage.referrers(a["child"]._p_oid) == [a._p_oid]
        conn.close()
    finally:
        db.close()
