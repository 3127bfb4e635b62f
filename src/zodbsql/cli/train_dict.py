"""Train a zstd dictionary on a sample of a database's records, for compress-dict.

Read-only.  With the dictionary configured (compress zstd, compress-dict FILE) new
records are compressed with it; records compressed with it can be read only while it
stays configured, so keep the file with the database's keys and backups.
"""
from __future__ import annotations

import argparse

from zodbsql.atrest.dictionary import sample_states, train
from zodbsql.cli import common

HELP = "train a zstd dictionary on a sample of the database's records (compress-dict)"
EXAMPLE = ("example:\n  zodbsql train-dict sqlite:///var/Data.sqlite --output /var/zodb.dict\n"
           "  zodbsql train-dict zope.conf#main --output zodb.dict --samples 20000")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("storage", metavar="STORAGE", help=common.STORAGE_HELP)
    parser.add_argument("--output", required=True, metavar="FILE",
                        help="where the dictionary is written")
    parser.add_argument("--samples", type=int, default=5000, metavar="N",
                        help="records to learn from, spread over the oids (default: 5000)")
    parser.add_argument("--size", type=int, default=112_640, metavar="BYTES",
                        help="the dictionary's size at most (default: 112640, zstd's own)")


def run(args: argparse.Namespace) -> int:
    storage = common.require_zodbsql(
        common.open_storage(args.storage, read_only=True, zodbsql_for="train-dict"),
        "train-dict")
    try:
        samples = sample_states(storage.shared.backend, storage.shared.codec, args.samples)
    finally:
        storage.close()
    dictionary = train(samples, args.size)
    with open(args.output, "wb") as stream:
        stream.write(dictionary)
    print(f"{len(dictionary)} bytes of dictionary from {len(samples)} records written to"
          f" {args.output}; set compress-dict {args.output} (with compress zstd)")
    return 0
