"""Mutation testing of the SQL text (scripts/sql_mutants.py makes the mutants): each
mutant is put into a copy of the tree and the module's tests from
tests/mutation/selection.txt run against it; prints every survivor that is not listed in
tests/mutation/equivalent.txt.

  .venv/bin/python scripts/mutate_sql.py MODULE              every SQL mutant of MODULE
  .venv/bin/python scripts/mutate_sql.py MODULE --survivors  again those not killed yet
  .venv/bin/python scripts/mutate_sql.py MODULE --list       the mutants, not run

MODULE is dotted (zodbsql.backends.base.mover) or, for a file of SQL, the file's
dotted name without ``.sql`` (zodbsql.backends.postgresql.procedures_hf).  As with
scripts/mutate: ZODBSQL_TEST_BACKENDS picks the backend (the selection line
``MODULE@BACKEND`` if there is one), MUTATE_CHILDREN how many mutants run at once,
MUTATE_TMPDIR where the tests' files go (default /dev/shm), MUTATE_ONLY="NAME ..." runs
only those mutants (shell patterns: "*.HP_LOAD_*"), MUTATE_TESTS="pytest arguments"
replaces the selection.  Results are kept in .mutate/sql-MODULE[@BACKEND]/results.json,
by mutant name and its change: a mutant whose text changed since is run again.
"""
from __future__ import annotations

import concurrent.futures
import fnmatch
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import threading
import time

import sql_mutants
from mutation_score import ROOT, equivalents, selected_tests

PYTHON = pathlib.Path(os.environ.get("PYTHON", ROOT / ".venv" / "bin" / "python"))


def source_path(module: str) -> pathlib.Path:
    base = ROOT / "src" / module.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base.with_suffix(".sql")):
        if candidate.exists():
            return candidate
    raise SystemExit(f"no source file for {module} (looked for {base}.py and .sql)")


def tests_for(module: str, backend: str) -> list[str]:
    if os.environ.get("MUTATE_TESTS"):
        return shlex.split(os.environ["MUTATE_TESTS"])
    return selected_tests(module, backend)


def copy_tree(target: pathlib.Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["rsync", "-a", "--delete", "--exclude", "__pycache__",
                    "--exclude", ".hypothesis", "src", "tests", "scripts", "pyproject.toml",
                    "README.md", f"{target}/"], cwd=ROOT, check=True)


