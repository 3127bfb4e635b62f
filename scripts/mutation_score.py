"""Print the mutation score per module from mutmut's results (mutants/**/*.meta) and
check every surviving mutant against tests/mutation/equivalent.txt.

A survivor listed there (``mutant-name  reason``) cannot change behaviour and counts as
accounted for; any other survivor is printed and makes the exit status 1.  Mutants not
checked yet (a run limited to some modules) are left out of the score.
"""
from __future__ import annotations

import json
import pathlib
import sys
from collections import Counter

KILLED = {1, 3, 37}             # tests failed, pytest crashed, type check
TIMEOUT = {24, -24, 36, 152, 255}
ROOT = pathlib.Path(__file__).resolve().parent.parent
EQUIVALENT = ROOT / "tests" / "mutation" / "equivalent.txt"


def equivalents() -> dict[str, str]:
    found = {}
    for line in EQUIVALENT.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.strip().partition(" ")
            found[name] = reason.strip()
    return found


def main() -> int:
    listed = equivalents()
    unexplained: list[str] = []
    rows = []
    for meta in sorted((ROOT / "mutants" / "src").rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
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
            module = str(meta.relative_to(ROOT / "mutants" / "src"))[:-len(".meta")]
            rows.append((module, checked, tally))
    total = Counter()
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
    sys.exit(main())
