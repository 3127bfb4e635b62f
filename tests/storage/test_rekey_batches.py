"""``rekey`` called on its own, every backend: every revision and every blob chunk
walked in batches as small as one row, whatever the number of revisions an object
has; what is rewritten, skipped and counted; progress after each batch; a record that
fails its checksum stops it by name; a batch the database cancels is tried again, a
bounded number of times."""
from __future__ import annotations

import base64
import os
import pathlib
import time
from typing import Any, Iterator

import pytest
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.blob import Blob

from zodbsql.atrest import rekey as rekey_module
from zodbsql.atrest.codec import RecordCodec
from zodbsql.atrest.rekey import RekeyProgress, rekey
from zodbsql.errors import (ConfigurationError, CorruptRecordError, DatabaseConflict,
                            CommitLockTimeout, RecordKeyError)

OLD, NEW = (base64.b64encode(os.urandom(32)).decode() for _ in range(2))
CHUNK = 1024


class Site:
    """A database written under key k1 (objects with several revisions, blobs of
    several chunks), reopened with k1 and k2, k2 current."""

    def __init__(self, storage_factory: Any, tmp_path: pathlib.Path) -> None:
        self.factory = storage_factory
        self.tmp_path = tmp_path
        old = tmp_path / "old"
        old.write_text(f"k1:{OLD}\n")
        both = tmp_path / "both"
        both.write_text(f"k1:{OLD}\nk2:{NEW}\n")
        self.old_options = {"key_file": str(old), "blob_dir": str(tmp_path / "b1"),
                            "blob_chunk_size": CHUNK}
        self.new_options = {"key_file": str(both), "key_id": "k2",
                            "blob_dir": str(tmp_path / "b2"), "blob_chunk_size": CHUNK}

    def write(self, objects: int, revisions: int, blobs: int,
              **options: Any) -> None:
        db = ZODB.DB(self.factory.open(**{**self.old_options, **options}))
        try:
            for revision in range(revisions):
                with db.transaction() as conn:
                    for i in range(objects):
                        mapping = conn.root().get(i)
                        if mapping is None:
                            mapping = conn.root()[i] = PersistentMapping()
                        mapping["value"] = f"object {i} revision {revision}"
            with db.transaction() as conn:
                for i in range(blobs):
                    conn.root()[f"blob{i}"] = Blob(bytes([i]) * (CHUNK * 2 + 10))
        finally:
            db.close()

    def open_new(self) -> Any:
        return self.factory.open(**self.new_options)

    def stored(self, storage: Any) -> tuple[list[bytes], list[bytes]]:
        """Every stored state and every blob chunk, as the database holds them."""
        conn = storage.shared.backend.connect()
        try:
            states = [bytes(row[0]) for row in conn.fetchall(
                "SELECT state FROM object_state WHERE state IS NOT NULL")]
            chunks = [bytes(row[0]) for row in conn.fetchall("SELECT data FROM blob_chunk")]
        finally:
            conn.close()
        return states, chunks

    def key_ids(self, storage: Any) -> tuple[dict[str | None, int], dict[str | None, int]]:
        codec = RecordCodec()
        states, chunks = self.stored(storage)
        by_state: dict[str | None, int] = {}
        for state in states:
            key_id = codec.key_id_of(state)
            by_state[key_id] = by_state.get(key_id, 0) + 1
        by_chunk: dict[str | None, int] = {}
        for chunk in chunks:
            key_id = storage.shared.codec.chunk_key_id(chunk)
            by_chunk[key_id] = by_chunk.get(key_id, 0) + 1
        return by_state, by_chunk

    def read_back(self, objects: int, revisions: int, blobs: int) -> None:
        """Everything reads with the new key alone, every revision of every object."""
        only_new = self.tmp_path / "new"
        only_new.write_text(f"k2:{NEW}\n")
        storage = self.factory.open(key_file=str(only_new),
                                    blob_dir=str(self.tmp_path / "b3"),
                                    blob_chunk_size=CHUNK)
        db = ZODB.DB(storage)
        try:
            with db.transaction() as conn:
                for i in range(objects):
                    assert conn.root()[i]["value"] == f"object {i} revision {revisions - 1}"
                for i in range(blobs):
                    with conn.root()[f"blob{i}"].open() as stream:
                        assert stream.read() == bytes([i]) * (CHUNK * 2 + 10)
            if self.factory.param.keep_history:
                with db.transaction() as conn:
                    oid = conn.root()[0]._p_oid
                history = storage.history(oid, size=revisions + 5)
                assert len(history) == revisions
                for entry in history:
                    storage.loadSerial(oid, entry["tid"])      # each one opens
        finally:
            db.close()


@pytest.fixture
def site(storage_factory: Any, tmp_path: pathlib.Path) -> Iterator[Site]:
    yield Site(storage_factory, tmp_path)


