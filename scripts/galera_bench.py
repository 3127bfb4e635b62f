"""``zodbsql bench`` on a private three-node Galera cluster beside a single MariaDB.

Starts the cluster of the cluster suite (tests/cluster/galera.py: three ``mariadbd``
nodes with the galera-4 provider on loopback ports, 32M buffer pools) and one private
MariaDB without Galera, started with the same InnoDB settings, creates a database
``bench`` on each, writes a ZConfig file with one contender per server (zodbsql,
history-preserving; the Galera contender connects to node 1, so every commit is
certified and applied on all three nodes before it returns) and runs ``zodbsql bench``
with the given arguments on both in one run.  Everything is removed at the end.

    python scripts/galera_bench.py --tests add,update,cold,hotspot -n 300 -c 1,3 -r 3
"""
from __future__ import annotations

import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.cluster.galera import GaleraCluster, GaleraNode, ensure_galera  # noqa: E402
from tests.fault.servers import PrivateMariaDB  # noqa: E402

CONTENDER = """
<zodb {name}>
  <zodbsql>
    keep-history true
    <mysql>
      host 127.0.0.1
      port {port}
      db bench
      user root
    </mysql>
  </zodbsql>
</zodb>
"""


def same_innodb_settings() -> list[str]:
    """The cluster nodes' options that are not about Galera."""
    node = GaleraNode(0)
    try:
        return [option for option in node.wsrep_options()
                if not option.startswith("--wsrep")]
    finally:
        node.cleanup()


def main(argv: list[str]) -> int:
    ensure_galera()
    cluster = GaleraCluster(3)
    single = PrivateMariaDB(same_innodb_settings())
    try:
        cluster.setup()
        single.setup()
        for conn in (cluster.admin(0), single.admin()):
            conn.cursor().execute("CREATE DATABASE bench")
            conn.close()
        with tempfile.TemporaryDirectory(prefix="zodbsql-galera-bench-") as directory:
            config = pathlib.Path(directory) / "bench.conf"
            config.write_text("%import zodbsql\n"
                              + CONTENDER.format(name="mariadb-single", port=single.port)
                              + CONTENDER.format(name="galera-3-nodes",
                                                 port=cluster.nodes[0].port))
            return subprocess.call([sys.executable, "-m", "zodbsql.cli.main", "bench",
                                    "--config", str(config), *argv], cwd=directory)
    finally:
        single.cleanup()
        cluster.cleanup()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
