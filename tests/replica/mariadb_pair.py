"""A private MariaDB primary with one binlog replica, on loopback ports.

The primary writes a row-based binary log with GTIDs; the replica (its own data
directory, ``read_only``) follows it from the first event, as a user with only the
REPLICATION SLAVE privilege.  ``hold`` takes the replica's global read lock, so its
applier waits while its replication threads keep running: the replica falls behind on
purpose, as it does under load.
"""
from __future__ import annotations

import time
from typing import Any

from tests.fault.servers import PrivateMariaDB

REPLICATION_USER = "zodbsql_repl"
REPLICATION_SECRET = "repl-secret"  # a private, throwaway server's login


class ReplicatedMariaDB:
    """``setup`` starts both servers and replication; ``cleanup`` removes them."""

    def __init__(self) -> None:
        self.primary = PrivateMariaDB(["--log-bin=binlog", "--server-id=1",
                                       "--binlog-format=ROW"])
        self.replica = PrivateMariaDB(["--server-id=2", "--read-only=ON",
                                       "--relay-log=relay"])
        self._held: Any = None
        self._stopped = False

    def setup(self) -> None:
        self.primary.setup()
        self.execute(self.primary, f"CREATE USER {REPLICATION_USER}@'%'"
                                   f" IDENTIFIED BY '{REPLICATION_SECRET}'",
                     f"GRANT REPLICATION SLAVE ON *.* TO {REPLICATION_USER}@'%'")
        self.replica.install_datadir()
        self.replica.start()
        self.execute(self.replica,
                     f"CHANGE MASTER TO MASTER_HOST='127.0.0.1',"
                     f" MASTER_PORT={self.primary.port}, MASTER_USER='{REPLICATION_USER}',"
                     f" MASTER_PASSWORD='{REPLICATION_SECRET}', MASTER_USE_GTID=slave_pos",
                     "START SLAVE")
        self.wait_caught_up()

    def cleanup(self) -> None:
        self.hold(False)
        self.replica.cleanup()
        self.primary.cleanup()

    @staticmethod
    def execute(server: PrivateMariaDB, *statements: str) -> list[Any]:
        conn = server.admin()
        try:
            cursor = conn.cursor()
            rows: list[Any] = []
            for statement in statements:
                cursor.execute(statement)
                rows = list(cursor.fetchall()) if cursor.description else []
            return rows
        finally:
            conn.close()

    def url(self, db: str, keep_history: bool = True, **query: Any) -> str:
        """The storage URL of database ``db`` on the primary, reading from the replica."""
        params = {"replica_dsns": f"127.0.0.1:{self.replica.port}", **query}
        if not keep_history:
            params["keep_history"] = "false"
        text = "&".join(f"{name}={value}" for name, value in params.items())
        return f"mysql://root@127.0.0.1:{self.primary.port}/{db}?{text}"

    def wait_caught_up(self, timeout: float = 60.0) -> None:
        """Until the replica has applied everything the primary wrote so far."""
        target = self.execute(self.primary, "SELECT @@gtid_binlog_pos")[0][0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not target:
                return
            rows = self.execute(self.replica,
                                f"SELECT MASTER_GTID_WAIT('{target}', 1)")
            if rows and rows[0][0] == 0:
                return
        status = self.execute(self.replica, "SHOW SLAVE STATUS")
        raise RuntimeError(f"the replica did not reach {target} in {timeout:g}s: {status}")

    def hold(self, on: bool = True) -> None:
        """Take (or release) the replica's global read lock: its applier waits."""
        if on and self._held is None:
            self._held = self.replica.admin()
            self._held.cursor().execute("FLUSH TABLES WITH READ LOCK")
        elif not on and self._held is not None:
            self._held.close()
            self._held = None

    def stop_replication(self, stop: bool = True) -> None:
        self.execute(self.replica, "STOP SLAVE" if stop else "START SLAVE")
        self._stopped = stop

    @property
    def applying(self) -> bool:
        """Is the replica applying what the primary writes (neither held nor stopped)?"""
        return self._held is None and not self._stopped
