"""loadBefore(oid, tid): the revision current just before ``tid`` and the tid ending it.

Asked for the tid of the current revision, it never returns that revision: the
history-preserving storage returns the one before (ended by the current tid), the
history-free storage, which keeps no older one, returns None.
"""
from __future__ import annotations

from typing import Any

import pytest
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.POSException import POSKeyError
from ZODB.utils import p64, u64


def test_load_before_the_current_serial(storage_factory: Any) -> None:
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["a"] = PersistentMapping(v=1)
        with db.transaction() as conn:
            oid = conn.root()["a"]._p_oid
        first_state, first = storage.load(oid)
        with db.transaction() as conn:
            conn.root()["a"]["v"] = 2
        state, current = storage.load(oid)
        after = p64(u64(current) + 1)
        assert storage.loadBefore(oid, after) == (state, current, None)
        assert storage.loadBefore(oid, first) is None   # nothing before the first one
        if storage_factory.param.keep_history:
            assert storage.loadBefore(oid, current) == (first_state, first, current)
        else:
            assert storage.loadBefore(oid, current) is None
        missing = p64(u64(oid) + 1000)
        with pytest.raises(POSKeyError) as raised:
            storage.loadBefore(missing, after)
        assert raised.value.args == (missing,)      # the error names the object
    finally:
        db.close()
