"""scripts/sql_mutants.py: the SQL mutants scripts/mutate_sql.py runs are the changes
their names say, and each leaves a module Python can still import."""
from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    path = ROOT / "scripts" / "sql_mutants.py"
    spec = importlib.util.spec_from_file_location("sql_mutants", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sql_mutants"] = module
    spec.loader.exec_module(module)
    return module


sql_mutants = _load()

SAMPLE = '''"""Not SQL: WHERE a = b in a docstring is left alone."""
LOAD = ("SELECT tid FROM object_state WHERE zoid = %s AND tid <= %s"
        " ORDER BY tid DESC LIMIT 1")
GONE = "DELETE FROM object_state WHERE zoid IN (SELECT zoid FROM temp_store WHERE state IS NULL)"
MESSAGE = "a = b is not SQL"


def newest(table):
    return f"SELECT MAX(tid) FROM {table} WHERE tid > %s"
'''


def _changed(source: str, module: str = "m", path: str = "m.py") -> dict[str, str]:
    return {m.name: m.apply(source) for m in sql_mutants.mutants(module, path, source)}


def test_the_changes_of_a_module_of_constants() -> None:
    changed = _changed(SAMPLE)
    texts = set(changed.values())
    assert all(name.startswith(("m.LOAD__sql_", "m.GONE__sql_", "m.newest__sql_"))
               for name in changed)
    expected = [
        'WHERE zoid <> %s AND tid <= %s"',
        'WHERE zoid = %s OR tid <= %s"',
        'WHERE zoid = %s AND tid < %s"',
        'WHERE (zoid = %s OR 1 = 1) AND tid <= %s"',
        'WHERE zoid = %s AND (tid <= %s OR 1 = 1)"',
        '" ORDER BY tid ASC LIMIT 1"',
        "WHERE zoid NOT IN (SELECT",
        "WHERE (zoid IN (SELECT zoid FROM temp_store WHERE state IS NULL) OR 1 = 1)",
        "WHERE (state IS NULL OR 1 = 1))",
        "WHERE state IS NOT NULL)",
        'f"SELECT MIN(tid) FROM {table}',
        "WHERE tid >= %s",
    ]
    for fragment in expected:
        assert [t for t in texts if fragment in t], fragment
    # Each mutant is one change; the docstring and the message are never changed.
    assert len(texts) == len(changed)
    assert all("a = b" in text and "WHERE a = b in a docstring" in text for text in texts)


def test_an_update_assigns_without_being_mutated_and_its_condition_is() -> None:
    source = 'BUMP = "UPDATE gone_row SET last_seq = last_seq + 1 WHERE zoid = %s"\n'
    texts = list(_changed(source).values())
    assert 'SET last_seq = last_seq - 1 WHERE' in "".join(texts)
    assert not [t for t in texts if "last_seq <> last_seq" in t]
    assert [t for t in texts if "WHERE zoid <> %s" in t]


def test_a_file_of_sql_keeps_its_comments_and_makes_a_condition_true() -> None:
    source = ("-- WHERE x = 1 in a comment\n"
              "CREATE FUNCTION f() RETURNS void AS $$ BEGIN\n"
              "  IF NOT FOUND THEN DELETE FROM t WHERE a < 3; END IF;\n"
              "END $$ LANGUAGE plpgsql;\n")
    texts = list(_changed(source, "m.f", "f.sql").values())
    assert all(text.startswith("-- WHERE x = 1 in a comment\n") for text in texts)
    assert [t for t in texts if "IF (NOT FOUND OR 1 = 1) THEN" in t]
    assert [t for t in texts if "IF FOUND THEN" in t]
    assert [t for t in texts if "WHERE a <= 3;" in t]


@pytest.mark.parametrize("path", sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "src" / "zodbsql" / "backends").rglob("*.py")))
def test_every_mutant_of_a_backend_is_still_python(path: str) -> None:
    source = (ROOT / path).read_text()
    for mutant in sql_mutants.mutants("m", path, source):
        compile(mutant.apply(source), path, "exec")


def test_a_between_keeps_its_and() -> None:
    source = 'PICK = "SELECT zoid FROM t WHERE tid BETWEEN %s AND %s AND zoid > 0"\n'
    texts = list(_changed(source).values())
    assert [t for t in texts if "WHERE (tid BETWEEN %s AND %s OR 1 = 1) AND zoid" in t]
    assert [t for t in texts if "BETWEEN %s AND %s OR zoid > 0" in t]
    assert not [t for t in texts if "BETWEEN %s OR %s" in t]
    assert not [t for t in texts if "AND (%s OR 1 = 1)" in t]


def test_a_shift_is_not_a_comparison() -> None:
    source = 'WINDOW = "SELECT 60::BIGINT << 32, 1 >> 2 FROM t WHERE a < 3"\n'
    texts = list(_changed(source).values())
    assert [t for t in texts if "WHERE a <= 3" in t]
    assert all("60::BIGINT << 32, 1 >> 2" in t for t in texts)
