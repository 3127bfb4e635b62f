"""zodbsql rekey: every record and blob chunk ends under the current key id, a run killed
in the middle is finished by running it again; zodbsql train-dict."""
from __future__ import annotations

import base64
import os
import pathlib
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.blob import Blob

from zodbsql import open_storage
from zodbsql.atrest.codec import MAGIC, RecordCodec
from zodbsql.atrest.keys import load_keys
from zodbsql.cli.main import main
from zodbsql.errors import ConfigurationError, RecordKeyError

OLD, NEW = (base64.b64encode(os.urandom(32)).decode() for _ in range(2))


def keys(tmp_path: pathlib.Path, *lines: str, name: str) -> str:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def build(tmp_path: pathlib.Path, objects: int, blob: bool = False) -> str:
    """A database whose records are all under key id k1; its path."""
    path = str(tmp_path / "Data.sqlite")
    old = keys(tmp_path, f"k1:{OLD}", name="old")
    url = f"sqlite://{path}?key_file={old}"
    if blob:
        url += f"&blob_dir={tmp_path}/blobs&blob_chunk_size=1024"
    db = ZODB.DB(open_storage(url))
    with db.transaction() as conn:
        for i in range(objects):
            conn.root()[i] = PersistentMapping(text=f"record {i} " * 10)
        if blob:
            conn.root()["blob"] = Blob(b"blob data " * 1000)
    db.close()
    return path


def key_ids(path: str) -> dict[str | None, int]:
    codec = RecordCodec()
    found: dict[str | None, int] = {}
    with sqlite3.connect(path) as raw:
        for (state,) in raw.execute("SELECT state FROM object_state"):
            key_id = codec.key_id_of(bytes(state))
            found[key_id] = found.get(key_id, 0) + 1
    return found


def test_rekey_moves_every_record_and_blob_chunk_to_the_current_key(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = build(tmp_path, 50, blob=True)
    total = key_ids(path)["k1"]   # with the root's and the blob's revisions
    both = keys(tmp_path, f"k1:{OLD}", f"k2:{NEW}", name="both")
    only_new = keys(tmp_path, f"k2:{NEW}", name="new")
    # A new key alone is refused until it has been configured beside the old one.
    with pytest.raises(RecordKeyError, match="'k1'"):
        open_storage(f"sqlite://{path}?key_file={only_new}")
    url = f"sqlite://{path}?key_file={both}&key_id=k2&blob_dir={tmp_path}/blobs"
    assert main(["rekey", url, "--quiet", "--batch", "7"]) == 0
    out = capsys.readouterr().out
    assert f"{total} of {total} records" in out and "under key id 'k2'" in out
    assert key_ids(path) == {"k2": total}
    # Everything reads with the new key alone, the blob from a fresh cache too.
    db = ZODB.DB(open_storage(
        f"sqlite://{path}?key_file={only_new}&blob_dir={tmp_path}/fresh"))
    with db.transaction() as conn:
        assert conn.root()[49]["text"] == "record 49 " * 10
        with conn.root()["blob"].open() as stream:
            assert stream.read() == b"blob data " * 1000
    db.close()
    # A second run finds nothing left to do.
    assert main(["rekey", url, "--quiet"]) == 0
    assert f"0 of {total} records and 0 of" in capsys.readouterr().out
    assert main(["verify", f"sqlite://{path}?key_file={only_new}&blob_dir={tmp_path}/b2",
                 "--quiet"]) == 0


def test_rekey_needs_a_key(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = build(tmp_path, 1)
    assert main(["rekey", f"sqlite://{path}", "--quiet"]) == 2
    assert "encrypted with key id 'k1'" in capsys.readouterr().err
    plain = str(tmp_path / "Plain.sqlite")
    ZODB.DB(open_storage(f"sqlite://{plain}")).close()
    assert main(["rekey", f"sqlite://{plain}", "--quiet"]) == 2
    assert "rekey needs key-file or key-env" in capsys.readouterr().err


def test_a_killed_rekey_is_finished_by_running_it_again(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = build(tmp_path, 3000)
    total = key_ids(path)["k1"]
    both = keys(tmp_path, f"k1:{OLD}", f"k2:{NEW}", name="both")
    url = f"sqlite://{path}?key_file={both}&key_id=k2"
    child = subprocess.Popen([sys.executable, "-m", "zodbsql.cli.main", "rekey", url,
                              "--quiet", "--batch", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while key_ids(path).get("k2", 0) < 100:
            assert child.poll() is None, "rekey ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    partly = key_ids(path)
    assert partly.get("k1", 0) > 0 and partly.get("k2", 0) >= 100
    assert main(["rekey", url, "--quiet", "--batch", "500"]) == 0
    out = capsys.readouterr().out
    assert f"{partly['k1']} of {total} records" in out
    assert key_ids(path) == {"k2": total}


def test_train_dict_and_compress_with_it(tmp_path: pathlib.Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "Plain.sqlite")
    db = ZODB.DB(open_storage(f"sqlite://{path}"))
    with db.transaction() as conn:
        for i in range(500):
            conn.root()[i] = PersistentMapping(title=f"Document {i}", state="published",
                                               owner="admin", tags=["news", "plone"])
    db.close()
    output = tmp_path / "zodb.dict"
    assert main(["train-dict", f"sqlite://{path}", "--output", str(output),
                 "--samples", "400", "--size", "4096"]) == 0
    assert "records written to" in capsys.readouterr().out
    assert 0 < output.stat().st_size <= 4096
    url = f"sqlite://{path}?compress=zstd&compress_threshold=0&compress_dict={output}"
    db = ZODB.DB(open_storage(url))
    with db.transaction() as conn:
        for i in range(500, 600):
            conn.root()[i] = PersistentMapping(title=f"Document {i}", state="published",
                                               owner="admin", tags=["news", "plone"])
    with db.transaction() as conn:
        assert conn.root()[599]["title"] == "Document 599"
    db.close()
    with sqlite3.connect(path) as raw:
        sealed = [bytes(s) for (s,) in raw.execute("SELECT state FROM object_state")
                  if bytes(s).startswith(MAGIC)]
    assert len(sealed) >= 90 and all(s[2] & 0x04 for s in sealed)
    # Without the dictionary, its records are an error that says so.
    storage = open_storage(f"sqlite://{path}")
    with pytest.raises(ConfigurationError, match="compress-dict is not set"):
        storage.load(b"\0" * 8)   # the root, written again with the dictionary
    storage.close()


def test_load_keys_is_not_given_the_key_in_the_configuration() -> None:
    assert load_keys(None, None, None) is None
