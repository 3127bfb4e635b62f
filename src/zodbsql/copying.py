"""Copy transactions from any iterable ZODB storage into any restorable one.

Incremental: only what comes after the destination's last transaction is copied, so a
copy that was interrupted, or a live source that went on committing, is finished by
running it again.  Each transaction is committed on its own, so nothing is doubled or
half-copied.  Blobs travel with their records when both storages support them.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Any, Callable

from ZODB.blob import is_blob_record
from ZODB.interfaces import IBlobStorage, IBlobStorageRestoreable
from ZODB.POSException import POSKeyError
from ZODB.utils import p64, u64, z64

from zodbsql.errors import ConfigurationError


@dataclasses.dataclass
class CopyCounts:
    transactions: int = 0
    records: int = 0
    blobs: int = 0
    data_bytes: int = 0
    first_tid: bytes | None = None


def resume_point(source: Any, dest: Any) -> bytes | None:
    """The tid to start copying at, or None when the destination is up to date."""
    last = dest.lastTransaction()
    if last == z64:
        return z64
    found = next(iter(source.iterator(last, last)), None)
    if found is None or found.tid != last:
        raise ConfigurationError(
            f"the destination's last transaction 0x{u64(last):016x} is not in the source:"
            " it holds other data (empty it first, for zodbsql with --clear)")
    if source.lastTransaction() == last:
        return None
    return p64(u64(last) + 1)


def transactions(source: Any, start: bytes) -> Any:
    """``source.iterator(start)`` without an empty transaction at tid 0.

    A history-preserving RelStorage database holds such a row, the placeholder its
    schema creates; iterated from tid 0 it comes first.  No storage can commit at tid 0
    (it is not after anything), and it holds nothing to copy.
    """
    for txn in source.iterator(start):
        if txn.tid == z64:
            records = list(txn)
            if records:
                raise ConfigurationError(
                    f"the source has a transaction at tid 0 holding {len(records)}"
                    " record(s); no storage can commit at tid 0")
            continue
        yield txn


def copy_transactions(source: Any, dest: Any, start: bytes,
                      progress: Callable[[CopyCounts, bytes], None] | None = None,
                      ) -> CopyCounts:
    counts = CopyCounts()
    with_blobs = IBlobStorage.providedBy(source)
    scratch = tempfile.mkdtemp(prefix="zodbsql-copy-")
    try:
        for txn in transactions(source, start):
            counts.first_tid = counts.first_tid or txn.tid
            dest.tpc_begin(txn, txn.tid, txn.status)
            try:
                for record in txn:
                    counts.records += 1
                    counts.data_bytes += len(record.data or b"")
                    blob = (_blob_copy(source, record, scratch)
                            if with_blobs and record.data and is_blob_record(record.data)
                            else None)
                    if blob is not None:
                        if not IBlobStorageRestoreable.providedBy(dest):
                            raise ConfigurationError(
                                "the source has blobs but the destination stores none")
                        dest.restoreBlob(record.oid, record.tid, record.data, blob,
                                         record.data_txn, txn)
                        counts.blobs += 1
                    else:
                        dest.restore(record.oid, record.tid, record.data, "",
                                     record.data_txn, txn)
                dest.tpc_vote(txn)
                dest.tpc_finish(txn)
            except BaseException:
                dest.tpc_abort(txn)
                raise
            counts.transactions += 1
            if progress is not None:
                progress(counts, txn.tid)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return counts


def _blob_copy(source: Any, record: Any, scratch: str) -> str | None:
    """A private copy of the record's blob file (restoreBlob takes the file over)."""
    try:
        path = source.loadBlob(record.oid, record.tid)
    except POSKeyError:
        return None
    fd, copy = tempfile.mkstemp(dir=scratch, suffix=".blob")
    os.close(fd)
    shutil.copyfile(path, copy)
    return copy


def count_from(storage: Any, start: bytes) -> CopyCounts:
    """Transactions and records of ``storage`` from ``start`` on (for the comparison)."""
    counts = CopyCounts()
    for txn in transactions(storage, start):
        counts.transactions += 1
        for record in txn:
            counts.records += 1
            counts.data_bytes += len(record.data or b"")
            if record.data and is_blob_record(record.data):
                counts.blobs += 1
    return counts
