"""The storage shoot-out: compare ZODB storages on the same workloads.

With no arguments: zodbsql on the embedded SQLite default (history-preserving) against
FileStorage, in a temporary directory removed at the end; about two minutes (1 min 33 s
on the machine it was measured on).

Tests (--tests / --exclude; default: all but soak):
  add          new objects, committed (one transaction per worker)
  update       change every object written by add
  warm         another process reads them; storage caches as they are (each
               repetition begins with every worker caught up with the database, so
               its poll holds add's and update's changes, not the last pack's)
  cold         all caches cleared: a new DB and storage instance (a new zodbsql state
               cache), then read; with sqlite-redis or postgresql-redis the writer
               process filled the shared Redis level, and redis_hits counts what it
               served
  hot          pickle cache cleared, storage caches kept, then read
  restart      only when named: a reader reads its objects, its storage is closed and
               opened again (as a restarted process: every cache empty but a
               cache-persistent-dir file), then reads them again: objects/s, the
               first object's time (first_ms), the wait for the file's read-back
               and the state cache misses (db_loads); compare sqlite and sqlite-pcache
  steamin      everything in the pickle cache: storage load calls are counted and the
               bench fails if there is one
  readcurrent  readCurrent on every object, then a commit that must check them
  empty        empty transactions: a poll and two-phase commit with nothing stored
  conflicts    all workers increment a conflict-resolving counter (BTrees Length) and one
               that can't resolve: commits/s, conflicts raised/s and resolved/s
  hotspot      all workers insert --hotspot-keys fresh keys (default 10) into one shared
               OOBTree and bump one shared BTrees Length per transaction, retried on
               TransientError until it commits: commits/s, retries per commit and the
               server's deadlocks (PostgreSQL, MySQL); the totals are checked exactly
  large        one transaction of --large-objects objects (default 10,000) per worker
  pack         pack after dropping --pack-objects objects (default 100 x -n): seconds per
               100,000 objects (one worker, once per repetition)
  sparse       cold: read one child in 100 of a mapping of --sparse-objects children
               (default 10,000); prefetching what a state references must not hurt
  btree-walk   cold: iterate every item of an OOBTree of --walk-objects (default 100,000)
  soak         only when named: for --duration seconds (default 60) worker 0 loads
               documents into a catalog (OOBTree indexes and a Length), 10 per
               transaction, while the others query it; commits/s, queries/s and RSS per
               time slot (soak.png), the last tenth's loading rate over the first's and
               the last tenth's RSS over the second's; run once, not per repetition
Blobs are measured by `zodbsql blobspeed` (MB/s written and read for one blob).

A test that fails (a worker's error, wrong data) is recorded with its reason and the run
goes on; results.json is written at the end, and also on Ctrl-C or an error ("status"
says which).  When stdout is not a terminal, one line per finished measurement is
printed instead of the live table.

How figures are computed: workers are separate processes (multiprocessing, spawn) that
wait at a barrier and are released together; a figure is the total work of all workers
(objects, or transactions) divided by the wall time from the release to the last
worker's finish.  The table shows the best of the repetitions (--warmup runs are
dropped); results.json holds every run.  For zodbsql contenders, "sql/txn" is the
number of SQL statements sent during the test divided by its transactions; with
--server-statements, "server sql/txn" is the same counted on the wire, for every
PostgreSQL contender the bench creates (RelStorage's too).  A storage
that only one process can open (FileStorage, MappingStorage) runs its workers as
threads of one process.  With mappingstorage among the contenders (or --floor NAME),
a last table gives each other contender's microseconds per object beyond it: ZODB's
own work, the same for every storage, taken out.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from zodbsql.errors import ConfigurationError
from zodbsql.masking import mask_config, mask_secrets

#: The default --floor, when it runs: a dict in memory, the least a storage can cost.
FLOOR = "mappingstorage"
HELP = "the storage shoot-out: zodbsql vs FileStorage, ZEO, RelStorage ... (charts, JSON)"
EXAMPLE = """examples:
  zodbsql bench                                 # zodbsql SQLite vs FileStorage, ~2 minutes
  zodbsql bench --contender sqlite,sqlite-hf,zeo -n 100,1000 -c 1,2
  zodbsql bench --config shootout.conf --tests add,cold,hot -r 5 --warmup 1
  zodbsql bench compare bench-results/A/results.json bench-results/B/results.json

