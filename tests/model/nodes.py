"""Object states as ZODB writes them, with chosen references, and nothing else.

A node is a ``PersistentMapping`` record ``{"v": value, "links": [...]}`` whose links are
persistent references (``(oid, class)``), so the storage finds them as ZODB's own
``referencesf`` does.  Its class has no ``_p_resolveConflict``: every write conflict and
every undo of a changed object fails, which the model predicts.
"""
from __future__ import annotations

import io
import pickle
from typing import Iterable

from persistent.mapping import PersistentMapping
from ZODB.serialize import referencesf
from ZODB.utils import p64, u64


class _Ref:
    def __init__(self, oid: int) -> None:
        self.oid = oid


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: object) -> object:
        if isinstance(obj, _Ref):
            return (p64(obj.oid), PersistentMapping)
        return None


def node_state(value: int, links: Iterable[int]) -> bytes:
    out = io.BytesIO()
    pickler = _Pickler(out, 3)
    pickler.dump((PersistentMapping, None))
    pickler.dump({"data": {"v": value, "links": [_Ref(oid) for oid in sorted(links)]}})
    return out.getvalue()


def links_of(state: bytes) -> set[int]:
    """What the storage will record as the state's references."""
    return {u64(ref) for ref in referencesf(state)}
