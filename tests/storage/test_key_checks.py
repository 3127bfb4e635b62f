"""What opening a storage does with its codec settings and keys (atrest/opening.py):
the codec the options describe, and the checks of the keys against the database, which
refuse a wrong key in whole words and write nothing read-only or when they refuse."""
from __future__ import annotations

import base64
import builtins
import os
import pathlib
import threading
from typing import Any

import pytest
import ZODB
from persistent.mapping import PersistentMapping

from tests.storage.test_codec import trained
from zodbsql.atrest import opening
from zodbsql.atrest.codec import PLAIN, RecordCodec
from zodbsql.atrest.keys import KeyRing, parse_keys
from zodbsql.errors import ConfigurationError, RecordKeyError
from zodbsql.options import Options


def key_file(tmp_path: pathlib.Path, name: str, *entries: str) -> str:
    path = tmp_path / name
    path.write_text("\n".join(entries) + "\n")
    return str(path)


def entry(key_id: str) -> str:
    return f"{key_id}:{base64.b64encode(os.urandom(32)).decode()}"


def meta(storage: Any) -> dict[str, str]:
    """The database's meta table, every row."""
    conn = storage.backend.connect()
    try:
        found = storage.backend.schema.read_meta(conn)
        assert found is not None
        return dict(found)
    finally:
        conn.close()


def set_meta(storage: Any, name: str, value: str) -> None:
    conn = storage.backend.connect()
    try:
        conn.begin_write()
        storage.backend.history.set_meta(conn, name, value)
        conn.commit()
    finally:
        conn.close()


def write_something(storage: Any) -> None:
    db = ZODB.DB(storage)
    with db.transaction() as conn:
        conn.root()["thing"] = PersistentMapping(text="x" * 500)
    db.close()


# -- the codec of the options ------------------------------------------------------------
def test_no_feature_is_the_plain_codec() -> None:
    assert opening.codec_for(Options()) is PLAIN


def test_the_compression_settings_reach_the_codec() -> None:
    codec = opening.codec_for(Options(compress="zstd", compress_level=7,
                                      compress_threshold=1000))
    assert (type(codec), codec.compress, codec.level, codec.threshold) == (
        RecordCodec, True, 7, 1000)


def test_dictionaries_stay_readable_with_compression_off(tmp_path: pathlib.Path) -> None:
    (tmp_path / "d1").write_bytes(trained(111))
    (tmp_path / "d2").write_bytes(trained(222))
    state = b"\x80\x03" + b"record text that compresses " * 40
    writer = opening.codec_for(Options(compress="zstd", compress_dict=str(tmp_path / "d2")))
    stored = writer.encode(5, state)
    # Turned off later, with the dictionaries listed (empty entries skipped): the
    # records compressed with them still read.
    for listed in (f"{tmp_path / 'd1'},{tmp_path / 'd2'}", f",{tmp_path / 'd1'},,"
                   f" {tmp_path / 'd2'} ,"):
        reader = opening.codec_for(Options(compress="off", compress_dict=listed))
        assert reader is not PLAIN and not reader.compress
        assert reader.decode(5, 1, stored) == state
        assert reader.encode(5, state) == state    # nothing new is compressed


def test_an_unreadable_dictionary_is_named(tmp_path: pathlib.Path) -> None:
    missing = str(tmp_path / "none.dict")
    with pytest.raises(ConfigurationError) as info:
        opening.codec_for(Options(compress="zstd", compress_dict=missing))
    assert str(info.value) == f"compress-dict {missing!r} cannot be read: No such file or directory"


def test_a_key_from_the_environment_encrypts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZODBSQL_TEST_OPENING_KEY", entry("env"))
    codec = opening.codec_for(Options(key_env="ZODBSQL_TEST_OPENING_KEY"))
    assert codec.keys is not None and codec.keys.ids() == ["env"]
    assert b"secret state" not in codec.encode(1, b"\x80\x03secret state")