class Runner:
    def __init__(self, work: pathlib.Path, relative: pathlib.Path, tests: list[str],
                 backend: str) -> None:
        self.relative = relative
        self.tests = tests
        self.env = dict(os.environ, ZODBSQL_TEST_BACKENDS=backend,
                        ZODBSQL_MODEL_EXAMPLES=os.environ.get("ZODBSQL_MODEL_EXAMPLES", "10"))
        tmp = os.environ.get("MUTATE_TMPDIR") or ("/dev/shm" if os.path.isdir("/dev/shm")
                                                  else None)
        if tmp:
            self.env["TMPDIR"] = f"{tmp}/zodbsql-mutate"
            os.makedirs(self.env["TMPDIR"], exist_ok=True)
            os.chmod(self.env["TMPDIR"], 0o1777)   # private servers run as their own user
        self.work = work
        self.free: list[pathlib.Path] = []
        self.lock = threading.Lock()
        self.timeout = 600.0
        self.running: set[subprocess.Popen[bytes]] = set()

    def stop(self, signum: int, frame: object) -> None:
        """Stopped (Ctrl-C, kill): the tests running go too, then the copies' sources
        are left mutated, which the next run copies over."""
        for process in list(self.running):
            os.killpg(process.pid, signal.SIGKILL)
        os._exit(128 + signum)

    def add_copy(self, copy: pathlib.Path) -> None:
        copy_tree(copy)
        self.free.append(copy)

    def run(self, copy: pathlib.Path, timeout: float) -> tuple[str, float]:
        env = dict(self.env, PYTHONPATH=str(copy / "src"))
        started = time.monotonic()
        process = subprocess.Popen(
            [str(PYTHON), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", *self.tests],
            cwd=copy, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        self.running.add(process)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return "timeout", time.monotonic() - started
        finally:
            self.running.discard(process)
        seconds = time.monotonic() - started
        if code == 0:
            return "survived", seconds
        if code in (1, 3, 4):
            # Tests failed, pytest failed, or the tests could not start: a mutant that
            # breaks an import-time check of the SQL (4, a conftest that fails) is seen.
            return "killed", seconds
        return f"error {code}", seconds

    def check(self, mutant: sql_mutants.Mutant, original: str) -> tuple[str, float]:
        with self.lock:
            copy = self.free.pop()
        target = copy / self.relative
        try:
            target.write_text(mutant.apply(original))
            return self.run(copy, self.timeout)
        finally:
            target.write_text(original)
            with self.lock:
                self.free.append(copy)


def fingerprint(mutant: sql_mutants.Mutant) -> str:
    return json.dumps([[e.start, e.end, e.text] for e in mutant.edits])


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    module, mode = argv[0], (argv[1] if len(argv) > 1 else "")
    backend = os.environ.get("ZODBSQL_TEST_BACKENDS", "sqlite")
    path = source_path(module)
    relative = path.relative_to(ROOT)
    original = path.read_text()
    found = sql_mutants.mutants(module, str(relative), original)
    if mode == "--list":
        for mutant in found:
            print(f"{mutant.name}  {mutant.description}")
        return 0
    work = ROOT / ".mutate" / (f"sql-{module}" + ("" if backend == "sqlite" else f"@{backend}"))
    work.mkdir(parents=True, exist_ok=True)
    results_file = work / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    listed = equivalents()
    todo = [m for m in found
            if mode != "--survivors" or m.name not in listed and not (
                results.get(m.name, {}).get("change") == fingerprint(m)
                and results[m.name]["status"] in ("killed", "timeout"))]
    if os.environ.get("MUTATE_ONLY"):
        wanted = os.environ["MUTATE_ONLY"].split()
        todo = [m for m in todo if any(fnmatch.fnmatchcase(m.name, w) for w in wanted)]
    tests = tests_for(module, backend)
    runner = Runner(work, relative, tests, backend)
    signal.signal(signal.SIGINT, runner.stop)
    signal.signal(signal.SIGTERM, runner.stop)
    children = int(os.environ.get("MUTATE_CHILDREN", "1"))
    for index in range(children):
        runner.add_copy(work / f"copy{index}")
    copy = runner.free[0]
    imported = subprocess.run(
        [str(PYTHON), "-c", "import zodbsql; print(zodbsql.__file__)"], cwd=copy,
        env=dict(runner.env, PYTHONPATH=str(copy / "src")), capture_output=True, text=True,
        check=True).stdout.strip()
    if not imported.startswith(str(copy)):
        raise SystemExit(f"the copy's tests import {imported}, not the copy's source")
    print(f"{len(found)} SQL mutants of {relative}; {len(todo)} to run against: "
          f"{shlex.join(tests)} ({backend})", flush=True)
    status, seconds = runner.run(copy, 3600)
    if status != "survived":
        raise SystemExit(f"the unmutated tests fail ({status}): nothing to measure")
    runner.timeout = max(60.0, 4 * seconds)
    print(f"unmutated: {seconds:.0f} s; a mutant's timeout {runner.timeout:.0f} s", flush=True)
    with concurrent.futures.ThreadPoolExecutor(children) as pool:
        futures = {pool.submit(runner.check, m, original): m for m in todo}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            mutant = futures[future]
            status, seconds = future.result()
            results[mutant.name] = {"status": status, "change": fingerprint(mutant),
                                    "description": mutant.description}
            results_file.write_text(json.dumps(results, indent=1, sort_keys=True))
            print(f"[{done}/{len(todo)}] {status:8} {seconds:5.0f} s  {mutant.name}  "
                  f"{mutant.description}", flush=True)
    return report(found, results, listed)


def report(found: list[sql_mutants.Mutant], results: dict[str, dict[str, str]],
           listed: dict[str, str]) -> int:
    current = {m.name: results[m.name]["status"] for m in found
               if m.name in results and results[m.name]["change"] == fingerprint(m)}
    killed = [name for name, status in current.items() if status in ("killed", "timeout")]
    equivalent = [name for name in current if name not in killed and name in listed]
    left = [m for m in found if m.name in current and m.name not in killed
            and m.name not in listed]
    print(f"{len(found)} mutants, {len(current)} checked: {len(killed)} killed, "
          f"{len(equivalent)} listed equivalent, {len(left)} survived"
          f" ({100 * len(killed) / max(1, len(current)):.1f}% killed)")
    for mutant in left:
        print(f"survived: {mutant.name}  {mutant.description}")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
