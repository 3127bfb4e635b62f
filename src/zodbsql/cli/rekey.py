"""Re-encrypt every record and blob chunk (database layout) that is not under the
storage's current key id (key-id), while the site runs.

STORAGE must name the keys (key-file or key-env, and key-id): in its URL's query or its
ZConfig section.  Each batch is its own short transaction, so writers keep going; a
killed run is resumed by running it again (records already under the current key are
skipped).  Keep the old key configured until it ends.
"""
from __future__ import annotations

import argparse

from zodbsql.atrest.rekey import RekeyProgress, rekey
from zodbsql.cli import common

HELP = "re-encrypt every record and blob chunk not under the current key id"
EXAMPLE = ("example:\n  zodbsql rekey 'sqlite:///var/Data.sqlite"
           "?key_file=/etc/zodbsql/keys&key_id=k2'\n  zodbsql rekey zope.conf#main --batch 200")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("storage", metavar="STORAGE", help=common.STORAGE_HELP)
    parser.add_argument("--batch", type=int, default=500, metavar="N",
                        help="records re-encrypted per transaction (default: 500)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if args.batch < 1:
        raise common.ConfigurationError(f"--batch must be at least 1, got {args.batch}")
    storage = common.require_zodbsql(
        common.open_storage(args.storage, must_exist=True, zodbsql_for="rekey"), "rekey")
    try:
        with common.progress_bar(args.quiet) as bar:
            states = bar.add_task("records", total=None, rate="")
            chunks = bar.add_task("blob chunks", total=None, rate="")

            def progress(done: RekeyProgress) -> None:
                bar.update(states, completed=done.states, total=done.states_total,
                           rate=f"{done.states_rewritten} re-encrypted")
                bar.update(chunks, completed=done.chunks, total=done.chunks_total,
                           rate=f"{done.chunks_rewritten} re-encrypted")
            done = rekey(storage.shared.backend, storage.shared.codec, args.batch, progress,
                         storage.shared.options.commit_lock_timeout)
    finally:
        storage.close()
    assert storage.shared.codec.keys is not None
    print(f"{done.states_rewritten} of {done.states} records and {done.chunks_rewritten} of"
          f" {done.chunks} blob chunks re-encrypted: all under key id"
          f" {storage.shared.codec.keys.current!r}")
    return 0
