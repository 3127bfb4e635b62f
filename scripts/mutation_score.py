"""Print the mutation score per module from mutmut's results and check every surviving
mutant against tests/mutation/equivalent.txt; also sets up a module's run for
scripts/mutate.

Results are read from each module's copies (.mutate/MODULE[@BACKEND]/mutants/**/*.meta)
and from a plain ``mutmut run`` in the tree (mutants/).  A survivor listed in equivalent.txt
(``mutant-name  reason``) cannot change behaviour and counts as accounted for; any other
survivor is printed and makes the exit status 1.  Mutants not checked yet are left out.

  mutation_score.py                          the scores
  mutation_score.py --survivors MODULE       MODULE's unlisted survivors, one a line
  mutation_score.py --unchecked MODULE       MODULE's mutants not run yet
  mutation_score.py --configure TOML MODULE BACKEND
                                             narrow TOML's [tool.mutmut] to MODULE
"""
from __future__ import annotations

import json
import pathlib
import re
import shlex
import sys
from collections import Counter

KILLED = {1, 3, 37}             # tests failed, pytest crashed, type check
TIMEOUT = {24, -24, 36, 152, 255}
ROOT = pathlib.Path(__file__).resolve().parent.parent
EQUIVALENT = ROOT / "tests" / "mutation" / "equivalent.txt"
SELECTION = ROOT / "tests" / "mutation" / "selection.txt"


def equivalents() -> dict[str, str]:
    found = {}
    for line in EQUIVALENT.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.strip().partition(" ")
            found[name] = reason.strip()
    return found


def results() -> dict[str, dict[str, int | None]]:
    """``{module file: {mutant: exit code or None}}``; a mutant checked in several copies
    (SQLite, then a server backend) counts as killed if any of them killed it."""
    metas = [*ROOT.glob(".mutate/*/mutants/src/**/*.py.meta"),
             *ROOT.glob("mutants/src/**/*.py.meta")]
    by_module: dict[str, dict[str, int | None]] = {}
    for meta in metas:
        module = str(meta).split("/mutants/src/", 1)[1][:-len(".meta")]
        codes = by_module.setdefault(module, {})
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if code is not None and (codes.get(name) is None or code in KILLED | TIMEOUT):
                codes[name] = code
            codes.setdefault(name, code)
    return by_module


def survivors(module: str, unchecked_only: bool = False) -> list[str]:
    """``module``'s mutants not killed and not listed as equivalent (only those not run
    yet with ``unchecked_only``)."""
    listed = equivalents()
    return [name for codes in results().values() for name, code in codes.items()
            if name.startswith(module + ".") and name not in listed
            and (code is None if unchecked_only else code not in KILLED | TIMEOUT)]


def selected_tests(module: str, backend: str) -> list[str]:
    """The pytest arguments selection.txt gives ``MODULE@BACKEND``, else ``MODULE``."""
    selections = {line.split(None, 1)[0]: shlex.split(line)[1:]
                  for line in SELECTION.read_text().splitlines()
                  if line.strip() and not line.startswith("#")}
    tests = selections.get(f"{module}@{backend}", selections.get(module))
    if tests is None:
        raise SystemExit(f"no test selection for {module} in {SELECTION}")
    return tests


def configure(toml: pathlib.Path, module: str, backend: str) -> None:
    """Point the copy's [tool.mutmut] at ``module``'s file and its selected tests (those
    for ``MODULE@BACKEND`` if selection.txt names some, else those for ``MODULE``)."""
    tests = selected_tests(module, backend)
    path = "src/" + module.replace(".", "/") + ".py"
    section = "\n".join([
        "[tool.mutmut]",
        'source_paths = ["src/"]',
        f"only_mutate = {json.dumps([path])}",
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]',
        "timeout_multiplier = 4.0",
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
    ]) + "\n"
    text = toml.read_text()
    text = re.sub(r"^\[tool\.mutmut\]\n(?:(?!\[).*\n?)*", "", text, flags=re.M)
    toml.write_text(text.rstrip("\n") + "\n\n" + section)


def main() -> int:
    listed = equivalents()
    unexplained: list[str] = []
    rows = []
    for module, codes in sorted(results().items()):
        tally: Counter[str] = Counter()
        for name, code in codes.items():
            if code is None:
                tally["unchecked"] += 1
            elif code in KILLED or code in TIMEOUT:
                tally["killed"] += 1
            elif name in listed:
                tally["equivalent"] += 1
            else:
                tally["survived"] += 1
                unexplained.append(name)
        checked = len(codes) - tally["unchecked"]
        if checked:
            rows.append((module, checked, tally))
    total: Counter[str] = Counter()
    print(f"{'module':45} {'checked':>7} {'killed':>6} {'equiv':>5} {'surv':>5} {'score':>6}")
    for module, checked, tally in rows:
        total.update(tally)
        total["checked"] += checked
        score = 100 * tally["killed"] / checked
        print(f"{module:45} {checked:7} {tally['killed']:6} {tally['equivalent']:5}"
              f" {tally['survived']:5} {score:5.1f}%")
    if total["checked"]:
        print(f"{'all':45} {total['checked']:7} {total['killed']:6} {total['equivalent']:5}"
              f" {total['survived']:5} {100 * total['killed'] / total['checked']:5.1f}%"
              f"  (killed + equivalent: "
              f"{100 * (total['killed'] + total['equivalent']) / total['checked']:.1f}%)")
    for name in unexplained:
        print(f"survived, not killed by any test nor listed as equivalent: {name}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    if sys.argv[1:2] in (["--survivors"], ["--unchecked"]):
        print("\n".join(survivors(sys.argv[2], sys.argv[1] == "--unchecked")))
        sys.exit(0)
    if sys.argv[1:2] == ["--configure"]:
        configure(pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4])
        sys.exit(0)
    sys.exit(main())
