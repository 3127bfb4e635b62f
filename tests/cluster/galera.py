"""A private three-node MariaDB Galera cluster on loopback ports, for the cluster suite.

Each node is a ``PrivateMariaDB`` (tests/fault/servers.py) started with the galera-4
provider: its own data directory, SQL port, group-communication port (gmcast), IST
port and SST port, all free loopback ports.  The first node bootstraps the cluster
(``--wsrep-new-cluster``); the others join it and receive its data by SST (rsync); a
node restarted after ``kill -9`` first recovers its position from InnoDB
(``--wsrep-recover``), then catches up by IST from a survivor's gcache.  Buffers are small
(32M buffer pool, 64M gcache): three nodes share a 2-core machine with other tests.

Debian's ``galera-4`` package provides the library; ``ensure_galera`` installs it with
apt-get when it is missing (sudo when not root), as scripts/test does for the client
headers.
"""
from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import time
from typing import Any, Sequence

from tests.databases import server_unavailable
from tests.fault.servers import PrivateMariaDB, free_port

PROVIDER = "/usr/lib/galera/libgalera_smm.so"
#: Seconds for a node to reach Synced in a cluster of the wanted size.
SYNC_TIMEOUT = 120.0
CLUSTER_NAME = "zodbsql-test"


def ensure_galera() -> None:
    """Install Debian's galera-4 (and rsync, the SST tool) when missing."""
    if os.path.exists(PROVIDER) and shutil.which("rsync"):
        return
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "galera-4", "rsync"],
                       check=True, capture_output=True, timeout=600, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        server_unavailable(f"the galera-4 provider ({PROVIDER}), not installable", exc)
    if not os.path.exists(PROVIDER):
        server_unavailable("the galera-4 provider",
                           FileNotFoundError(f"{PROVIDER} missing after apt-get install"))


