"""Storages on the replicated cluster: schemas in database ``test`` of the primary,
read through the standby (``replica-dsns``), or through pgbouncer."""
from __future__ import annotations

import pathlib
from typing import Any

import transaction
import ZODB

from tests.databases import Param, PostgreSQLFactory
from tests.replica.cluster import ReplicatedPostgreSQL


class ReplicaFactory(PostgreSQLFactory):
    """PostgreSQLFactory on the cluster's primary, its storages reading from the standby."""

    def __init__(self, param: Param, cluster: ReplicatedPostgreSQL,
                 tmp_path: pathlib.Path | None = None, **replica: Any) -> None:
        assert cluster.standby is not None
        self.cluster = cluster
        self.replica = {"replica_dsns": cluster.standby.dsn(), **replica}
        super().__init__(param, tmp_path, cluster.primary.dsn())

    def new_path(self) -> str:
        schema = super().new_path()
        assert self.cluster.standby is not None
        self.cluster.standby.wait_replayed()  # the standby has the schema too
        return schema

    def backend_options(self, path: str | None = None) -> Any:
        from zodbsql.backends.postgresql.options import PostgreSQLOptions
        return PostgreSQLOptions(dsn=self.dsn, schema=path or self.path, **self.replica)


def write(storage: Any, value: int) -> None:
    """Commit ``value`` as the root's "value" through ``storage`` (then closed)."""
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        conn.root()["value"] = value
    db.close()


def read(db: Any) -> Any:
    """The root's "value" as a new transaction of ``db`` sees it."""
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    try:
        with tm:
            return conn.root().get("value")
    finally:
        conn.close()
