"""Measure blob throughput: write one blob of --size-mb MiB, then read it back.

Writing is a whole ZODB commit of a new blob (hashing, uploading the chunks or placing
the file); reading is ``openCommittedBlobFile`` with the local cache emptied of that
content first, so the data comes from the database (or the shared blob directory).
The blob is removed again afterwards; its content stays until the next pack.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import transaction
import ZODB
from ZODB.blob import Blob
from ZODB.interfaces import IBlobStorage

from zodbsql.cli import common
from zodbsql.errors import ConfigurationError

HELP = "print MB/s written and read for one blob of a given size"
EXAMPLE = ("example:\n  zodbsql blobspeed 'zodbsql+sqlite:///var/Data.sqlite?blob_dir=/var/blobs'"
           " --size-mb 100\n  zodbsql blobspeed zope.conf#main --size-mb 1000")
KEY = "zodbsql-blobspeed"
PIECE = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("storage", metavar="STORAGE", help=common.STORAGE_HELP)
    parser.add_argument("--size-mb", type=int, default=100,
                        help="size of the blob in MiB (default: 100)")


def write_random_file(directory: str, size: int) -> str:
    fd, path = tempfile.mkstemp(dir=directory, prefix="blobspeed-")
    with os.fdopen(fd, "wb") as f:
        left = size
        while left > 0:
            f.write(os.urandom(min(PIECE, left)))
            left -= PIECE
    return path


def measure(storage: object, size: int) -> tuple[float, float]:
    """Seconds to commit and to read back a new blob of ``size`` bytes."""
    if not IBlobStorage.providedBy(storage):
        raise ConfigurationError("the storage has no blob support (set blob-dir)")
    path = write_random_file(storage.temporaryDirectory(), size)  # type: ignore[attr-defined]
    db = ZODB.DB(storage)
    tm = transaction.TransactionManager()
    try:
        conn = db.open(transaction_manager=tm)
        blob = Blob()
        blob.consumeFile(path)
        conn.root()[KEY] = blob
        started = time.perf_counter()
        tm.commit()
        write_seconds = time.perf_counter() - started
        blob._p_activate()  # committed blobs are ghosts until used again
        oid, serial = blob._p_oid, blob._p_serial
        files = getattr(getattr(storage, "shared", None), "blob_files", None)
        if files is not None and files.cache is not None:
            files.cache.evict(files.hashes.get(int.from_bytes(oid, "big"),
                                               int.from_bytes(serial, "big")))
        started = time.perf_counter()
        read = 0
        with storage.openCommittedBlobFile(oid, serial) as f:  # type: ignore[attr-defined]
            while True:
                data = f.read(PIECE)
                if not data:
                    break
                read += len(data)
        read_seconds = time.perf_counter() - started
        if read != size:
            raise ConfigurationError(f"read {read} bytes back, wrote {size}")
        del conn.root()[KEY]
        tm.commit()
        conn.close()
    finally:
        db.close()
    return write_seconds, read_seconds


def run(args: argparse.Namespace) -> int:
    if args.size_mb < 1:
        raise ConfigurationError(f"--size-mb must be at least 1, got {args.size_mb}")
    size = args.size_mb * PIECE
    storage = common.open_storage(args.storage)
    if not IBlobStorage.providedBy(storage):
        storage.close()
        raise ConfigurationError("the storage has no blob support (set blob-dir)")
    write_seconds, read_seconds = measure(storage, size)
    print(f"blob of {args.size_mb} MiB on {storage.getName()}")
    print(f"write: {size / 1e6 / write_seconds:.1f} MB/s ({write_seconds:.2f} s)")
    print(f"read:  {size / 1e6 / read_seconds:.1f} MB/s ({read_seconds:.2f} s)")
    return 0
