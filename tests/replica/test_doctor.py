"""``zodbsql doctor`` on a replicated cluster: the standby the primary streams to, each
of replica-dsns with its lag, and what is between the storage and the server."""
from __future__ import annotations

import json
import subprocess
import urllib.parse

import pytest

from tests.fault.children import ROOT, child_env, zodbsql_command
from tests.replica.cluster import PrivatePgBouncer, ReplicatedPostgreSQL

pytestmark = pytest.mark.replica


def doctor(url: str) -> dict[str, dict[str, str]]:
    result = subprocess.run(zodbsql_command() + ["doctor", "--no-checks", "--json", url],
                            cwd=ROOT, env=child_env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return {f["name"]: f for f in json.loads(result.stdout)["findings"]}


def test_doctor_reports_standbys_and_lag(replicated: ReplicatedPostgreSQL) -> None:
    standby = replicated.standby
    assert standby is not None
    query = urllib.parse.urlencode({"replica_dsns": standby.dsn(), "sslmode": "disable"})
    found = doctor(f"zodbsql+postgresql://postgres@127.0.0.1:{replicated.primary.port}/test"
                   f"?{query}")
    assert found["standby standby1"]["level"] == "ok"
    assert found["standby standby1"]["found"].startswith("streaming, async replication")
    replica = found[f"replica {standby.dsn()}"]
    assert replica["level"] == "ok" and replica["found"].startswith("replay lag")
    assert found["pooler"]["found"].startswith("none")


def test_doctor_reports_session_pooling(pgbouncer_session: PrivatePgBouncer) -> None:
    found = doctor(f"zodbsql+postgresql://postgres@127.0.0.1:{pgbouncer_session.port}/test"
                   "?sslmode=disable")
    assert "pool_mode = session" in found["pooler"]["found"]