def test_cryptography_is_needed_only_with_keys(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: pathlib.Path) -> None:
    real_import = builtins.__import__

    def without_cryptography(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("cryptography"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_cryptography)
    assert opening.codec_for(Options()) is PLAIN
    assert opening.codec_for(Options(compress="zstd")).compress
    with pytest.raises(ConfigurationError) as info:
        opening.codec_for(Options(key_file=key_file(tmp_path, "k", entry("k"))))
    assert str(info.value) == (
        "key-file and key-env need the cryptography package (pip install 'zodbsql[atrest]'):"
        " No module named 'cryptography.hazmat.primitives.ciphers.aead'")


# -- the keys against the database ---------------------------------------------------------
def test_what_a_first_encrypted_open_records(storage_factory: Any,
                                             tmp_path: pathlib.Path) -> None:
    keys = key_file(tmp_path, "keys", entry("a"), entry("b"))
    storage = storage_factory.open(key_file=keys, key_id="b")
    found = meta(storage)
    assert found["encrypted_with"] == "b"
    assert {name for name in found if name.startswith(("key_check:", "checksum_key:"))} == {
        "key_check:a", "key_check:b", "checksum_key:a", "checksum_key:b"}
    storage.close()
    # Opened again with the same keys: the same records, nothing added or changed.
    assert meta(storage_factory.open(key_file=keys, key_id="a")) == found


def test_a_wrong_key_under_a_known_id_is_refused_by_its_check(
        storage_factory: Any, tmp_path: pathlib.Path) -> None:
    storage = storage_factory.open(key_file=key_file(tmp_path, "k1", entry("k1")))
    write_something(storage)
    before = meta(storage_factory.open(read_only=True))
    wrong = key_file(tmp_path, "wrong", entry("k1"))
    for read_only in (False, True):
        with pytest.raises(RecordKeyError) as info:
            storage_factory.open(key_file=wrong, read_only=read_only)
        assert str(info.value) == (
            f"the key configured as key id 'k1' is not the key {storage.backend.describe()}"
            " was written with under that id; nothing was written")
        assert info.value.key_id == "k1"
    assert meta(storage_factory.open(read_only=True)) == before


def test_a_later_key_is_checked_too(storage_factory: Any, tmp_path: pathlib.Path) -> None:
    k1, k2 = entry("k1"), entry("k2")
    storage_factory.open(key_file=key_file(tmp_path, "both", k1, k2), key_id="k1").close()
    # k1 right, k2 another key than the one recorded: refused for k2.
    with pytest.raises(RecordKeyError) as info:
        storage_factory.open(key_file=key_file(tmp_path, "k2-wrong", k1, entry("k2")),
                             key_id="k1")
    assert info.value.key_id == "k2" and "key id 'k2' is not the key" in str(info.value)


def test_a_read_only_open_records_nothing(storage_factory: Any,
                                          tmp_path: pathlib.Path) -> None:
    k1, k2 = entry("k1"), entry("k2")
    storage = storage_factory.open()
    write_something(storage)
    plain = meta(storage)
    # A database without encrypted records, opened read-only with a key: no check, no
    # checksum key, no first id is recorded.
    reader = storage_factory.open(key_file=key_file(tmp_path, "k1", k1), read_only=True)
    assert meta(reader) == plain
    reader.close()
    storage_factory.open(key_file=key_file(tmp_path, "k1", k1)).close()
    encrypted = meta(storage)
    assert set(encrypted) - set(plain) == {"key_check:k1", "checksum_key:k1", "encrypted_with"}
    # A new id beside the known one, read-only: nothing recorded for it.
    reader = storage_factory.open(key_file=key_file(tmp_path, "both", k1, k2), key_id="k2",
                                  read_only=True)
    assert meta(reader) == encrypted
    reader.close()
    # Writable, its check and its copy of the checksum key are recorded; the first id
    # stays.
    storage_factory.open(key_file=key_file(tmp_path, "both", k1, k2), key_id="k2").close()
    assert set(meta(storage)) - set(encrypted) == {"key_check:k2", "checksum_key:k2"}
    assert meta(storage)["encrypted_with"] == "k1"


def test_new_keys_alone_are_refused_naming_the_first(storage_factory: Any,
                                                     tmp_path: pathlib.Path) -> None:
    storage = storage_factory.open(key_file=key_file(tmp_path, "k1", entry("k1")))
    before = meta(storage)
    with pytest.raises(RecordKeyError) as info:
        storage_factory.open(key_file=key_file(tmp_path, "new", entry("n1"), entry("n2")),
                             key_id="n2")
    assert str(info.value) == (
        f"none of the configured key ids (n1, n2) has opened {storage.backend.describe()}"
        " before, so its checksum key can't be read; configure a key id it knows (the"
        " first was 'k1') beside the new one once; nothing was written")
    assert info.value.key_id == "k1"
    assert meta(storage) == before
    # Read-only too: it could not verify a record's keyed checksum.
    with pytest.raises(RecordKeyError, match="none of the configured key ids"):
        storage_factory.open(key_file=key_file(tmp_path, "new", entry("n1")), read_only=True)


def delete_meta(storage: Any, name: str) -> None:
    conn = storage.backend.connect()
    try:
        conn.begin_write()
        conn.execute("DELETE FROM zodbsql_meta WHERE name = %s", (name,))
        conn.commit()
    finally:
        conn.close()


def test_an_open_with_everything_recorded_writes_nothing(storage_factory: Any,
                                                         tmp_path: pathlib.Path) -> None:
    """Every configured id checked and holding the checksum key, the first id recorded:
    the keys are checked without a write transaction (on SQLite one would wait for a
    commit or a pack holding the database's write lock)."""
    keys = key_file(tmp_path, "both", entry("k1"), entry("k2"))
    storage = storage_factory.open(key_file=keys, key_id="k1")
    backend = storage.backend
    conn = backend.connect()
    try:
        def no_write() -> None:
            raise AssertionError("a write transaction")
        conn.begin_write = no_write
        found = opening.check_keys(backend, conn, storage.shared.codec.keys, False)
        assert found == storage.shared.codec.checksum_key
    finally:
        conn.close()


@pytest.mark.parametrize("name", ["key_check:k2", "checksum_key:k2", "encrypted_with"])
def test_a_record_missing_alone_is_made_again(storage_factory: Any, tmp_path: pathlib.Path,
                                              name: str) -> None:
    """One of the records a keyed open makes is missing (a database edited by hand, or
    written by an older zodbsql): the next writable open records it again, the rest
    as it was."""
    keys = key_file(tmp_path, "both", entry("k1"), entry("k2"))
    storage = storage_factory.open(key_file=keys, key_id="k1")
    before = meta(storage)
    delete_meta(storage, name)
    storage_factory.open(key_file=keys, key_id="k1").close()
    after = meta(storage)
    assert set(after) == set(before)
    assert {key: value for key, value in after.items() if key != name} == {
        key: value for key, value in before.items() if key != name}
    if name == "encrypted_with":
        assert after[name] == "k1"
    elif name == "checksum_key:k2":
        k2 = ring("k1", *open(keys).read().split())
        assert opening._unwrap(k2, "k2", after[name]) == storage.shared.codec.checksum_key


def test_a_checksum_key_its_key_does_not_open(storage_factory: Any,
                                              tmp_path: pathlib.Path) -> None:
    k1, k2 = entry("k1"), entry("k2")
    storage = storage_factory.open(key_file=key_file(tmp_path, "both", k1, k2), key_id="k1")
    records = meta(storage)
    # k2's copy replaced by k1's (another key's wrapping): k2's own check still passes.
    set_meta(storage, "checksum_key:k2", records["checksum_key:k1"])
    with pytest.raises(RecordKeyError) as info:
        storage_factory.open(key_file=key_file(tmp_path, "k2", k2))
    assert str(info.value) == (
        "the key configured as key id 'k2' does not open the checksum key recorded under"
        " that id; nothing was written")
    assert info.value.key_id == "k2"


def test_no_key_on_an_encrypted_database(storage_factory: Any,
                                         tmp_path: pathlib.Path) -> None:
    storage = storage_factory.open(key_file=key_file(tmp_path, "k1", entry("k1")))
    write_something(storage)
    before = meta(storage)
    with pytest.raises(RecordKeyError) as info:
        storage_factory.open()
    assert str(info.value) == (
        f"{storage.backend.describe()} holds records encrypted with key id 'k1' (and maybe"
        " later ids), but no key-file or key-env is configured; nothing was written"
        " (read-only, it opens, and a record says which key id it needs)")
    assert info.value.key_id == "k1"
    storage_factory.open(read_only=True).close()
    assert meta(storage) == before


def test_a_check_another_process_recorded_meanwhile_is_verified(
        storage_factory: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes opening with the same new key id and different keys: the one whose
    check was recorded second is refused, not left writing under an id bound to the
    other key."""
    k1, ours, theirs = entry("k1"), entry("k2"), entry("k2")
    storage = storage_factory.open(key_file=key_file(tmp_path, "k1", k1))
    their_check = opening._key_check(KeyRing(parse_keys(theirs, "theirs", "k2"), "k2"), "k2")
    checked = opening._open_checksum_key

    def others_record_first(*args: Any) -> Any:
        found = checked(*args)
        set_meta(storage, "key_check:k2", their_check)   # after our read of the checks
        return found

    monkeypatch.setattr(opening, "_open_checksum_key", others_record_first)
    with pytest.raises(RecordKeyError) as info:
        storage_factory.open(key_file=key_file(tmp_path, "ours", k1, ours), key_id="k1")
    assert str(info.value) == (
        f"the key configured as key id 'k2' is not the key {storage.backend.describe()}"
        " was written with under that id; nothing was written")
    assert info.value.key_id == "k2" and "checksum_key:k2" not in meta(storage)


def ring(current: str, *entries: str) -> KeyRing:
    keys: dict[str, bytes] = {}
    for text in entries:
        keys.update(parse_keys(text, "test", current))
    return KeyRing(keys, current)


def racing_check(backend: Any, keys: KeyRing) -> tuple[threading.Thread, list[Any]]:
    """``check_keys`` of another storage on its own connection, in a thread: what it
    returned or raised, once the thread has ended."""
    outcome: list[Any] = []
    conn = backend.connect()

    def check() -> None:
        try:
            outcome.append(opening.check_keys(backend, conn, keys, False))
        except Exception as exc:    # the test looks at it
            outcome.append(exc)
        finally:
            conn.close()
    thread = threading.Thread(target=check)
    thread.start()
    return thread, outcome


def first_encryption_in_progress(backend: Any, keys: KeyRing, secret: bytes) -> Any:
    """A transaction, not yet committed, recording what a first encrypted open with
    ``keys`` records (its checksum key ``secret``): another process at the same moment."""
    conn = backend.connect()
    conn.begin_write()
    backend.history.set_meta(conn, opening.ENCRYPTED_WITH, keys.current)
    for key_id in keys.ids():
        backend.history.set_meta(conn, opening.CHECKSUM_KEY + key_id,
                                 opening._wrap(keys, key_id, secret))
        backend.history.set_meta(conn, opening.KEY_CHECK + key_id,
                                 opening._key_check(keys, key_id))
    return conn


def test_processes_encrypting_a_new_database_at_once_share_its_checksum_key(
        storage_factory: Any) -> None:
    """Two processes encrypt a new database at once, one with keys k1 and k2 (k2 new
    records' id), the other with k1 alone: the second waits for the first and takes
    its checksum key (with its own, both would write records whose checksums the other
    can't verify)."""
    k1, k2 = entry("k1"), entry("k2")
    storage = storage_factory.open()        # the schema, without encrypted records
    backend = storage.backend
    secret = os.urandom(32)
    first = first_encryption_in_progress(backend, ring("k2", k1, k2), secret)
    try:
        thread, outcome = racing_check(backend, ring("k1", k1))
        thread.join(0.5)
        assert thread.is_alive(), outcome   # it waits for the first's transaction
        first.commit()
        thread.join(30)
    finally:
        first.close()
    assert outcome == [secret]
    recorded = meta(storage)
    assert recorded["encrypted_with"] == "k2"
    assert opening._unwrap(ring("k1", k1), "k1", recorded["checksum_key:k1"]) == secret


def test_a_process_whose_keys_lost_the_race_is_refused(storage_factory: Any) -> None:
    """The other process encrypted the new database with k2 first; one with k1 alone
    can't read its checksum key: refused after the wait, with nothing recorded."""
    storage = storage_factory.open()
    backend = storage.backend
    first = first_encryption_in_progress(backend, ring("k2", entry("k2")), os.urandom(32))
    try:
        thread, outcome = racing_check(backend, ring("k1", entry("k1")))
        thread.join(0.5)
        assert thread.is_alive(), outcome
        first.commit()
        thread.join(30)
    finally:
        first.close()
    assert len(outcome) == 1 and isinstance(outcome[0], RecordKeyError), outcome
    assert str(outcome[0]) == (
        f"none of the configured key ids (k1) has opened {backend.describe()} before, so"
        " its checksum key can't be read; configure a key id it knows (the first was"
        " 'k2') beside the new one once; nothing was written")
    assert not {"key_check:k1", "checksum_key:k1"} & set(meta(storage))
