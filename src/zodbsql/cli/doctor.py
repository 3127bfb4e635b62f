"""Check a live zodbsql database and its server; every problem comes with a fix.

Connects as the storage would and reports the server version, the settings that matter
to zodbsql, the privileges it needs, the schema version and history mode, and then runs
the storage's own checks (store, load, conflicts, pack) in a scratch database beside the
real one, removed afterwards.  An empty database gets its schema, as on the storage's
first start.  Exit status 0 when healthy (warnings allowed unless
--strict), 1 when not.
"""
from __future__ import annotations

import argparse
import json

from zodbsql.backends.base.inspector import ERROR, OK, WARNING, Finding
from zodbsql.cli import common
from zodbsql.masking import mask_secrets
from zodbsql.storage import SQLStorage
from zodbsql.storage.selfcheck import run_checks

HELP = "check a database and its server's settings, with a fix for each problem"
EXAMPLE = ("example:\n  zodbsql doctor zope.conf#main --clients 4\n"
           "  zodbsql doctor zodbsql+postgresql://zodb@db/zodb --json")
MARKS = {OK: "ok     ", WARNING: "WARNING", ERROR: "ERROR  "}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("storage", metavar="STORAGE", help=common.STORAGE_HELP)
    parser.add_argument("--clients", type=int, default=4,
                        help="client processes expected to use the database (default: 4)")
    parser.add_argument("--no-checks", action="store_true",
                        help="skip the storage's own checks in a scratch database")
    parser.add_argument("--strict", action="store_true", help="warnings fail too")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def diagnose(spec: str, clients: int, checks: bool) -> list[Finding]:
    try:
        storage = common.require_zodbsql(
            common.open_storage(spec, zodbsql_for="doctor"), "doctor")
    except common.ConfigurationError:
        raise
    except Exception as exc:  # the storage can't even open: that is the finding
        return [Finding(ERROR, "open", f"{type(exc).__name__}: {mask_secrets(str(exc))}",
                        "fix the configuration or the server named in the error")]
    try:
        return diagnose_storage(storage, clients, checks)
    finally:
        storage.close()


def diagnose_storage(storage: SQLStorage, clients: int, checks: bool) -> list[Finding]:
    backend = storage.backend
    findings = [Finding(OK, "open", backend.describe())]
    conn = backend.connect()
    try:
        findings += backend.inspector.inspect(conn, clients)
    finally:
        conn.close()
    if checks:
        with backend.inspector.scratch() as scratch_options:
            findings += run_checks(scratch_options, storage.options)
    return findings


def run(args: argparse.Namespace) -> int:
    findings = diagnose(args.storage, args.clients, not args.no_checks)
    failing = {ERROR, WARNING} if args.strict else {ERROR}
    healthy = not any(f.level in failing for f in findings)
    if args.json:
        print(json.dumps({"healthy": healthy, "findings": [f.as_dict() for f in findings]},
                         indent=2))
    else:
        for f in findings:
            fix = f"\n          fix: {f.fix}" if f.fix and f.level != OK else ""
            print(f"{MARKS[f.level]} {f.name}: {f.found}{fix}")
        print("healthy" if healthy else "NOT healthy")
    return 0 if healthy else 1
