"""convert, pack and verify from the command line, on SQLite files."""
from __future__ import annotations

import pathlib
import re

import pytest
import ZODB
import ZODB.FileStorage
from persistent.mapping import PersistentMapping

from tests.storage.packing import assert_gone
from zodbsql.api import open_storage
from zodbsql.backends.sqlite.options import SQLiteOptions
from zodbsql.cli.main import TOOLS, main


@pytest.fixture
def filestorage(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "Data.fs"
    db = ZODB.DB(ZODB.FileStorage.FileStorage(str(path)))
    with db.transaction() as conn:
        for i in range(30):
            conn.root()[i] = PersistentMapping(v=i)
    for i in range(5):
        with db.transaction() as conn:
            del conn.root()[i]
    db.close()
    return path


def test_convert_verify_pack(filestorage: pathlib.Path, tmp_path: pathlib.Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    dest = f"sqlite://{tmp_path}/Data.sqlite"
    assert main(["convert", f"file://{filestorage}", dest, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "copied 7 transactions, 37 records" in out and "they match" in out
    assert main(["convert", f"file://{filestorage}", dest, "--quiet"]) == 0
    assert "up to date" in capsys.readouterr().out
    assert main(["verify", dest, "--quiet"]) == 0
    assert ": clean" in capsys.readouterr().out
    assert main(["pack", dest, "--dry-run", "--quiet"]) == 0
    assert "would remove 5 unreachable objects and 6 old revisions" in capsys.readouterr().out
    garbage, live = _garbage_and_live(f"{tmp_path}/Data.sqlite")
    assert len(garbage) == 5 and len(live) == 26
    assert main(["pack", dest, "--quiet", "--duty-cycle", "0.5", "--batch-size", "2"]) == 0
    assert "removed 5 unreachable objects and 6 old revisions" in capsys.readouterr().out
    assert main(["pack", dest, "--dry-run", "--quiet"]) == 0
    assert "would remove 0 unreachable objects" in capsys.readouterr().out
    # What the counts say happened did: every garbage object is gone, nothing else.
    storage = open_storage(SQLiteOptions(path=f"{tmp_path}/Data.sqlite"))
    try:
        assert_gone(storage, garbage)
        assert {oid: storage.load(oid) for oid in live} == live
    finally:
        storage.close()


def _garbage_and_live(path: str) -> tuple[list[bytes], dict[bytes, tuple[bytes, bytes]]]:
    """The oids of objects no longer reachable, and the current records of the others."""
    db = ZODB.DB(open_storage(SQLiteOptions(path=path)))
    try:
        with db.transaction() as conn:
            live = {conn.root()._p_oid} | {child._p_oid for child in conn.root().values()}
            stored = {record.oid for txn in db.storage.iterator() for record in txn}
            return sorted(stored - live), {oid: db.storage.load(oid) for oid in live}
    finally:
        db.close()


def test_convert_clear_and_zconfig(filestorage: pathlib.Path, tmp_path: pathlib.Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "zodb.conf"
    conf.write_text(f"""
%import zodbsql
<zodb old>
  <filestorage>
    path {filestorage}
  </filestorage>
</zodb>
<zodb new>
  <zodbsql>
    keep-history false
    <sqlite3>
      path {tmp_path}/new.sqlite
    </sqlite3>
  </zodbsql>
</zodb>
""")
    assert main(["convert", f"{conf}#old", f"{conf}#new", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["convert", f"{conf}#old", f"{conf}#new", "--quiet", "--clear"]) == 0
    out = capsys.readouterr().out  # cleared, so everything was copied again
    assert "copied 7 transactions" in out and "current states only: 31 objects" in out
    assert main(["convert", f"{conf}", f"{conf}#new"]) == 2
    assert "pick one with FILE#NAME" in capsys.readouterr().err


def test_verify_reports_problems_with_exit_status(tmp_path: pathlib.Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import sqlite3
    dest = tmp_path / "Data.sqlite"
    main(["demo", "--objects", "20", "--path", str(dest)])
    raw = sqlite3.connect(dest)
    raw.execute("UPDATE object_state SET state = x'00' WHERE zoid = 1")
    raw.commit()
    raw.close()
    capsys.readouterr()
    assert main(["verify", f"sqlite://{dest}", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "checksum: oid 0x0000000000000001" in out and "problem(s)" in out


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_help_shows_an_example(tool: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every tool the command knows (not a list kept by hand) shows how to call it."""
    with pytest.raises(SystemExit):
        main([tool, "--help"])
    paragraphs = capsys.readouterr().out.split("\n\n")
    assert any(p.startswith("example") and f"\n  zodbsql {tool} " in p for p in paragraphs)


@pytest.mark.parametrize("shared", [False, True], ids=["database", "shared-dir"])
def test_blobspeed_prints_write_and_read_rates(tmp_path: pathlib.Path, shared: bool,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    url = (f"sqlite://{tmp_path}/Data.sqlite?blob_dir={tmp_path}/blobs"
           f"&shared_blob_dir={'true' if shared else 'false'}")
    assert main(["blobspeed", url, "--size-mb", "3"]) == 0
    out = capsys.readouterr().out
    assert "blob of 3 MiB" in out
    assert re.search(r"write: [0-9.]+ MB/s", out) and re.search(r"read: +[0-9.]+ MB/s", out)
    assert main(["verify", url, "--quiet"]) == 0
    assert main(["blobspeed", f"sqlite://{tmp_path}/Plain.sqlite", "--size-mb", "1"]) == 2
    assert "no blob support" in capsys.readouterr().err
