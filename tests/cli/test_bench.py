"""zodbsql bench: every test at tiny sizes on MappingStorage and zodbsql SQLite; the
results folder holds what the table shows; a non-empty database is refused untouched."""
from __future__ import annotations

import csv
import hashlib
import json
import pathlib
import re
from typing import Any

import pytest
import transaction
import ZODB
import ZODB.FileStorage
from persistent.mapping import PersistentMapping

import zodbsql
from zodbsql.bench import contenders, display, runner, workloads
from zodbsql.cli.main import main

TINY = ["-n", "20", "-c", "1", "-r", "1", "--warmup", "0", "--large-objects", "60",
        "--pack-objects", "100", "--commits", "3"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, str]:
    out = tmp_path_factory.mktemp("bench") / "results"
    import io
    from contextlib import redirect_stdout
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = main(["bench", "--contender", "mappingstorage,sqlite", *TINY,
                     "--output", str(out)])
    assert code == 0, buffer.getvalue()
    return out, buffer.getvalue()


def test_every_test_runs_on_both_contenders(tiny_run: tuple[pathlib.Path, str]) -> None:
    out, _ = tiny_run
    document = json.loads((out / "results.json").read_text())
    done = {(r["contender"], r["test"]) for r in document["summary"]}
    assert done == {(c, t) for c in ("mappingstorage", "sqlite") for t in workloads.TESTS}
    for key in ("machine", "python", "libraries"):
        assert document["environment"][key]
    assert document["environment"]["libraries"]["ZODB"]
    sqlite = next(c for c in document["contenders"] if c["name"] == "sqlite")
    assert sqlite["versions"]["sqlite"]


def test_steamin_loads_nothing_and_sql_is_counted(tiny_run: tuple[pathlib.Path, str]) -> None:
    out, _ = tiny_run
    summary = json.loads((out / "results.json").read_text())["summary"]
    by = {(r["contender"], r["test"]): r for r in summary}
    for contender in ("mappingstorage", "sqlite"):
        assert by[contender, "steamin"]["loads"] == 0
        assert by[contender, "cold"]["loads"] >= 20
        assert by[contender, "add"]["sql_per_txn"] is None or contender == "sqlite"
    assert by["sqlite", "add"]["sql_per_txn"] > 0
    # Counted: a poll and loads; prefetch brings most objects along with a few loads.
    assert 2 <= by["sqlite", "cold"]["sql_per_txn"] < by["sqlite", "cold"]["loads"]
    assert "conflicts_resolved_per_s" in by["sqlite", "conflicts"]


def test_json_and_csv_hold_what_the_table_shows(tiny_run: tuple[pathlib.Path, str]) -> None:
    out, printed = tiny_run
    summary = json.loads((out / "results.json").read_text())["summary"]
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(summary)
    for row, item in zip(rows, summary):
        assert row["contender"] == item["contender"] and row["test"] == item["test"]
        assert float(row["value"]) == pytest.approx(item["value"])
    lines = display.table_rows(summary, ["mappingstorage", "sqlite"])
    for label, unit, cells in lines:
        shown = [line for line in printed.splitlines()
                 if re.match(rf"\W*{re.escape(label.strip())}\s", line.strip("│┃ "))]
        assert shown, f"{label} not in the printed table"
        for cell in cells:
            if cell:
                assert cell in shown[0]
    for item in summary:
        assert display.fmt(item["value"]) in printed


def test_charts_are_pngs(tiny_run: tuple[pathlib.Path, str]) -> None:
    out, _ = tiny_run
    for test in workloads.TESTS:
        assert (out / f"{test}.png").read_bytes()[:8] == PNG_MAGIC