a --config file holds <zodb NAME> sections, as ZODB users write them:
  %import zodbsql
  <zodb sqlite>
    <zodbsql>
      <sqlite3>
        path /tmp/bench/Data.sqlite
      </sqlite3>
    </zodbsql>
  </zodb>
  <zodb zeo>
    # zodbsql-bench: disposable     (with --wipe: may be used although not empty)
    <zeoclient>
      server 127.0.0.1:8100
    </zeoclient>
  </zodb>"""


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas: {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive numbers: {text!r}")
    return values


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from zodbsql.bench.contenders import SHORTCUTS
    from zodbsql.bench.session import ALL_TESTS, DEFAULT_TESTS
    sub = parser.add_subparsers(dest="bench_command", metavar="compare")
    compare = sub.add_parser("compare", help="print the ratios B/A of two results.json files")
    compare.add_argument("a", help="results.json (the reference)")
    compare.add_argument("b", help="results.json (the new figures)")
    parser.add_argument("--config", metavar="FILE", action="append", default=[],
                        help="ZConfig file with <zodb NAME> sections, one per contender;"
                        " may be repeated (RelStorage's and zodbsql's <sqlite3> sections"
                        " can't share one file)")
    parser.add_argument("--contender", type=_names, action="extend", default=[],
                        metavar="NAME[,NAME]",
                        help=f"add a contender in a temporary directory: {', '.join(SHORTCUTS)}"
                        " (default without --config: sqlite,filestorage)")
    parser.add_argument("--tests", type=_names, metavar="T[,T]", default=None,
                        help=f"tests to run: {', '.join(ALL_TESTS)} (default: all but"
                        f" {', '.join(t for t in ALL_TESTS if t not in DEFAULT_TESTS)})")
    parser.add_argument("--exclude", type=_names, metavar="T[,T]", default=[],
                        help="tests to leave out")
    parser.add_argument("-n", "--objects", type=_ints, default=[1000], metavar="N[,N]",
                        help="objects per transaction; several values compare them"
                        " (default: %(default)s)")
    parser.add_argument("-c", "--concurrency", type=_ints, default=[2], metavar="C[,C]",
                        help="worker processes per test; several values compare them"
                        " (default: %(default)s)")
    parser.add_argument("--object-size", type=int, default=128, metavar="BYTES",
                        help="bytes of data in each object (default: %(default)s)")
    parser.add_argument("-r", "--repetitions", type=int, default=3,
                        help="measured runs of each test; the best is shown"
                        " (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="runs before the measured ones, not counted"
                        " (default: %(default)s)")
    parser.add_argument("--btrees", action="store_true",
                        help="keep the objects in an OOBTree instead of a PersistentMapping")
    parser.add_argument("--prepopulate", type=int, default=0, metavar="N",
                        help="first fill each database with N objects")
    parser.add_argument("--large-objects", type=int, default=10_000, metavar="N",
                        help="objects in the large transaction (default: %(default)s)")
    parser.add_argument("--pack-objects", type=int, default=None, metavar="N",
                        help="objects dropped before the pack (default: 100 x the largest -n,"
                        " at most 100,000)")
    parser.add_argument("--commits", type=int, default=20, metavar="N",
                        help="transactions per worker in empty, conflicts and hotspot"
                        " (default: %(default)s)")
    parser.add_argument("--hotspot-keys", type=int, default=10, metavar="N",
                        help="keys each hotspot transaction inserts (default: %(default)s)")
    parser.add_argument("--duration", type=float, default=60.0, metavar="SECONDS",
                        help="how long the soak test runs (default: %(default)s)")
    parser.add_argument("--soak-documents", type=int, default=0, metavar="N",
                        help="documents the soak's catalog holds before its timed run"
                        " (loaded 1,000 a transaction; default: %(default)s)")
    parser.add_argument("--sparse-objects", type=int, default=10_000, metavar="N",
                        help="children of the mapping the sparse test reads one in 100 of"
                        " (default: %(default)s)")
    parser.add_argument("--walk-objects", type=int, default=100_000, metavar="N",
                        help="items of the OOBTree btree-walk iterates (default: %(default)s)")
    parser.add_argument("--profile", metavar="DIR",
                        help="write a cProfile file per test and worker into DIR")
    parser.add_argument("--baseline", metavar="NAME",
                        help="the contender every other one is compared with, figure by"
                             " figure within a repetition (default: the first)")
    parser.add_argument("--floor", metavar="NAME",
                        help="the contender whose time per object is taken from each other"
                             " one's, repetition by repetition: what each storage itself"
                             " costs beyond it (default: mappingstorage when it runs)")
    parser.add_argument("--output", metavar="DIR",
                        help="results folder (default: ./bench-results/<timestamp>/)")
    parser.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    parser.add_argument("--server-statements", action="store_true",
                        help="count the statements each PostgreSQL contender (zodbsql and"
                        " RelStorage shortcuts) sends, on the wire through a relay of"
                        " its own: a 'server sql/txn' column beside zodbsql's own count;"
                        " the relay slows what goes through it, so compare seconds only"
                        " between relayed contenders")
    parser.add_argument("--wipe", action="store_true",
                        help="allow writing to (and packing) a configured database that"
                        " already holds data, if its <zodb> section is marked"
                        " '# zodbsql-bench: disposable'; otherwise such a database is"
                        " refused and left untouched")


def run(args: argparse.Namespace) -> int:
    if args.bench_command == "compare":
        return run_compare(args)
    # Ctrl-C: workers and the ZEO server get SIGINT too; the finally clauses stop what
    # is left and remove the temporary directory.  SIGTERM is handled the same way.
    signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    from zodbsql.bench import contenders, display, results, session
    from zodbsql.bench.workloads import Params

    tests = args.tests or list(session.DEFAULT_TESTS)
    unknown = [t for t in tests + args.exclude if t not in session.ALL_TESTS]
    if unknown:
        raise ConfigurationError(f"unknown test(s) {', '.join(unknown)}; choose from"
                                 f" {', '.join(session.ALL_TESTS)}")
    tests = [t for t in session.ALL_TESTS if t in tests and t not in args.exclude]
    if not tests:
        raise ConfigurationError("no test left to run")
    pack_objects = args.pack_objects or min(100 * max(args.objects), 100_000)
    plan = session.Plan(
        tests=tests, objects=args.objects, concurrency=args.concurrency,
        repetitions=max(1, args.repetitions), warmup=max(0, args.warmup),
        params=Params(object_size=args.object_size, btrees=args.btrees,
                      large_objects=args.large_objects, pack_objects=pack_objects,
                      commits=args.commits, hotspot_keys=max(1, args.hotspot_keys),
                      sparse_objects=max(1, args.sparse_objects),
                      duration=max(1.0, args.duration),
                      soak_documents=max(0, args.soak_documents),
                      walk_objects=max(1, args.walk_objects)),
        prepopulate=args.prepopulate, profile_dir=args.profile)
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    output = args.output or results.default_output_dir()
    with contenders.prepared(args.config, args.contender, args.wipe,
                             args.server_statements) as found:
        names = [c.name for c in found]
        baseline = args.baseline or names[0]
        if baseline not in names:
            raise ConfigurationError(f"--baseline {baseline} is not one of the contenders"
                                     f" ({', '.join(names)})")
        floor = args.floor or (FLOOR if FLOOR in names else None)
        if floor is not None and floor not in names:
            raise ConfigurationError(f"--floor {floor} is not one of the contenders"
                                     f" ({', '.join(names)})")
        for c in found:
            print(f"{c.name}: {c.description}" + (" (workers are threads of one process)"
                                                  if c.single_process else ""))
        view = display.LiveView(names, plan.steps(len(found)),
                                f"zodbsql bench: c={','.join(map(str, plan.concurrency))}"
                                f" n={','.join(map(str, plan.objects))}, best of"
                                f" {plan.repetitions}")
        # Every measurement is kept as it comes: Ctrl-C or an error still writes them.
        runs: list[dict[str, Any]] = []

        def keep(run: dict[str, Any]) -> None:
            runs.append(run)
            view.result(run)
        status = "complete"
        try:
            with view:
                session.execute(plan, found, keep, view.status)
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except BaseException as exc:
            status = f"stopped by an error: {mask_secrets(str(exc))}"
            raise
        finally:
            sizes = {c.name: contenders.database_size(c) for c in found}
            pairs = session.paired_ratios(runs, baseline)
            spent = session.beyond_floor(runs, floor) if floor is not None else []
            _write_results(args, output, plan, found, runs, status, sizes, pairs, spent)
        for table in (display.paired_table(pairs, names), display.floor_table(spent, names)):
            if table is not None:
                view.console.print(table)
        print("database size after the run: " + ", ".join(
            f"{name} {size / 1e6:.1f} MB" if size else f"{name} unknown"
            for name, size in sizes.items()))
    failed = session.failures(runs)
    for run in failed:
        print(f"zodbsql bench: {run['contender']} {run['test']} c={run['concurrency']}"
              f" n={run['objects_per_txn']} failed: {mask_secrets(run['failed']).strip()}",
              file=sys.stderr)
    print("figures: total work of all workers / wall time from their release to the last"
          " finish; best of the repetitions; the contenders take turns in each repetition,"
          " and the ratios are of figures of the same repetition")
    return 1 if failed else 0


def _write_results(args: argparse.Namespace, output: str, plan: Any, found: list[Any],
                   runs: list[dict[str, Any]], status: str,
                   sizes: dict[str, int | None], pairs: list[dict[str, Any]],
                   spent: list[dict[str, Any]]) -> None:
    """results.json, results.csv and the charts of what was measured (all of it, or
    what there was when the run was interrupted)."""
    from zodbsql.bench import charts, results, session
    summary = session.summarise(runs)
    document: dict[str, Any] = {
        "format": "zodbsql-bench/1",
        "status": status,
        "environment": results.environment(),
        "plan": session.plan_as_dict(plan),
        "contenders": [{"name": c.name, "description": c.description,
                        "storage_class": c.storage_class, "single_process": c.single_process,
                        "owned": c.owned, "versions": c.versions,
                        "database_size": sizes.get(c.name),
                        "config": mask_config(c.config_text) if c.owned else "(from --config)"}
                       for c in found],
        "summary": summary,
        # The baseline against each, repetition by repetition (they take turns).
        "paired": pairs,
        # Each contender's time per object beyond the floor's (--floor), likewise.
        "beyond_floor": spent,
        "runs": [{**run, "failed": mask_secrets(run["failed"])} if run.get("failed")
                 else run for run in runs],
    }
    json_path, csv_path = results.write(output, document)
    written = [] if args.no_charts or not summary else charts.write_all(output, summary)
    print(f"results ({status}): {json_path}, {csv_path}" +
          (f", {len(written)} charts" if written else "") + f" in {output}",
          file=sys.stderr if status != "complete" else sys.stdout)


def run_compare(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from zodbsql.bench import display, results
    a, b = results.load(args.a), results.load(args.b)
    rows = results.compare(a, b)
    if not rows:
        raise ConfigurationError("the two results have no test in common")
    table = Table(title=f"B / A   A = {args.a}   B = {args.b}", title_justify="left")
    for column in ("contender", "test", "c", "n", "unit", "A", "B", "B/A"):
        table.add_column(column, justify="right" if column in "cnAB/A" else "left")
    for row in rows:
        colour = "green" if row["better"] else "red"
        table.add_row(row["contender"], row["test"], str(row["concurrency"]),
                      str(row["objects_per_txn"]), row["unit"], display.fmt(row["a"]),
                      display.fmt(row["b"]), f"[{colour}]{row['ratio']:.2f}x[/{colour}]")
    Console().print(table)
    return 0
