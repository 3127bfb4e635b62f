"""Failover: the primary dies under four writers, the standby is promoted, no
acknowledged commit is lost.

A private primary with a synchronous streaming standby (``synchronous_standby_names``:
a commit is acknowledged only once the standby has flushed it).  The writers' URL names
the primary in ``dsn`` and the standby in ``failover-dsns``.  They transfer money in a
loop (``tests.fault.writer``), retrying what a TransientError says may be retried.  The
primary is stopped with ``pg_ctl stop -m immediate`` (a crash) and the standby promoted
(``pg_ctl promote``).  Afterwards every transfer a writer saw acknowledged is in the
database, nothing is applied twice or half (the bank adds up), ``zodbsql verify`` is
clean, and the writers went on committing on the promoted standby.
"""
from __future__ import annotations

import pathlib
import random

import pytest

import zodbsql

from tests.fault.checks import assert_consistent, create_bank
from tests.fault.targets import ScratchDatabase, private_address
from tests.fault.writers import (ACCOUNTS, acknowledged, logged, start_ready,
                                 wait_for_progress, writer_config)
from tests.fault.servers import free_port
from tests.replica.cluster import ReplicatedPostgreSQL
from tests.replica.conftest import start_cluster
from zodbsql.backends.postgresql.options import PostgreSQLOptions
from zodbsql.errors import ConnectionLost

pytestmark = pytest.mark.replica

WRITERS = 4
PROGRESS_TIMEOUT = 90.0


@pytest.mark.parametrize("keep_history", [True, False], ids=["hp", "hf"])
def test_promoted_standby_keeps_every_acknowledged_commit(
        keep_history: bool, tmp_path: pathlib.Path) -> None:
    rng = random.Random()
    cluster = start_cluster(synchronous=True)
    standby = cluster.standby
    assert standby is not None
    try:
        scratch = ScratchDatabase("postgresql", tmp_path, private_address(cluster.primary))
        url = scratch.url(keep_history, commit_lock_timeout=30,
                          failover_dsns=standby.dsn())
        create_bank(url, ACCOUNTS)
        configs = [writer_config(url, tmp_path, f"w{n}", rng) for n in range(WRITERS)]
        children = start_ready(configs, tmp_path)
        try:
            before = wait_for_progress(configs, 20, PROGRESS_TIMEOUT)
            cluster.primary.stop_immediately()
            standby.promote()
            after = wait_for_progress(configs, len(acknowledged(*configs)) + 20,
                                      PROGRESS_TIMEOUT)
            pathlib.Path(configs[0].stop_file).touch()
            for child in children:
                child.wait_for("done", timeout=120)
                assert child.wait() == 0, child.stderr_tail()
        finally:
            for child in children:
                child.kill()
        unknown = logged("unknown", *configs)
        assert not unknown, f"commits of unknown outcome: {sorted(unknown.items())[:5]}"
        applied = assert_consistent(url, acknowledged(*configs),
                                    retried=logged("retried", *configs))
        print(f"{before} acknowledged before the failover, {after} soon after;"
              f" {len(acknowledged(*configs))} in all, {len(applied)} applied,"
              f" {len(logged('retried', *configs))} retried")
    finally:
        cluster.cleanup()


def test_sessions_go_to_the_first_primary_that_answers(
        replicated: ReplicatedPostgreSQL) -> None:
    standby = replicated.standby
    assert standby is not None
    dead = f"host=127.0.0.1 port={free_port()} user=postgres dbname=test connect_timeout=5"
    storage = zodbsql.open_storage(PostgreSQLOptions(
        dsn=dead, failover_dsns=f"{standby.dsn()}; {replicated.primary.dsn()}"))
    try:
        assert storage.backend.describe().endswith(f"127.0.0.1:{replicated.primary.port}")
    finally:
        storage.close()
        storage.backend.destroy()  # the tables it made in schema public
    # The standby is in recovery, the first primary down: neither takes a session.
    with pytest.raises(ConnectionLost) as failed:
        zodbsql.open_storage(PostgreSQLOptions(dsn=dead, failover_dsns=standby.dsn()))
    message = str(failed.value)
    assert "no primary could be reached" in message and "hot standby" in message