def test_scaling_charts_and_compare(tmp_path: pathlib.Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "scaling"
    assert main(["bench", "--contender", "sqlite", "--tests", "add,hot", "-n", "10,30",
                 "-c", "1,2", "-r", "1", "--warmup", "0", "--btrees",
                 "--output", str(out)]) == 0
    for name in ("scaling-concurrency.png", "scaling-objects-per-txn.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert {(r["concurrency"], r["objects_per_txn"]) for r in summary} == {
        (1, 10), (1, 30), (2, 10), (2, 30)}
    capsys.readouterr()
    assert main(["bench", "compare", str(out / "results.json"), str(out / "results.json")]) == 0
    printed = capsys.readouterr().out
    assert printed.count("1.00x") == len(summary)


def _digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_database_with_data_is_refused_untouched(tmp_path: pathlib.Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    fs_path = tmp_path / "Data.fs"
    db = ZODB.DB(ZODB.FileStorage.FileStorage(str(fs_path)))
    with db.transaction() as conn:
        conn.root.precious = PersistentMapping(keep="me")
    db.close()
    sqlite_path = tmp_path / "Data.sqlite"
    db = zodbsql.open_db(f"sqlite://{sqlite_path}")
    with db.transaction() as conn:
        conn.root.precious = 1
    db.close()
    before = {p.name: _digest(p) for p in tmp_path.iterdir()}
    config = tmp_path / "bench.conf"
    config.write_text(f"""%import zodbsql
<zodb fs>
  <filestorage>
    path {fs_path}
  </filestorage>
</zodb>
<zodb sql>
  # zodbsql-bench: disposable
  <zodbsql>
    <sqlite3>
      path {sqlite_path}
    </sqlite3>
  </zodbsql>
</zodb>
""")
    before["bench.conf"] = _digest(config)
    assert main(["bench", "--config", str(config), *TINY, "--output",
                 str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "'fs' already holds data, left untouched" in err
    # Marked disposable, but --wipe is missing: refused too.
    found = contenders.from_config_text(config.read_text())
    assert [c.disposable for c in found] == [False, True]
    with pytest.raises(zodbsql.ConfigurationError, match="'sql' already holds data"):
        contenders.inspect(found[1], wipe=False)
    contenders.inspect(found[1], wipe=True)   # allowed: disposable and --wipe
    after = {p.name: _digest(p) for p in tmp_path.iterdir() if p.name != "out"}
    assert {k: v for k, v in after.items() if not k.startswith("Data.sqlite-")} == \
        {k: v for k, v in before.items() if not k.startswith("Data.sqlite-")}
    assert not (tmp_path / "out").exists()


def test_steamin_with_a_load_fails_loudly() -> None:
    unit: dict[str, Any] = {"start": 0.0, "end": 1.0, "objects": 10, "transactions": 1, "loads": 3,
            "statements": None, "extra": {}, "unit": "reader0"}
    with pytest.raises(runner.BenchFailure, match="steamin' loaded 3 objects"):
        runner.figure("steamin", [unit])


def test_unknown_test_and_contender(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--tests", "add,nope"]) == 2
    assert "unknown test(s) nope" in capsys.readouterr().err
    assert main(["bench", "--contender", "oracle", "--tests", "add"]) == 2
    assert "unknown contender 'oracle'" in capsys.readouterr().err


def test_help_mentions_blobs_and_how_figures_are_computed(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    assert "example" in text and "Blob tests are not there yet" in text
    assert "wall time from the release" in text
    transaction.abort()


def test_wipe_uses_a_disposable_database_and_profile_prepopulate(tmp_path: pathlib.Path) -> None:
    sqlite_path = tmp_path / "Data.sqlite"
    db = zodbsql.open_db(f"sqlite://{sqlite_path}")
    with db.transaction() as conn:
        conn.root.kept = 1
    db.close()
    config = tmp_path / "bench.conf"
    config.write_text(f"""%import zodbsql
<zodb sql>
  # zodbsql-bench: disposable
  <zodbsql>
    <sqlite3>
      path {sqlite_path}
    </sqlite3>
  </zodbsql>
</zodb>
""")
    out, profiles = tmp_path / "out", tmp_path / "profiles"
    assert main(["bench", "--config", str(config), "--wipe", "--tests", "add,steamin",
                 "-n", "10", "-c", "1", "-r", "1", "--warmup", "0", "--prepopulate", "30",
                 "--profile", str(profiles), "--output", str(out), "--no-charts"]) == 0
    assert sorted(p.name for p in profiles.iterdir()) == [
        "sql-add-c1-n10-r0-writer0.prof", "sql-steamin-c1-n10-r0-reader0.prof"]
    assert not list(out.glob("*.png"))
    db = zodbsql.open_db(f"sqlite://{sqlite_path}")
    with db.transaction() as conn:
        assert conn.root.kept == 1
        assert len(conn.root()["zodbsql-bench"]["prepopulated"]) == 30
    db.close()


@pytest.mark.parametrize("shortcut", ["postgresql", "mysql"])
def test_server_shortcuts_use_a_scratch_database_and_drop_it(
        shortcut: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.databases import BACKENDS
    if shortcut not in BACKENDS:
        pytest.skip(f"{shortcut} is not in ZODBSQL_TEST_BACKENDS")
    made: list[object] = []
    real = contenders.Servers.scratch_database

    def recording(self: contenders.Servers, options: object) -> object:
        made.append(real(self, options))
        return made[-1]
    monkeypatch.setattr(contenders.Servers, "scratch_database", recording)
    assert main(["bench", "--contender", shortcut, "--tests", "add,update", *TINY,
                 "--no-charts", "--output", str(tmp_path / "out")]) == 0
    assert "sql/txn" in capsys.readouterr().out
    (scratch,) = made
    # The bench's tables went with its scratch schema or database.
    with pytest.raises(zodbsql.ZodbsqlError):
        zodbsql.open_storage(scratch, create_schema=False)  # type: ignore[arg-type]


def test_hotspot_reports_retries_and_no_counter_without_a_server(
        tiny_run: tuple[pathlib.Path, str]) -> None:
    out, printed = tiny_run
    document = json.loads((out / "results.json").read_text())
    by = {(r["contender"], r["test"]): r for r in document["summary"]}
    for contender in ("mappingstorage", "sqlite"):
        row = by[contender, "hotspot"]
        assert row["unit"] == "transactions/s" and row["value"] > 0
        assert row["retries_per_commit"] >= 0
        assert row["deadlocks"] is None            # no server: shown as '-'
    run = next(r for r in document["runs"] if r["test"] == "hotspot")
    assert run["transactions"] == 3 and run["retried"] == {}   # -c 1: nothing to retry
    deadlock_line = next(line for line in printed.splitlines() if "deadlocks" in line)
    assert "server count" in deadlock_line and "-" in deadlock_line
    with open(out / "results.csv", newline="") as f:
        assert {"retries_per_commit", "deadlocks"} <= set(next(csv.DictReader(f)))


def test_hotspot_with_contention_is_exact(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    assert main(["bench", "--contender", "sqlite,mappingstorage", "--tests", "hotspot",
                 "-c", "3", "--commits", "15", "--hotspot-keys", "4", "-r", "2",
                 "--warmup", "0", "--no-charts", "--output", str(out)]) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert len(runs) == 4
    for run in runs:      # each run checked its own tree: 3 x 15 x 4 keys, exactly
        assert run["transactions"] == 45 and run["workers"] == 3
        assert run["retries"] == sum(run["retried"].values())
        assert run["retries_per_commit"] == pytest.approx(run["retries"] / 45)


def test_hotspot_verify_finds_lost_keys_and_the_bench_fails() -> None:
    import ZODB.MappingStorage
    db = ZODB.DB(ZODB.MappingStorage.MappingStorage())
    workloads.setup_database(db, 0)
    params = workloads.Params(concurrency=1, commits=2, hotspot_keys=3)
    unit = workloads.Unit("writer", 0, params)
    unit.connect(db)
    state = {"key": "t-0", "tag": "t"}
    workloads.hotspot_prepare(unit, state)
    assert workloads.hotspot_run(unit, state).transactions == 2
    assert workloads.hotspot_verify(unit, state) == []
    unit.tm.begin()
    tree = unit.container()["tree"]
    del tree[next(iter(tree.keys()))]         # a lost insert the Length still counts
    unit.tm.commit()
    assert workloads.hotspot_verify(unit, state) == [
        "the tree holds 5 keys, expected 6: 1 missing, 0 unexpected"]
    unit.close()
    db.close()

    found = contenders.from_config_text(contenders.MAPPINGSTORAGE.format(name="m"))[0]
    rnd = runner.Round(found, params, None, needs_readers=False)   # never started
    rnd.writer_hosts = [0]
    rnd.run = lambda test, rep, tag: [   # type: ignore[method-assign]
        {"start": 0.0, "end": 1.0, "objects": 2, "transactions": 2, "loads": None,
         "statements": None, "extra": {"retries": 0}, "unit": "writer0"}]
    rnd.verify = lambda test, tag: ["the Length is 5, expected 6"]  # type: ignore[method-assign]
    with pytest.raises(runner.BenchFailure,
                       match="hotspot on m left wrong data: the Length is 5, expected 6"):
        rnd.measure("hotspot", 0, "t")


@pytest.mark.parametrize("shortcut", ["postgresql", "mysql"])
def test_hotspot_reads_the_server_deadlock_counter(
        shortcut: str, tmp_path: pathlib.Path) -> None:
    from tests.databases import BACKENDS
    if shortcut not in BACKENDS:
        pytest.skip(f"{shortcut} is not in ZODBSQL_TEST_BACKENDS")
    out = tmp_path / "out"
    assert main(["bench", "--contender", shortcut, "--tests", "hotspot", "-c", "2",
                 "--commits", "5", "-r", "1", "--warmup", "0", "--no-charts",
                 "--output", str(out)]) == 0
    (row,) = json.loads((out / "results.json").read_text())["summary"]
    assert isinstance(row["deadlocks"], int) and row["deadlocks"] >= 0
