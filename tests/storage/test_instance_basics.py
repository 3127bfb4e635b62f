"""Small parts of the storage every caller meets: how the SQL trace names a commit, a
serial given as text, the refusal of a closed storage, the versions it does not
support, and a wrapping storage's record transforms taken at registerDB."""
from __future__ import annotations

import pathlib
from typing import Any

import pytest
from ZODB.blob import Blob
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import StorageError
from ZODB.tests.StorageTestBase import zodb_pickle

from zodbsql.storage.storage import commit_label


class Described:
    def __init__(self, description: Any) -> None:
        self.description = description


def test_the_trace_names_a_commit_by_its_id_and_the_start_of_its_description() -> None:
    plain = Described("add   the\\n  items")
    assert commit_label(plain) == f"commit {id(plain):x} 'add the\\\\n items'"
    spaced = Described("add   the\n  items")
    assert commit_label(spaced) == f"commit {id(spaced):x} 'add the items'"
    undecodable = Described(b"caf\xe9 \xff")
    assert commit_label(undecodable) == f"commit {id(undecodable):x} 'caf\ufffd \ufffd'"
    long = Described("x" * 100)
    assert commit_label(long) == f"commit {id(long):x} '{'x' * 60}'"
    for nameless in (Described(""), Described(b""), Described(None), object()):
        assert commit_label(nameless) == f"commit {id(nameless):x}"


def test_a_blob_stored_with_its_serial_as_text_is_stored(storage_factory: Any,
                                                         tmp_path: pathlib.Path) -> None:
    """Some callers pass the empty serial as a text of eight NULs (ZODB's older API)."""
    storage = storage_factory.open(blob_dir=str(tmp_path / "cache"))
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    oid = storage.new_oid()
    path = tmp_path / "upload"
    path.write_bytes(b"blob data")
    record = zodb_pickle(Blob())
    storage.storeBlob(oid, "\0" * 8, record, str(path), "", txn)
    storage.tpc_vote(txn)
    tid = storage.tpc_finish(txn)
    assert storage.load(oid)[1] == tid
    assert pathlib.Path(storage.loadBlob(oid, tid)).read_bytes() == b"blob data"


def test_a_closed_storage_says_so_by_name(storage_factory: Any) -> None:
    storage = storage_factory.open()
    storage.close()
    with pytest.raises(StorageError) as closed:
        storage.new_instance()
    assert closed.value.args == (f"storage {storage.getName()} is closed",)


def test_versions_are_not_supported(storage_factory: Any) -> None:
    assert storage_factory.open().supportsVersions() is False


def test_a_wrapping_storage_registers_its_record_transforms(storage_factory: Any) -> None:
    """registerDB(wrapper), as a wrapping storage (zc.zlibstorage) calls it: conflict
    resolution reads committed records through the wrapper's transforms."""
    class Wrapper:
        @staticmethod
        def transform_record_data(data: bytes) -> bytes:
            return b"wrapped:" + data

        @staticmethod
        def untransform_record_data(data: bytes) -> bytes:
            return data[len(b"wrapped:"):]
    storage = storage_factory.open()
    storage.registerDB(Wrapper)
    assert storage._crs_transform_record_data(b"state") == b"wrapped:state"
    assert storage._crs_untransform_record_data(b"wrapped:state") == b"state"
