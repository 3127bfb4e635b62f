"""Records compressed and encrypted at rest: round trips on every backend and history
mode, old plain records, wrong and missing keys, key rotation, and no plaintext in
what the database stores."""
from __future__ import annotations

import base64
import os
import pathlib
import sqlite3
from typing import Any

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.utils import u64

from zodbsql.atrest.codec import MAGIC, PLAIN, RecordCodec
from zodbsql.atrest.keys import KeyRing
from zodbsql.backends.base.mover import state_row
from zodbsql.errors import ConfigurationError, CorruptRecordError, RecordKeyError
from zodbsql.storage.verify import verify

#: What the tests store; it must never appear in the stored bytes when encrypted.
MARKER = "PLAINTEXT-MARKER-7f3a"


def key_file(tmp_path: pathlib.Path, *lines: str, name: str = "keys") -> str:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def fill(db: Any, count: int = 20, text: str = MARKER) -> None:
    with db.transaction() as conn:
        root = conn.root()
        for i in range(count):
            root[f"item{i}"] = PersistentMapping(text=f"{text} {i} " * 20, small=i)


def check(db: Any, count: int = 20, text: str = MARKER) -> None:
    with db.transaction() as conn:
        root = conn.root()
        for i in range(count):
            assert root[f"item{i}"]["text"] == f"{text} {i} " * 20


def stored_states(storage: Any) -> list[bytes]:
    """Every state column as the database holds it."""
    conn = storage.backend.connect()
    try:
        return [bytes(state) for (state,) in
                conn.fetchall("SELECT state FROM object_state WHERE state IS NOT NULL")]
    finally:
        conn.close()


# -- the codec alone -----------------------------------------------------------------------
def ring(**keys: bytes) -> KeyRing:
    return KeyRing(keys, next(iter(keys)))


def test_codec_round_trips_and_leaves_plain_states_alone() -> None:
    state = b"\x80\x03" + b"abc" * 400
    for codec in (PLAIN, RecordCodec(compress=True), RecordCodec(keys=ring(k=b"k" * 32)),
                  RecordCodec(compress=True, keys=ring(k=b"k" * 32))):
        stored = codec.encode(7, state)
        assert codec.decode(7, 1, stored) == state
        # A plain record (written before, or by PLAIN) reads as it is.
        assert codec.decode(7, 1, state) == state
    assert RecordCodec(compress=True).encode(7, state).startswith(MAGIC)
    assert len(RecordCodec(compress=True).encode(7, state)) < len(state) // 10


def test_a_loaded_row_is_opened_only_where_it_must_be() -> None:
    """``state_row``: a row as it is stored (an int tid, plain bytes) is taken as it
    is; a sealed state is opened, a driver's other buffer made bytes, and both keep
    their tid and checksum; a deletion stays None."""
    state = b"\x80\x03" + b"abc" * 400
    codec = RecordCodec(compress=True)
    sealed = codec.encode(7, state)
    plain = state_row((5, 99, state), 7, codec)
    assert plain is not None and plain.state is state     # not copied
    assert plain == (5, 99, state)
    assert state_row((5, 99, sealed), 7, codec) == (5, 99, state)
    assert state_row((5, 99, memoryview(state)), 7, codec) == (5, 99, state)
    assert state_row((5, 99, None), 7, codec) == (5, 99, None)
    assert state_row(None, 7, codec) is None


def test_small_or_incompressible_states_are_stored_as_they_are() -> None:
    codec = RecordCodec(compress=True, threshold=256)
    small = b"\x80\x03" + b"a" * 100
    assert codec.encode(1, small) == small
    noise = b"\x80\x03" + os.urandom(4000)
    assert codec.encode(1, noise) == noise


def test_a_sealed_record_can_not_move_to_another_oid_or_be_altered() -> None:
    codec = RecordCodec(keys=ring(k=b"k" * 32))
    stored = codec.encode(1, b"\x80\x03state")
    with pytest.raises(CorruptRecordError, match="key id 'k'"):
        codec.decode(2, 1, stored)
    damaged = stored[:-1] + bytes([stored[-1] ^ 1])
    with pytest.raises(CorruptRecordError):
        codec.decode(1, 1, damaged)