@pytest.mark.parametrize("batch", [1, 2, 500])
def test_every_revision_and_chunk_is_rewritten_in_batches(site: Site, batch: int) -> None:
    objects, revisions, blobs = 5, 3, 3
    site.write(objects, revisions, blobs)
    storage = site.open_new()
    try:
        states, chunks = site.key_ids(storage)
        assert set(states) == {"k1"} and set(chunks) == {"k1"}
        reports: list[RekeyProgress] = []
        done = rekey(storage.shared.backend, storage.shared.codec, batch,
                     lambda progress: reports.append(RekeyProgress(**vars(progress))))
        total_states, total_chunks = states["k1"], chunks["k1"]
        assert total_chunks == blobs * 3
        assert done == RekeyProgress(total_states, total_states, total_states,
                                     total_chunks, total_chunks, total_chunks)
        assert site.key_ids(storage) == ({"k2": total_states}, {"k2": total_chunks})
        # Reported once before the first batch, then after each.
        batches = -(-total_states // batch) + -(-total_chunks // batch)
        assert len(reports) == 1 + batches
        assert reports[0] == RekeyProgress(0, total_states, 0, 0, total_chunks, 0)
        assert [r.states for r in reports[1:]][:2] == [min(batch, total_states),
                                                       min(2 * batch, total_states)]
        assert reports[-1] == done
        again = rekey(storage.shared.backend, storage.shared.codec, batch)
        assert again == RekeyProgress(total_states, total_states, 0,
                                      total_chunks, total_chunks, 0)
    finally:
        storage.close()
    site.read_back(objects, revisions, blobs)


def test_only_what_is_not_current_is_rewritten(site: Site) -> None:
    site.write(4, 1, 1)
    storage = site.open_new()
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:              # two objects written under k2 now
            conn.root()[0]["value"] = "object 0 revision 1"
            conn.root()[1]["value"] = "object 1 revision 1"
        states, _ = site.key_ids(storage)
        assert states.get("k2", 0) == 2             # the two objects (hf: their only rows)
        done = rekey(storage.shared.backend, storage.shared.codec, 1)
        assert done.states == sum(states.values())
        assert done.states_rewritten == states["k1"]
        assert site.key_ids(storage)[0] == {"k2": sum(states.values())}
    finally:
        db.close()


def test_a_record_that_fails_its_checksum_stops_the_run_by_name(site: Site) -> None:
    site.write(3, 1, 0)
    storage = site.open_new()
    try:
        conn = storage.shared.backend.connect()
        rows = conn.fetchall("SELECT zoid, tid FROM object_state WHERE state IS NOT NULL"
                             " ORDER BY zoid, tid")
        (oid, tid) = (int(rows[-1][0]), int(rows[-1][1]))
        conn.begin_write()
        conn.execute("UPDATE object_state SET checksum = checksum + 1 WHERE zoid = %s"
                     " AND tid = %s", (oid, tid))
        conn.commit()
        conn.close()
        with pytest.raises(CorruptRecordError) as caught:
            rekey(storage.shared.backend, storage.shared.codec, 1)
        assert f"0x{oid:016x}" in str(caught.value)
        # The batches before it were written; it was not.
        states, _ = site.key_ids(storage)
        assert states == {"k2": len(rows) - 1, "k1": 1}
    finally:
        storage.close()


def test_no_key_no_rekey(storage_factory: Any) -> None:
    storage = storage_factory.open()
    try:
        with pytest.raises(ConfigurationError,
                           match="^rekey needs key-file or key-env: the key new records use$"):
            rekey(storage.shared.backend, storage.shared.codec)
    finally:
        storage.close()


def test_a_cancelled_batch_is_tried_again_then_given_up(
        site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    site.write(2, 1, 0)
    storage = site.open_new()
    try:
        connections: list[Any] = []
        real_connect = storage.shared.backend.connect_for_commit

        def connect_for_commit(timeout: float) -> Any:
            conn = real_connect(timeout)
            connections.append(conn)
            cancelled: list[int] = []
            real_executemany = conn.executemany

            def executemany(sql: str, rows: Any) -> Any:
                if len(cancelled) < failures:
                    cancelled.append(1)
                    real_executemany(sql, rows)    # written, then cancelled: rolled back
                    raise DatabaseConflict("deadlock: the batch was cancelled")
                return real_executemany(sql, rows)

            real_close = conn.close

            def close() -> None:
                closed.append(conn)
                real_close()

            monkeypatch.setattr(conn, "executemany", executemany)
            monkeypatch.setattr(conn, "close", close)
            return conn

        closed: list[Any] = []
        monkeypatch.setattr(storage.shared.backend, "connect_for_commit", connect_for_commit)
        failures = rekey_module.RETRIES            # the last try succeeds
        done = rekey(storage.shared.backend, storage.shared.codec, 500)
        assert done.states_rewritten == done.states_total
        assert set(site.key_ids(storage)[0]) == {"k2"}

        # More under k1 (by a storage that knows k2 too: the root is k2's now).
        site.write(2, 1, 0, key_file=site.new_options["key_file"], key_id="k1")
        failures = rekey_module.RETRIES + 1        # one try too many
        before = site.key_ids(storage)[0]
        assert before.get("k1", 0) > 0
        with pytest.raises(DatabaseConflict, match="cancelled"):
            rekey(storage.shared.backend, storage.shared.codec, 500)
        assert site.key_ids(storage)[0] == before  # each try rolled back
        assert closed == connections and len(connections) == 2   # closed, failed or not
    finally:
        storage.close()


def test_another_error_rolls_the_batch_back_at_once(site: Site,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    site.write(2, 1, 0)
    storage = site.open_new()
    try:
        real_connect = storage.shared.backend.connect_for_commit
        tries: list[int] = []

        def connect_for_commit(timeout: float) -> Any:
            conn = real_connect(timeout)
            real_executemany = conn.executemany

            def executemany(sql: str, rows: Any) -> Any:
                tries.append(1)
                real_executemany(sql, rows)
                raise OSError("disk full")

            monkeypatch.setattr(conn, "executemany", executemany)
            return conn

        monkeypatch.setattr(storage.shared.backend, "connect_for_commit", connect_for_commit)
        before = site.key_ids(storage)[0]
        with pytest.raises(OSError, match="disk full"):
            rekey(storage.shared.backend, storage.shared.codec, 500)
        assert tries == [1]
        assert site.key_ids(storage)[0] == before
    finally:
        storage.close()


def test_rewritten_records_carry_the_keyed_checksum(site: Site) -> None:
    """The checksum written with a resealed record is the keyed one (a record written
    before encryption had a plain one), so that it can't confirm a guessed state."""
    from zodbsql.storage.records import checksum
    site.write(3, 2, 0)
    storage = site.open_new()
    try:
        rekey(storage.shared.backend, storage.shared.codec, 2)
        codec = storage.shared.codec
        key = codec.checksum_key
        assert key is not None
        conn = storage.shared.backend.connect()
        try:
            rows = conn.fetchall("SELECT zoid, tid, checksum, state FROM object_state"
                                 " WHERE state IS NOT NULL")
        finally:
            conn.close()
        assert rows
        for oid, tid, stored_checksum, state in rows:
            opened = codec.decode(int(oid), int(tid), bytes(state))
            assert stored_checksum == checksum(opened, key) != checksum(opened)
    finally:
        storage.close()


def test_a_record_under_a_key_not_configured_stops_the_run_by_name(
        site: Site, tmp_path: pathlib.Path) -> None:
    other = tmp_path / "other"
    other.write_text(f"k1:{OLD}\nk0:{base64.b64encode(os.urandom(32)).decode()}\n")
    site.write(1, 1, 0)
    site.write(2, 1, 0, key_file=str(other), key_id="k0",
               blob_dir=str(tmp_path / "b0"))
    storage = site.open_new()
    try:
        conn = storage.shared.backend.connect()
        try:
            codec = RecordCodec()
            (oid, tid) = next((int(o), int(t)) for o, t, s in conn.fetchall(
                "SELECT zoid, tid, state FROM object_state WHERE state IS NOT NULL"
                " ORDER BY zoid, tid") if codec.key_id_of(bytes(s)) == "k0")
        finally:
            conn.close()
        with pytest.raises(RecordKeyError) as caught:
            rekey(storage.shared.backend, storage.shared.codec, 500)
        assert str(caught.value).startswith(
            f"the record of oid 0x{oid:016x} tid 0x{tid:016x} is encrypted with key id 'k0'")
    finally:
        storage.close()


def test_a_row_lock_held_longer_than_the_timeout_stops_the_run(
        site: Site, storage_factory: Any) -> None:
    """A writer holding a record's row lock (a stuck commit) is waited for no longer
    than lock_timeout, as a commit would wait; running rekey again resumes."""
    if storage_factory.param.backend == "sqlite":
        pytest.skip("SQLite has no row locks: its one writer is waited for as a commit is")
    site.write(2, 1, 0)
    storage = site.open_new()
    holder = storage.shared.backend.connect_for_commit(30.0)
    try:
        storage.shared.backend.locker.begin_commit(holder, 30.0)
        holder.fetchall("SELECT zoid FROM object_state WHERE state IS NOT NULL"
                        " ORDER BY zoid, tid FOR UPDATE")
        started = time.monotonic()
        with pytest.raises(CommitLockTimeout):
            rekey(storage.shared.backend, storage.shared.codec, 500, lock_timeout=0.5)
        assert time.monotonic() - started < 10
        holder.rollback()
        done = rekey(storage.shared.backend, storage.shared.codec, 500, lock_timeout=5)
        assert done.states_rewritten == done.states_total
    finally:
        holder.close()
        storage.close()
