"""``zodbsql doctor`` on a Galera node: the cluster and the settings Galera needs."""
from __future__ import annotations

import pytest

from tests.cluster.conftest import GaleraFactory
from zodbsql.backends.base.inspector import ERROR, OK
from zodbsql.cli.doctor import diagnose_storage
from zodbsql.cli.main import main


def test_doctor_reports_the_cluster(galera_factory: GaleraFactory,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    if not galera_factory.param.keep_history:
        pytest.skip("history-free: doctor's Galera findings do not depend on the mode")
    storage = galera_factory.open()
    findings = diagnose_storage(storage, clients=2, checks=True)
    by_name = {f.name: f for f in findings}
    assert by_name["galera cluster"].level == OK
    assert by_name["galera cluster"].found == "3 nodes, component Primary, this node Synced"
    assert by_name["binlog_format"].level == OK and by_name["binlog_format"].found == "ROW"
    assert by_name["innodb_autoinc_lock_mode"].found == "2"
    assert by_name["wsrep_sync_wait"].level == OK
    for check in ("check: store and load", "check: conflicts", "check: pack"):
        assert by_name[check].level == OK, by_name[check]
    assert not [f for f in findings if f.level == ERROR]

    # A global wsrep_sync_wait (node 1's, where the admin session is) is reported with
    # its fix, and set back.
    admin = galera_factory.admin.cursor()
    admin.execute("SET GLOBAL wsrep_sync_wait = 1")
    try:
        assert main(["doctor", "zodbsql+" + galera_factory.url(0), "--no-checks"]) == 0
    finally:
        admin.execute("SET GLOBAL wsrep_sync_wait = 0")
    out = capsys.readouterr().out
    assert "galera cluster: 3 nodes, component Primary, this node Synced" in out
    assert "wsrep_sync_wait: 1" in out and "set wsrep_sync_wait = 0" in out
