"""One pack at a time across the Galera cluster: the pack lock holds on every node."""
from __future__ import annotations

import pytest
from ZODB.utils import u64

from tests.cluster.conftest import GaleraFactory
from zodbsql.errors import DatabaseError


def test_a_pack_through_another_node_waits_for_the_first(
        galera_factory: GaleraFactory) -> None:
    if not galera_factory.param.keep_history:
        pytest.skip("history-free: the lock is the same in both modes")
    first = galera_factory.open(commit_lock_timeout=2)
    second = galera_factory.open_on(1, commit_lock_timeout=2)
    tid = u64(first.lastTransaction())
    holding = first.backend.connect()
    other = second.backend.connect()
    try:
        first.backend.packer.prepare(holding, tid, True)   # a pack under way on node 1
        with pytest.raises(DatabaseError, match="another process has been packing"):
            second.backend.packer.prepare(other, tid, True)
        holding.close()                                    # its session ends
        second.backend.packer.prepare(other, tid, True)    # now node 2 may pack
        second.backend.packer.finish(other, tid)
    finally:
        holding.close()
        other.close()
    # A whole pack through each node still works.
    first.pack(0, None)
    second.pack(0, None)