class GaleraNode(PrivateMariaDB):
    """One node; ``peers`` (set by ``GaleraCluster``) is every node's gmcast port."""

    name = "MariaDB Galera node"

    def __init__(self, index: int, options: Sequence[str] = ()) -> None:
        super().__init__(options)
        self.index = index
        self.gmcast_port = free_port()
        self.ist_port = free_port()
        self.sst_port = free_port()
        self.peers: list[int] = []
        if os.geteuid() == 0:
            # The SST script's rsync daemon drops root for nobody, who can't write the
            # data directory; as the mysql OS user (Debian's mariadb-server makes it)
            # the server and its SST helpers run as one unprivileged user.
            self.os_user = "mysql"
            entry = pwd.getpwnam("mysql")
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        #: True until the first start: the first node founds the cluster once; a
        #: restart joins the running cluster like any other node.
        self.bootstrap = False

    def make_empty_datadir(self) -> None:
        self.data.mkdir()
        entry = pwd.getpwnam(self.os_user)
        os.chown(self.data, entry.pw_uid, entry.pw_gid)

    def wsrep_options(self) -> list[str]:
        provider_options = ";".join((
            f"gmcast.listen_addr=tcp://127.0.0.1:{self.gmcast_port}",
            f"ist.recv_addr=127.0.0.1:{self.ist_port}",
            "gcache.size=64M", "gcache.page_size=16M",
            "evs.inactive_timeout=PT6S", "evs.suspect_timeout=PT3S",
            "pc.wait_prim_timeout=PT60S"))
        peers = ",".join(f"127.0.0.1:{port}" for port in self.peers)
        options = [
            "--wsrep-on=ON", f"--wsrep-provider={PROVIDER}",
            f"--wsrep-cluster-address=gcomm://{peers}",
            f"--wsrep-cluster-name={CLUSTER_NAME}", f"--wsrep-node-name=node{self.index}",
            f"--wsrep-node-address=127.0.0.1:{self.gmcast_port}",
            f"--wsrep-provider-options={provider_options}",
            "--wsrep-sst-method=rsync",
            f"--wsrep-sst-receive-address=127.0.0.1:{self.sst_port}",
            "--wsrep-slave-threads=2",
            "--binlog-format=ROW", "--innodb-autoinc-lock-mode=2",
            "--default-storage-engine=InnoDB",
            "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M",
            "--innodb-flush-log-at-trx-commit=2", "--performance-schema=OFF",
            "--max-connections=60",
        ]
        if self.bootstrap:
            options.append("--wsrep-new-cluster")
        return options

    def recovered_position(self) -> str | None:
        """After a crash (grastate.dat says seqno -1): the node's last applied position,
        ``uuid:seqno``, read from InnoDB with ``--wsrep-recover`` (what the server's
        service script does), so that the node asks for IST instead of a full SST."""
        grastate = self.data / "grastate.dat"
        if not grastate.exists() or "seqno:   -1" not in grastate.read_text():
            return None
        output = self.directory / "recover.log"
        output.unlink(missing_ok=True)
        subprocess.run(self.command() + [f"--log-error={output}", "--wsrep-recover"],
                       capture_output=True, timeout=120, cwd=self.directory)
        found = re.findall(r"WSREP: Recovered position: (\S+:\d+)",
                           output.read_text(errors="replace") if output.exists() else "")
        return found[-1] if found else None

    def start(self) -> None:
        saved = self.options
        self.options = saved + self.wsrep_options()
        position = None if self.bootstrap else self.recovered_position()
        if position:
            self.options.append(f"--wsrep-start-position={position}")
        try:
            super().start()
        finally:
            self.options = saved
            self.bootstrap = False

    def status(self, name: str) -> str:
        conn = self.admin()
        try:
            cursor = conn.cursor()
            cursor.execute("SHOW GLOBAL STATUS LIKE %s", (name,))
            row = cursor.fetchone()
            return str(row[1]) if row else ""
        finally:
            conn.close()

    def wait_synced(self, size: int, timeout: float = SYNC_TIMEOUT) -> None:
        """Until this node is Synced in a primary component of ``size`` nodes."""
        deadline = time.monotonic() + timeout
        seen = ""
        while time.monotonic() < deadline:
            try:
                state = self.status("wsrep_local_state_comment")
                members = self.status("wsrep_cluster_size")
                seen = f"{state}, cluster size {members}"
                if state == "Synced" and members == str(size):
                    return
            except Exception as exc:  # still starting or receiving its SST
                seen = repr(exc)
            if not self.is_running():
                break
            time.sleep(0.25)
        raise RuntimeError(f"galera node{self.index} (port {self.port}) not synced in a"
                           f" cluster of {size} within {timeout:g}s ({seen}):\n"
                           + "\n".join(self.log.read_text(errors="replace")
                                       .splitlines()[-40:]))

    def setup(self) -> None:
        raise NotImplementedError("GaleraCluster.setup starts the nodes")


class GaleraCluster:
    """``size`` Galera nodes: ``setup`` starts and syncs them, ``cleanup`` removes them."""

    def __init__(self, size: int = 3) -> None:
        self.nodes = [GaleraNode(index + 1) for index in range(size)]
        peers = [node.gmcast_port for node in self.nodes]
        for node in self.nodes:
            node.peers = peers

    def setup(self) -> None:
        first = self.nodes[0]
        first.bootstrap = True
        first.install_datadir()
        for node in self.nodes[1:]:
            node.make_empty_datadir()  # a joiner's data arrives by SST
        first.start()
        first.wait_synced(1)
        conn = first.admin()
        try:
            conn.cursor().execute("CREATE DATABASE IF NOT EXISTS test")
        finally:
            conn.close()
        for count, node in enumerate(self.nodes[1:], start=2):
            node.start()
            node.wait_synced(count)
        for node in self.nodes:
            node.wait_synced(len(self.nodes))

    def cleanup(self) -> None:
        for node in reversed(self.nodes):
            node.cleanup()

    def admin(self, index: int) -> Any:
        return self.nodes[index].admin()