def test_key_material_is_in_no_repr() -> None:
    key = b"S" * 32
    codec = RecordCodec(keys=ring(secret=key))
    assert base64.b64encode(key).decode() not in repr(codec)
    assert "SSSS" not in repr(codec) and "secret" in repr(codec)


def test_a_missing_key_names_its_id() -> None:
    stored = RecordCodec(keys=ring(old=b"o" * 32)).encode(1, b"\x80\x03state")
    with pytest.raises(RecordKeyError, match="key id 'old'"):
        RecordCodec(keys=ring(new=b"n" * 32)).decode(1, 1, stored)
    with pytest.raises(RecordKeyError, match="key id 'old'"):
        PLAIN.decode(1, 1, stored)


def test_bad_key_sources_are_configuration_errors(tmp_path: pathlib.Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from zodbsql.atrest.keys import load_keys
    with pytest.raises(ConfigurationError, match="not valid base64"):
        load_keys(key_file(tmp_path, "k1:not base64!"), None, None)
    with pytest.raises(ConfigurationError, match="12 bytes"):
        load_keys(key_file(tmp_path, base64.b64encode(b"x" * 12).decode()), None, None)
    with pytest.raises(ConfigurationError, match="key-id must say"):
        load_keys(key_file(tmp_path, f"a:{new_key()}", f"b:{new_key()}"), None, None)
    with pytest.raises(ConfigurationError, match="ZODBSQL_NO_SUCH_KEY"):
        load_keys(None, "ZODBSQL_NO_SUCH_KEY", None)
    secret = new_key()
    monkeypatch.setenv("ZODBSQL_TEST_KEY", f"env1:{secret}")
    keys = load_keys(None, "ZODBSQL_TEST_KEY", None)
    assert keys is not None and keys.current == "env1"
    with pytest.raises(ConfigurationError) as info:
        load_keys(key_file(tmp_path, f"env1:{new_key()}"), "ZODBSQL_TEST_KEY", "env1")
    assert secret not in str(info.value)


def test_encryption_refuses_caches_that_keep_states_in_clear(tmp_path: pathlib.Path) -> None:
    from zodbsql.options import Options
    with pytest.raises(ConfigurationError, match="cache-redis-url"):
        Options(key_env="X", cache_redis_url="redis://localhost/0")
    with pytest.raises(ConfigurationError, match="cache-persistent-dir"):
        Options(key_file="k", cache_persistent_dir=str(tmp_path))


# -- through the storage, on every backend and history mode -------------------------------
VARIANTS = {
    "zstd": {"compress": "zstd"},
    "aes": {},
    "zstd+aes": {"compress": "zstd"},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_round_trip(storage_factory: Any, tmp_path: pathlib.Path, variant: str) -> None:
    options: dict[str, Any] = dict(VARIANTS[variant])
    if "aes" in variant:
        options["key_file"] = key_file(tmp_path, new_key())
    storage = storage_factory.open(**options)
    db = ZODB.DB(storage)
    fill(db)
    check(db)
    db.close()
    storage = storage_factory.open(**options)
    db = ZODB.DB(storage)
    check(db)
    states = stored_states(storage)
    assert sum(state.startswith(MAGIC) for state in states) >= 20
    if "aes" in variant:
        assert not any(MARKER.encode() in state for state in states)
    assert verify(storage).clean
    # The iterator (convert, copyTransactionsFrom) gives the states themselves.
    found = [record.data for txn in storage.iterator() for record in txn if record.data]
    assert any(MARKER.encode() in data for data in found)
    db.close()


def test_old_plain_records_read_with_new_sealed_ones(storage_factory: Any,
                                                     tmp_path: pathlib.Path) -> None:
    db = ZODB.DB(storage_factory.open())
    fill(db, text="old")
    db.close()
    keys = key_file(tmp_path, new_key())
    db = ZODB.DB(storage_factory.open(compress="zstd", key_file=keys))
    check(db, text="old")
    with db.transaction() as conn:
        conn.root()["new"] = PersistentMapping(text=MARKER * 50)
    with db.transaction() as conn:
        assert conn.root()["new"]["text"] == MARKER * 50
        assert conn.root()["item3"]["text"] == "old 3 " * 20
    db.close()


def test_a_missing_key_is_an_error_naming_its_id(storage_factory: Any,
                                                  tmp_path: pathlib.Path) -> None:
    first_key = f"k1:{new_key()}"
    db = ZODB.DB(storage_factory.open(key_file=key_file(tmp_path, first_key)))
    fill(db)
    db.close()
    before = storage_factory.open(read_only=True)
    last = before.lastTransaction()
    # Read-only it opens, and the record names the key id it needs.
    with pytest.raises(RecordKeyError, match="key id 'k1'") as info:
        before.load(b"\0" * 8)
    assert info.value.key_id == "k1"
    before.close()
    # Read-write it would write records in clear among encrypted ones: refused.
    with pytest.raises(RecordKeyError, match="key id 'k1'.*nothing was written"):
        storage_factory.open()
    # A new key alone can't open the database's checksum key: refused, naming k1.
    k9 = f"k9:{new_key()}"
    with pytest.raises(RecordKeyError, match="first was 'k1'.*nothing was written"):
        storage_factory.open(key_file=key_file(tmp_path, k9, name="k9"))
    # Beside a key the database knows, it opens (rotation); then it opens alone, and
    # a record under k1 still names its id.
    storage_factory.open(key_file=key_file(tmp_path, first_key, k9, name="both"),
                         key_id="k9").close()
    storage = storage_factory.open(key_file=key_file(tmp_path, k9, name="k9"))
    with pytest.raises(RecordKeyError, match="key id 'k1'"):
        storage.load(b"\0" * 8)
    assert storage.lastTransaction() == last


def test_a_wrong_key_is_refused_at_open_and_nothing_is_written(
        storage_factory: Any, tmp_path: pathlib.Path) -> None:
    db = ZODB.DB(storage_factory.open(key_file=key_file(tmp_path, f"k1:{new_key()}")))
    fill(db)
    db.close()
    before = storage_factory.open(read_only=True)
    last = before.lastTransaction()
    before.close()
    wrong = key_file(tmp_path, f"k1:{new_key()}", name="wrong")
    with pytest.raises(RecordKeyError, match="key id 'k1'") as info:
        storage_factory.open(key_file=wrong)
    assert "nothing was written" in str(info.value)
    after = storage_factory.open(read_only=True)
    assert after.lastTransaction() == last


def test_a_rotated_key_still_reads_old_records(storage_factory: Any,
                                               tmp_path: pathlib.Path) -> None:
    old, new = new_key(), new_key()
    db = ZODB.DB(storage_factory.open(key_file=key_file(tmp_path, f"k1:{old}")))
    fill(db)
    db.close()
    both = key_file(tmp_path, f"k1:{old}", f"k2:{new}", name="both")
    storage = storage_factory.open(key_file=both, key_id="k2")
    db = ZODB.DB(storage)
    check(db)
    with db.transaction() as conn:
        conn.root()["item0"]["small"] = -1
    check(db)
    codec = storage.shared.codec
    ids = {codec.key_id_of(state) for state in stored_states(storage)}
    assert {"k1", "k2"} <= ids
    db.close()


def test_undo_and_pack_with_encryption(storage_factory: Any, tmp_path: pathlib.Path) -> None:
    storage = storage_factory.open(compress="zstd", key_file=key_file(tmp_path, new_key()))
    db = ZODB.DB(storage)
    fill(db)
    with db.transaction() as conn:
        conn.root()["item1"]["text"] = "changed"
    if storage_factory.param.keep_history:
        undo_id = db.undoLog(0, 1)[0]["id"]
        db.undo(undo_id)
        transaction.commit()
    with db.transaction() as conn:
        del conn.root()["item2"]
    db.pack()
    with db.transaction() as conn:
        expected = (f"{MARKER} 1 " * 20 if storage_factory.param.keep_history
                    else "changed")
        assert conn.root()["item1"]["text"] == expected
        assert "item2" not in conn.root()
    assert verify(storage).clean
    db.close()


def test_convert_into_an_encrypted_storage(storage_factory: Any,
                                           tmp_path: pathlib.Path) -> None:
    source = storage_factory.open()
    db = ZODB.DB(source)
    fill(db)
    target = storage_factory.open_other(compress="zstd",
                                        key_file=key_file(tmp_path, new_key()))
    target.copyTransactionsFrom(source)
    assert not any(MARKER.encode() in state for state in stored_states(target))
    check(ZODB.DB(target))
    db.close()


# -- no plaintext in the database's own files ------------------------------------------------
def test_no_plaintext_in_the_sqlite_file(storage_factory: Any, tmp_path: pathlib.Path) -> None:
    if storage_factory.param.backend != "sqlite":
        pytest.skip("the file of SQLite; the servers' bytes are scanned below")
    storage = storage_factory.open(key_file=key_file(tmp_path, new_key()))
    db = ZODB.DB(storage)
    fill(db, count=200)
    db.close()
    path = storage_factory.path
    with sqlite3.connect(path) as conn:  # fold the WAL into the file
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = pathlib.Path(path).read_bytes()
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix):
            raw += pathlib.Path(path + suffix).read_bytes()
    assert MARKER.encode() not in raw
    db = ZODB.DB(storage_factory.open(key_file=str(tmp_path / "keys")))
    check(db, count=200)
    db.close()


def test_no_plaintext_in_the_server_tables(storage_factory: Any,
                                           tmp_path: pathlib.Path) -> None:
    """The bytes of the whole state table, as the server dumps them (PostgreSQL's
    COPY, MariaDB's HEX of every column), hold no plaintext."""
    backend = storage_factory.param.backend
    if backend == "sqlite":
        pytest.skip("SQLite's file is scanned above")
    storage = storage_factory.open(key_file=key_file(tmp_path, new_key()))
    db = ZODB.DB(storage)
    fill(db, count=50)
    conn = storage.backend.connect()
    try:
        if backend == "postgresql":
            dumped = b"".join(bytes(row[0]) for row in conn.fetchall(
                "SELECT convert_to(t::text, 'UTF8') FROM object_state t"))
            dumped += b"".join(bytes(row[0]) for row in conn.fetchall(
                "SELECT decode(encode(state, 'hex'), 'hex') FROM object_state"))
        else:
            dumped = b"".join(bytes.fromhex(row[0]) for row in conn.fetchall(
                "SELECT HEX(state) FROM object_state WHERE state IS NOT NULL"))
    finally:
        conn.close()
    assert MARKER.encode() not in dumped
    assert MARKER.encode().hex().encode() not in dumped
    check(db, count=50)
    db.close()


# -- blobs in the database layout ------------------------------------------------------------
def test_blob_chunks_are_encrypted(storage_factory: Any, tmp_path: pathlib.Path) -> None:
    from ZODB.blob import Blob
    keys = key_file(tmp_path, f"b1:{new_key()}")
    content = (MARKER * 1000).encode()
    storage = storage_factory.open(key_file=keys, blob_dir=str(tmp_path / "cache"),
                                   blob_chunk_size=4096)
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        conn.root()["blob"] = blob = Blob()
        with blob.open("w") as stream:
            stream.write(content)
    conn = storage.backend.connect()
    try:
        chunks = [bytes(data) for (data,) in conn.fetchall("SELECT data FROM blob_chunk")]
    finally:
        conn.close()
    assert len(chunks) > 1 and not any(MARKER.encode() in chunk for chunk in chunks)
    assert verify(storage).clean
    db.close()
    # A fresh cache downloads and decrypts; without the key the error names its id.
    db = ZODB.DB(storage_factory.open(key_file=keys, blob_dir=str(tmp_path / "cache2")))
    with db.transaction() as conn:
        with conn.root()["blob"].open() as stream:
            assert stream.read() == content
    db.close()
    storage = storage_factory.open(blob_dir=str(tmp_path / "cache3"), read_only=True)
    oid, tid = _blob_revision(storage)
    with pytest.raises(RecordKeyError, match="key id 'b1'"):
        storage.loadBlob(oid, tid)


def _blob_revision(storage: Any) -> tuple[bytes, bytes]:
    conn = storage.backend.connect()
    try:
        oid, tid = conn.fetchone("SELECT zoid, tid FROM blob_ref")
    finally:
        conn.close()
    return int(oid).to_bytes(8, "big"), int(tid).to_bytes(8, "big")


def test_no_plaintext_in_the_server_files(storage_factory: Any, tmp_path: pathlib.Path) -> None:
    """The table's files as the server keeps them on disk: PostgreSQL's relation and
    TOAST files (pg_read_binary_file, after a CHECKPOINT), MariaDB's .ibd file (after
    FLUSH TABLES ... FOR EXPORT).  Needs a superuser, or a server on this machine whose
    files can be read; otherwise skipped with the reason."""
    backend = storage_factory.param.backend
    if backend == "sqlite":
        pytest.skip("SQLite's file is scanned above")
    storage = storage_factory.open(key_file=key_file(tmp_path, new_key()))
    db = ZODB.DB(storage)
    fill(db, count=200)
    with db.transaction() as conn:  # a large state, which PostgreSQL moves to TOAST
        conn.root()["big"] = PersistentMapping(text=MARKER * 2000)
    conn = storage.backend.connect()
    try:
        raw = (_postgresql_files(conn) if backend == "postgresql" else _mysql_file(conn))
    finally:
        conn.close()
    assert len(raw) > 100_000
    assert MARKER.encode() not in raw
    check(db, count=200)
    db.close()


def _postgresql_files(conn: Any) -> bytes:
    try:
        conn.execute("CHECKPOINT")
        paths = [row[0] for row in conn.fetchall(
            "SELECT pg_relation_filepath(c.oid) FROM pg_class c"
            " WHERE c.oid = 'object_state'::regclass OR c.oid = (SELECT reltoastrelid"
            " FROM pg_class WHERE oid = 'object_state'::regclass)")]
        return b"".join(bytes(conn.fetchone("SELECT pg_read_binary_file(%s)", (path,))[0])
                        for path in paths)
    except Exception as exc:  # not a superuser
        pytest.skip(f"PostgreSQL's relation files can't be read: {exc}")


def _mysql_file(conn: Any) -> bytes:
    datadir, database = conn.fetchone("SELECT @@datadir, DATABASE()")
    path = pathlib.Path(datadir) / database / "object_state.ibd"
    conn.execute("FLUSH TABLES object_state FOR EXPORT")
    try:
        return path.read_bytes()
    except OSError as exc:
        pytest.skip(f"MariaDB's table file can't be read here: {exc}")
    finally:
        conn.execute("UNLOCK TABLES")


def test_rekey_on_every_backend(storage_factory: Any, tmp_path: pathlib.Path) -> None:
    """Records and blob chunks under the old key id end under the current one; the
    old key is then no longer needed (zodbsql rekey is this, with a progress bar)."""
    from ZODB.blob import Blob
    from zodbsql.atrest.rekey import rekey
    old, new = new_key(), new_key()
    storage = storage_factory.open(key_file=key_file(tmp_path, f"k1:{old}"),
                                   blob_dir=str(tmp_path / "b1"), blob_chunk_size=1024)
    db = ZODB.DB(storage)
    fill(db)
    with db.transaction() as conn:
        conn.root()["blob"] = Blob(b"blob data " * 500)
    db.close()
    both = key_file(tmp_path, f"k1:{old}", f"k2:{new}", name="both")
    storage = storage_factory.open(key_file=both, key_id="k2", blob_dir=str(tmp_path / "b2"))
    done = rekey(storage.backend, storage.shared.codec, batch=7)
    assert done.states_rewritten == done.states_total > 20
    assert done.chunks_rewritten == done.chunks_total >= 5
    assert rekey(storage.backend, storage.shared.codec).states_rewritten == 0
    storage.close()
    only_new = key_file(tmp_path, f"k2:{new}", name="new")
    storage = storage_factory.open(key_file=only_new, blob_dir=str(tmp_path / "b3"))
    db = ZODB.DB(storage)
    check(db)
    with db.transaction() as conn:
        with conn.root()["blob"].open() as stream:
            assert stream.read() == b"blob data " * 500
    assert verify(storage).clean
    db.close()


def test_rekey_while_a_writer_commits(storage_factory: Any, tmp_path: pathlib.Path) -> None:
    """The site keeps running: a writer (already on the new key id) commits while rekey
    walks the records; both finish, nothing is lost, everything is under the new id."""
    import threading
    from zodbsql.atrest.rekey import rekey
    old, new = new_key(), new_key()
    db = ZODB.DB(storage_factory.open(key_file=key_file(tmp_path, f"k1:{old}")))
    fill(db, count=300)
    db.close()
    both = key_file(tmp_path, f"k1:{old}", f"k2:{new}", name="both")
    site = ZODB.DB(storage_factory.open(key_file=both, key_id="k2"))
    stop = threading.Event()
    writing = threading.Event()
    commits = 0

    def write() -> None:
        nonlocal commits
        manager = transaction.TransactionManager()
        conn = site.open(manager)
        while not stop.is_set():
            for attempt in manager.attempts():
                with attempt:
                    conn.root()[f"item{commits % 300}"]["small"] = -commits
            commits += 1
            writing.set()
        conn.close()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        # Rekey starts once the writer commits (on a busy machine a rekey of 300
        # records could otherwise be over before the writer's first commit).
        assert writing.wait(30), "the writer never committed"
        storage = storage_factory.open(key_file=both, key_id="k2")
        done = rekey(storage.backend, storage.shared.codec, batch=10)
    finally:
        stop.set()
        writer.join()
    assert done.states_rewritten > 0 and commits > 0
    assert {storage.shared.codec.key_id_of(s) for s in stored_states(storage)} == {"k2"}
    site.close()
    db = ZODB.DB(storage_factory.open(key_file=key_file(tmp_path, f"k2:{new}", name="new")))
    check(db, count=300)
    db.close()


def test_the_statement_limit_applies_to_the_sealed_size(storage_factory: Any,
                                                        tmp_path: pathlib.Path) -> None:
    """A state under the server's limit whose encrypted form is over it is refused
    before anything is sent, naming the size as stored."""
    from ZODB.utils import z64
    from zodbsql.errors import DatabaseError
    storage = storage_factory.open(key_file=key_file(tmp_path, new_key()))
    backend = storage.shared.backend
    connect = backend.connect_for_commit

    def connect_limited(*args: Any, **kwargs: Any) -> Any:
        conn = connect(*args, **kwargs)
        conn.max_state_size, conn.max_state_size_detail = 200, None
        return conn
    backend.connect_for_commit = connect_limited
    storage.shared.pool.close()
    oid = storage.new_oid()
    state = b"\x80\x03" + b"." * 190
    txn = transaction.Transaction()
    storage.tpc_begin(txn)
    storage.store(oid, z64, state, "", txn)
    with pytest.raises(DatabaseError, match=r"is 2[0-9][0-9] bytes, larger than the 200"):
        storage.tpc_vote(txn)
    storage.tpc_abort(txn)


def test_a_dictionary_trained_on_the_records(storage_factory: Any,
                                             tmp_path: pathlib.Path) -> None:
    """zodbsql train-dict's sample (decrypted) and dictionary, then records compressed
    with it, on every backend."""
    from zodbsql.atrest.dictionary import sample_states, train
    keys = key_file(tmp_path, new_key())
    storage = storage_factory.open(key_file=keys)
    db = ZODB.DB(storage)
    fill(db, count=200)
    samples = sample_states(storage.backend, storage.shared.codec, 100)
    assert len(samples) >= 50 and all(state.startswith(b"\x80") for state in samples)
    db.close()
    path = tmp_path / "zodb.dict"
    path.write_bytes(train(samples, 2048))
    db = ZODB.DB(storage_factory.open(key_file=keys, compress="zstd", compress_threshold=0,
                                      compress_dict=str(path)))
    fill(db, count=20, text="again")
    check(db, count=20, text="again")
    db.close()


def test_a_new_dictionary_keeps_records_of_the_old_one_readable(
        storage_factory: Any, tmp_path: pathlib.Path) -> None:
    """compress-dict "new, old": new records use the first, records compressed with the
    second still read; without it they name its id."""
    from zodbsql.atrest.dictionary import sample_states, train
    from zodbsql.errors import ConfigurationError
    storage = storage_factory.open()
    db = ZODB.DB(storage)
    fill(db, count=200)
    samples = sample_states(storage.backend, storage.shared.codec, 100)
    db.close()
    old, new = tmp_path / "old.dict", tmp_path / "new.dict"
    old.write_bytes(train(samples, 2048))
    new.write_bytes(train(samples[::-1] + [b"\x80\x03other" * 20], 4096))
    settings: dict[str, Any] = dict(compress="zstd", compress_threshold=0)
    db = ZODB.DB(storage_factory.open(compress_dict=str(old), **settings))
    fill(db, count=20, text="old")
    db.close()
    db = ZODB.DB(storage_factory.open(compress_dict=f"{new}, {old}", **settings))
    check(db, count=20, text="old")
    with db.transaction() as conn:
        conn.root()["fresh"] = PersistentMapping(text="new " * 50)
    with db.transaction() as conn:
        assert conn.root()["fresh"]["text"] == "new " * 50
    db.close()
    only_new = ZODB.DB(storage_factory.open(compress_dict=str(new), **settings))
    try:
        with only_new.transaction() as conn:
            assert conn.root()["fresh"]["text"] == "new " * 50
            with pytest.raises(ConfigurationError, match=r"dictionary id \d+, but"
                               r" compress-dict has only id\(s\) \d+"):
                conn.root()["item0"]["text"]
    finally:
        only_new.close()


def test_several_keys_in_one_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from zodbsql.atrest.keys import load_keys
    monkeypatch.setenv("ZODBSQL_TEST_KEYS", f"k1:{new_key()}, k2:{new_key()}")
    keys = load_keys(None, "ZODBSQL_TEST_KEYS", "k2")
    assert keys is not None and keys.ids() == ["k1", "k2"] and keys.current == "k2"


def test_a_damaged_header_is_a_corrupt_record() -> None:
    codec = RecordCodec(compress=True, keys=ring(k=b"k" * 32))
    stored = codec.encode(5, b"\x80\x03" + b"z" * 1000)
    for damaged in (MAGIC + b"\x80" + stored[3:],      # unknown flags
                    stored[:4],                        # cut in the header
                    MAGIC + b"\x01" + b"not zstd"):    # compressed, but not zstd
        with pytest.raises(CorruptRecordError, match="oid 0x0000000000000005"):
            codec.decode(5, 9, damaged)


def test_a_damaged_neighbour_does_not_fail_a_prefetching_load(
        storage_factory: Any, tmp_path: pathlib.Path) -> None:
    """Prefetch brings the states an object refers to; one that does not decrypt is
    left out, and only its own load reports it."""
    keys = key_file(tmp_path, new_key())
    db = ZODB.DB(storage_factory.open(key_file=keys))
    fill(db)
    with db.transaction() as conn:
        damaged = u64(conn.root()["item3"]._p_oid)
    db.close()
    storage = storage_factory.open(key_file=keys)
    conn = storage.backend.connect()
    try:
        (state,) = conn.fetchone("SELECT state FROM object_state WHERE zoid = %s"
                                 " ORDER BY tid DESC LIMIT 1", (damaged,))
        state = bytes(state)
        conn.begin_write()
        conn.execute("UPDATE object_state SET state = %s WHERE zoid = %s",
                     (state[:-1] + bytes([state[-1] ^ 1]), damaged))
        conn.commit()
    finally:
        conn.close()
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        root = conn.root()        # prefetches the items, item3 among them
        assert root["item4"]["text"] == f"{MARKER} 4 " * 20
        with pytest.raises(CorruptRecordError, match="key id 'default'"):
            root["item3"]["text"]
    db.close()


def test_checksums_of_encrypted_records_are_keyed(storage_factory: Any,
                                                  tmp_path: pathlib.Path) -> None:
    """A record's checksum stays in clear: keyed with the database's checksum key, it
    can't confirm a guessed state.  Records from before encryption keep their plain
    checksums (and verify) until rekey rewrites them keyed."""
    from zodbsql.atrest.rekey import rekey
    from zodbsql.storage.records import checksum
    db = ZODB.DB(storage_factory.open())
    fill(db, count=5, text="before")
    db.close()
    keys = key_file(tmp_path, new_key())
    storage = storage_factory.open(key_file=keys)
    db = ZODB.DB(storage)
    fill(db, count=5)
    codec = storage.shared.codec
    assert codec.checksum_key is not None and len(codec.checksum_key) == 32

    def kinds() -> dict[str, int]:
        found = {"plain": 0, "keyed": 0}
        conn = storage.backend.connect()
        try:
            for oid, tid, stored, state in conn.fetchall(
                    "SELECT zoid, tid, checksum, state FROM object_state"
                    " WHERE state IS NOT NULL"):
                plain = codec.decode(int(oid), int(tid), bytes(state))
                if stored == checksum(plain):
                    found["plain"] += 1
                else:
                    assert stored == checksum(plain, codec.checksum_key)
                    found["keyed"] += 1
        finally:
            conn.close()
        return found
    before = kinds()
    assert before["plain"] >= 5 and before["keyed"] >= 5
    assert verify(storage).clean
    rekey(storage.backend, codec)
    assert kinds() == {"plain": 0, "keyed": before["plain"] + before["keyed"]}
    assert verify(storage).clean
    check(db, count=5)
    db.close()


def test_every_read_path_checks_keyed_checksums(storage_factory: Any,
                                                tmp_path: pathlib.Path) -> None:
    """Encrypted records carry keyed checksums: load, prefetch, loadSerial and
    loadBefore accept them, and each reports a record whose checksum does not match,
    naming its oid."""
    from ZODB.utils import p64
    keys = key_file(tmp_path, new_key())
    db = ZODB.DB(storage_factory.open(key_file=keys))
    fill(db, count=3)
    with db.transaction() as conn:
        conn.root()["item0"]["small"] = 100             # a second revision
    with db.transaction() as conn:
        root = conn.root()
        oid, serial = root["item0"]._p_oid, root["item0"]._p_serial
        others = [root[f"item{i}"]._p_oid for i in (1, 2)]
    db.close()
    storage = storage_factory.open(key_file=keys)
    instance = storage.new_instance()
    try:
        instance.poll_invalidations()
        instance.prefetch(others)
        before = storage.statement_count()
        for other in others:                             # prefetched: no statement
            assert MARKER in str(instance.load(other)[0].decode("latin-1"))
        assert storage.statement_count() == before
        state, tid = instance.load(oid)
        assert tid == serial
        assert instance.loadSerial(oid, serial) == state
        assert instance.loadBefore(oid, p64(u64(serial) + 1))[:2] == (state, serial)
        conn = storage.backend.connect()
        try:
            rows = conn.fetchall("SELECT tid, checksum FROM object_state WHERE zoid = %s",
                                 (u64(oid),))
            conn.begin_write()
            for row_tid, stored in rows:
                conn.execute("UPDATE object_state SET checksum = %s"
                             " WHERE zoid = %s AND tid = %s",
                             (int(stored) ^ 1, u64(oid), int(row_tid)))
            conn.commit()
        finally:
            conn.close()
        instance.poll_invalidations()       # history-free: a new read transaction
        damaged = f"corrupt record for oid 0x{u64(oid):016x}"
        with pytest.raises(CorruptRecordError, match=damaged):
            instance.loadSerial(oid, serial)
        with pytest.raises(CorruptRecordError, match=damaged):
            instance.loadBefore(oid, p64(u64(serial) + 1))
    finally:
        instance.release()
        storage.close()


def test_prefetched_rows_open_as_one_by_one() -> None:
    # loaded_states takes a row stored as it is without the codec, opens a sealed one
    # with it, and leaves out one that does not open; the rows' order is kept.
    from zodbsql.backends.base.mover import loaded_state, loaded_states
    codec = RecordCodec(compress=True, threshold=16)
    plain = b"\x80\x03plain state"
    sealed_state = b"\x80\x03" + b"sealed " * 40
    sealed = codec.encode(2, sealed_state)
    assert sealed.startswith(codec.sealed_prefix) and not plain.startswith(MAGIC)
    damaged = MAGIC + b"\xff\xff"
    rows = [(1, 10, 5, plain), (2, 10, 6, sealed), (3, 10, None, None), (4, 10, 7, damaged),
            (5, 10, 8, memoryview(plain)), (6, 10, 9, bytearray(plain))]
    loaded = loaded_states(rows, codec)
    assert [tuple(each) for each in loaded] == [
        (1, 10, 5, plain), (2, 10, 6, sealed_state), (3, 10, None, None),
        (5, 10, 8, plain), (6, 10, 9, plain)]
    assert loaded == [each for each in (loaded_state(row, codec) for row in rows)
                      if each is not None]
    assert all(type(each.state) in (bytes, type(None)) for each in loaded)
