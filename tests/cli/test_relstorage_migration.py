"""RelStorage side by side: ``zodbsql convert`` copies a history-preserving RelStorage
database on PostgreSQL (which holds an empty placeholder transaction at tid 0) with
identical transactions, records and blobs, and RelStorage's own ``zodbconvert`` reads
configurations that name zodbsql beside RelStorage (``%import zodbsql.prefixed``)."""
from __future__ import annotations

import pathlib
import secrets
import subprocess
import sys
from typing import Any, Iterator

import pytest
import transaction
import ZODB
import ZODB.blob
import ZODB.config
import ZODB.FileStorage
from persistent.mapping import PersistentMapping

import zodbsql
from tests.databases import POSTGRESQL_DSN, server_unavailable
from zodbsql.cli.main import main

RELSTORAGE_CONFIG = """\
%import relstorage
<zodb main>
  <relstorage>
    keep-history true
    blob-dir {blobs}
    shared-blob-dir true
    <postgresql>
      dsn {dsn}
    </postgresql>
  </relstorage>
</zodb>
"""


@pytest.fixture
def relstorage_config(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A ZConfig file naming a history-preserving RelStorage in a scratch database."""
    import psycopg
    try:
        server = psycopg.connect(POSTGRESQL_DSN, autocommit=True, connect_timeout=5)
    except Exception as exc:
        server_unavailable(f"PostgreSQL ({POSTGRESQL_DSN})", exc)
    name = f"zodbsql_test_rs_{secrets.token_hex(6)}"
    server.execute(f'CREATE DATABASE "{name}"')
    params = psycopg.conninfo.conninfo_to_dict(POSTGRESQL_DSN)
    params["dbname"] = name
    path = tmp_path / "relstorage.conf"
    (tmp_path / "rs-blobs").mkdir()
    path.write_text(RELSTORAGE_CONFIG.format(
        dsn=psycopg.conninfo.make_conninfo("", **params), blobs=tmp_path / "rs-blobs"))
    try:
        yield path
    finally:
        server.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                       " WHERE datname = %s", (name,))
        server.execute(f'DROP DATABASE IF EXISTS "{name}"')
        server.close()


def history(storage: Any) -> list[tuple[Any, ...]]:
    """Every transaction after tid 0: tid, status, metadata and records."""
    return [(t.tid, t.user, t.description, t.extension,
             [(r.oid, r.tid, r.data, r.data_txn) for r in t])
            for t in storage.iterator() if t.tid != b"\0" * 8]


def test_convert_copies_a_history_preserving_relstorage(
        relstorage_config: pathlib.Path, tmp_path: pathlib.Path) -> None:
    db = ZODB.config.databaseFromFile(relstorage_config.open())
    try:
        for i in range(3):
            with db.transaction(f"step {i}") as conn:
                conn.root()[f"item{i}"] = PersistentMapping(value=i)
        with db.transaction("change") as conn:
            conn.root()["item1"]["value"] = 100
        with db.transaction("a blob") as conn:
            conn.root()["file"] = ZODB.blob.Blob(b"blob contents " * 1000)
        # RelStorage's placeholder: iterated from tid 0, an empty transaction at tid 0.
        first = next(iter(db.storage.iterator(b"\0" * 8)))
        assert first.tid == b"\0" * 8 and list(first) == []
        expected = history(db.storage)
    finally:
        db.close()
    (tmp_path / "blobs").mkdir()
    dest = f"sqlite://{tmp_path / 'Data.sqlite'}?blob_dir={tmp_path / 'blobs'}"
    assert main(["convert", "--quiet", f"{relstorage_config}#main", dest]) == 0

    storage = zodbsql.open_storage(dest)
    try:
        assert history(storage) == expected
        assert len(expected) == 6            # the creation of the root, and five commits
    finally:
        storage.close()
    # Run again: nothing after the destination's last transaction, nothing copied.
    assert main(["convert", "--quiet", f"{relstorage_config}#main", dest]) == 0
    db = ZODB.DB(zodbsql.open_storage(dest))
    try:
        conn = db.open()
        assert [conn.root()[f"item{i}"]["value"] for i in range(3)] == [0, 100, 2]
        with conn.root()["file"].open() as f:
            assert f.read() == b"blob contents " * 1000
        conn.close()
    finally:
        transaction.abort()
        db.close()


def zodbconvert(config: pathlib.Path, *args: str) -> None:
    """RelStorage's own zodbconvert, as a user runs it."""
    script = pathlib.Path(sys.executable).with_name("zodbconvert")
    done = subprocess.run([str(script), *args, str(config)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_relstorage_zodbconvert_copies_through_zodbsql_and_back(tmp_path: pathlib.Path) -> None:
    """FileStorage -> zodbsql -> RelStorage -> zodbsql, each a zodbconvert config that
    imports RelStorage's component (zodbconvert does) and zodbsql's beside it."""
    source = tmp_path / "Data.fs"
    db = ZODB.DB(ZODB.FileStorage.FileStorage(str(source)))
    for i in range(4):
        with db.transaction(f"step {i}") as conn:
            conn.root()[f"item{i}"] = PersistentMapping(value=i, data=b"x" * i)
    with db.transaction("change") as conn:
        conn.root()["item2"]["value"] = 200
    db.close()
    filestorage = f"<filestorage {{role}}>\n  path {source}\n</filestorage>\n"
    relstorage = (f"<relstorage {{role}}>\n  <sqlite3>\n    data-dir {tmp_path / 'rs'}\n"
                  "  </sqlite3>\n</relstorage>\n")

    def zodbsql_section(name: str) -> str:
        return (f"<zodbsql {{role}}>\n  <zodbsql-sqlite3>\n    path {tmp_path / name}\n"
                "  </zodbsql-sqlite3>\n</zodbsql>\n")
    steps = [(filestorage, zodbsql_section("one.sqlite")),
             (zodbsql_section("one.sqlite"), relstorage),
             (relstorage, zodbsql_section("two.sqlite"))]
    for number, (src, dest) in enumerate(steps):
        config = tmp_path / f"step{number}.conf"
        config.write_text("%import zodbsql.prefixed\n" + src.format(role="source")
                          + dest.format(role="destination"))
        zodbconvert(config)

    original = ZODB.FileStorage.FileStorage(str(source), read_only=True)
    try:
        expected = history(original)
    finally:
        original.close()
    assert len(expected) == 6
    for name in ("one.sqlite", "two.sqlite"):
        storage = zodbsql.open_storage(f"sqlite://{tmp_path / name}")
        try:
            assert history(storage) == expected, name
        finally:
            storage.close()
