"""Writers on every node of the Galera cluster at once, and a node killed under load.

One writer process per node runs the BTree + Length workload (tests/cluster/writer.py)
with retries.  Afterwards every node must hold exactly what was acknowledged: the Length
equals the number of keys in the tree, every acknowledged key is there, and nothing is
there that no writer tried.  The second test kills a node with SIGKILL while the
writers run: the writers on the other nodes must go on committing, the node must rejoin
(IST from a survivor's gcache), and ``zodbsql verify`` must be clean on every node.
"""
from __future__ import annotations

import pathlib
import re
import time
import pytest
import ZODB

import zodbsql
from tests.cluster.conftest import GaleraFactory
from tests.cluster.galera import GaleraCluster
from tests.cluster.writer import ClusterWriterConfig
from tests.fault.checks import run_verify
from tests.fault.children import Child
from tests.fault.writer import read_log

COMMITS = 40


def prepare(factory: GaleraFactory) -> None:
    from BTrees.Length import Length
    from BTrees.OOBTree import OOBTree
    db = ZODB.DB(factory.open())
    try:
        with db.transaction() as conn:
            conn.root()["length"] = Length()
            conn.root()["tree"] = OOBTree()
    finally:
        db.close()


def start_writers(factory: GaleraFactory, tmp_path: pathlib.Path, commits: int,
                  stop_file: str = "") -> tuple[list[ClusterWriterConfig], list[Child]]:
    configs = [ClusterWriterConfig(url=factory.url(node), log=str(tmp_path / f"w{node}.log"),
                                   name=f"w{node}", commits=commits, stop_file=stop_file)
               for node in range(len(factory.cluster.nodes))]
    children = [Child("tests.cluster.writer", vars(c), tmp_path / f"{c.name}.err")
                for c in configs]
    for child in children:
        child.wait_for("ready", timeout=60)
    return configs, children


def acks(config: ClusterWriterConfig) -> int:
    return len(read_log(config.log)["ack"])


def wait_acks(configs: list[ClusterWriterConfig], more: int, what: str,
              timeout: float = 120.0) -> float:
    """Until each writer of ``configs`` acknowledged ``more`` commits; the seconds taken."""
    started = time.monotonic()
    goals = [acks(config) + more for config in configs]
    while any(acks(config) < goal for config, goal in zip(configs, goals)):
        assert time.monotonic() - started < timeout, f"{what} stopped committing"
        time.sleep(0.2)
    return time.monotonic() - started


def finish(children: list[Child], timeout: float = 240.0) -> list[str]:
    done = [child.wait_for("done", timeout=timeout) for child in children]
    for child in children:
        assert child.wait(60) == 0, child.stderr_tail()
    return done


def node_contents(factory: GaleraFactory, node: int) -> tuple[int, set[str]]:
    """(the Length, the tree's keys) as node ``node`` answers."""
    db = ZODB.DB(zodbsql.open_storage(factory.url(node)))
    try:
        with db.transaction() as conn:
            return conn.root()["length"](), set(conn.root()["tree"].keys())
    finally:
        db.close()


def check_every_node(factory: GaleraFactory, configs: list[ClusterWriterConfig]) -> int:
    """Every node holds every acknowledged commit and nothing half-applied; returns
    the number of commits found."""
    acked: set[str] = set()
    unknown: set[str] = set()
    for config in configs:
        entries = read_log(config.log)
        acked |= set(entries["ack"])
        unknown |= set(entries["unknown"])
    found = []
    for node in range(len(factory.cluster.nodes)):
        length, keys = node_contents(factory, node)
        assert length == len(keys), f"node{node + 1}: Length {length}, {len(keys)} keys"
        assert acked <= keys, f"node{node + 1} lacks {sorted(acked - keys)[:10]}"
        assert keys <= acked | unknown, f"node{node + 1} has {sorted(keys - acked - unknown)}"
        found.append(keys)
    assert all(keys == found[0] for keys in found), "the nodes differ"
    return len(found[0])


def test_three_writers_one_per_node(galera_factory: GaleraFactory,
                                    tmp_path: pathlib.Path) -> None:
    prepare(galera_factory)
    started = time.monotonic()
    configs, children = start_writers(galera_factory, tmp_path, COMMITS)
    done = finish(children)
    seconds = time.monotonic() - started
    total = check_every_node(galera_factory, configs)
    assert total == COMMITS * len(configs)
    print(f"{total} commits from 3 nodes in {seconds:.1f}s; writers: {done}")


def test_node_killed_under_load(galera: GaleraCluster, galera_factory: GaleraFactory,
                                tmp_path: pathlib.Path) -> None:
    if not galera_factory.param.keep_history:
        pytest.skip("history-free: the kill test runs once per cluster suite, in the"
                    " history-preserving mode (the writers test covers both modes)")
    prepare(galera_factory)
    stop = tmp_path / "stop"
    configs, children = start_writers(galera_factory, tmp_path, 100_000, str(stop))
    victim = galera.nodes[2]
    wait_acks(configs, 5, "the writers")     # all three are committing
    victim.stop_immediately()                # kill -9 mid-load
    # The others go on: each commits ten more while the node is down.
    survivors_went_on = wait_acks(configs[:2], 10, "the writers on the other nodes")
    before = victim.log.read_text(errors="replace")
    victim.start()
    for node in galera.nodes:
        node.wait_synced(len(galera.nodes))
    rejoin = victim.log.read_text(errors="replace")[len(before):]
    # "IST ... f: N" with N > 0: the node asked for the write sets after its own
    # position (IST); f: 0 is a full copy (SST).
    transfer = "IST" if re.search(r"IST uuid:\S+ f: [1-9]", rejoin) else "SST"
    # The victim's writer reconnects and commits again, the others still do.
    wait_acks(configs, 5, "a writer after the node rejoined")
    stop.touch()
    done = finish(children)
    total = check_every_node(galera_factory, configs)
    for index in range(len(galera.nodes)):
        run_verify(galera_factory.url(index))
    print(f"node3 killed; the others committed 10 more each within"
          f" {survivors_went_on:.1f}s; node3 rejoined by {transfer}; {total} commits"
          f" on every node; writers: {done}")
    assert transfer == "IST", rejoin[-3000:]
