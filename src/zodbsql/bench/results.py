"""The results folder: results.json (everything) and results.csv (the summary), and
``compare`` of two results.json files."""
from __future__ import annotations

import csv
import datetime
import importlib.metadata
import json
import os
import platform
import sys
from typing import Any

from zodbsql.errors import ConfigurationError

CSV_FIELDS = ["contender", "test", "title", "unit", "concurrency", "objects_per_txn",
              "value", "median", "repetitions", "sql_per_txn", "server_sql_per_txn", "loads", "seconds",
              "conflicts_raised_per_s", "conflicts_resolved_per_s", "retries_per_commit",
              "deadlocks", "queries_per_s", "last_first", "rss_last_second", "rss_mb", "peak_rss_mb", "cache_mb", "lower_is_better", "failed"]
LIBRARIES = ["zodbsql", "ZODB", "persistent", "BTrees", "transaction", "ZEO", "RelStorage",
             "rich", "matplotlib"]


def default_output_dir() -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join("bench-results", stamp)


def environment() -> dict[str, Any]:
    libraries = {}
    for name in LIBRARIES:
        try:
            libraries[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "machine": platform.machine(), "cpus": os.cpu_count(),
                    "node": platform.node()},
        "python": {"version": sys.version.split()[0],
                   "implementation": platform.python_implementation()},
        "libraries": libraries,
    }


def write(directory: str, document: dict[str, Any]) -> tuple[str, str]:
    os.makedirs(directory, exist_ok=True)
    json_path = os.path.join(directory, "results.json")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=2, default=str)
    csv_path = os.path.join(directory, "results.csv")
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in document["summary"]:
            writer.writerow(row)
    return json_path, csv_path


def load(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read results {path}: {exc}") from None
    if "summary" not in document:
        raise ConfigurationError(f"{path} is not a zodbsql bench results.json")
    return document


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows present in both, with ratio = B / A (and whether B is better)."""
    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return (row["contender"], row["test"], row["concurrency"], row["objects_per_txn"])
    old = {key(r): r for r in a["summary"]}
    rows = []
    for row in b["summary"]:
        before = old.get(key(row))
        if before is None or not before["value"] or row["value"] is None:
            continue
        ratio = row["value"] / before["value"]
        better = ratio < 1 if row.get("lower_is_better") else ratio > 1
        rows.append({"contender": row["contender"], "test": row["test"],
                     "concurrency": row["concurrency"], "objects_per_txn": row["objects_per_txn"],
                     "unit": row["unit"], "a": before["value"], "b": row["value"],
                     "ratio": ratio, "better": better})
    return rows
