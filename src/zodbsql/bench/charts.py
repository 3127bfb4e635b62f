"""PNG charts with matplotlib (Agg): one per test, and scaling charts when several
concurrencies or objects-per-transaction values were measured."""
from __future__ import annotations

import os
import re
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import EngFormatter  # noqa: E402


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write_all(directory: str, summary: list[dict[str, Any]]) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    summary = [r for r in summary if r["value"] is not None]   # failed tests: no bar
    written = []
    contenders = list(dict.fromkeys(r["contender"] for r in summary))
    colours = {c: plt.cm.tab10(i % 10) for i, c in enumerate(contenders)}
    for test in dict.fromkeys(r["test"] for r in summary):
        rows = [r for r in summary if r["test"] == test]
        written.append(_bars(directory, test, rows, contenders, colours))
    if any(r.get("soak") for r in summary):
        written.append(_soak(directory, summary, contenders, colours))
    if any(r.get("peak_rss_mb") for r in summary):
        written.append(_memory(directory, summary, contenders, colours))
    for axis, label in (("concurrency", "concurrency (worker processes)"),
                        ("objects_per_txn", "objects per transaction")):
        if len({r[axis] for r in summary}) > 1:
            written.append(_scaling(directory, axis, label, summary, contenders, colours))
    return written


def _bars(directory: str, test: str, rows: list[dict[str, Any]], contenders: list[str],
          colours: dict[str, Any]) -> str:
    groups = list(dict.fromkeys((r["concurrency"], r["objects_per_txn"]) for r in rows))
    present = [c for c in contenders if any(r["contender"] == c for r in rows)]
    width = 0.8 / max(len(present), 1)
    fig, ax = plt.subplots(figsize=(min(14.0, max(6.0, 1.6 + 1.1 * len(groups) * len(present))),
                                    4.5))
    for i, contender in enumerate(present):
        xs, ys = [], []
        for g, (c, n) in enumerate(groups):
            for r in rows:
                if r["contender"] == contender and (r["concurrency"], r["objects_per_txn"]) == (c, n):
                    xs.append(g + (i - (len(present) - 1) / 2) * width)
                    ys.append(r["value"])
        bars = ax.bar(xs, ys, width * 0.95, label=contender, color=colours[contender])
        ax.bar_label(bars, labels=[_short(y) for y in ys], padding=2, fontsize=9)
    ax.set_xticks(range(len(groups)), [f"c={c}, n={n}" for c, n in groups])
    unit = rows[0]["unit"]
    better = "lower is better" if rows[0].get("lower_is_better") else "higher is better"
    ax.set_ylabel(f"{unit} ({better})")
    _format_values(ax, rows[0])
    ax.set_title(f"{rows[0]['title']}")
    ax.margins(y=0.15)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = os.path.join(directory, f"{_slug(test)}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _soak(directory: str, summary: list[dict[str, Any]], contenders: list[str],
          colours: dict[str, Any]) -> str:
    """soak.png: loading rate, query rate and RSS over the run, one line per contender
    (and concurrency, when several were measured)."""
    rows = [r for r in summary if r.get("soak")]
    several = len({r["concurrency"] for r in rows}) > 1
    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for row in rows:
        series = row["soak"]
        label = row["contender"] + (f" c={row['concurrency']}" if several else "")
        for ax, key in zip(axes, ("commits_per_s", "queries_per_s", "rss_mb")):
            values = series[key]
            xs = [(i + 1) * series["slot_seconds"] for i, v in enumerate(values) if v is not None]
            ys = [v for v in values if v is not None]
            if ys:
                ax.plot(xs, ys, marker=".", label=label, color=colours[row["contender"]])
    for ax, title in zip(axes, ("loading: commits/s (10 documents each)", "queries/s",
                                "RSS of the largest worker (MB)")):
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("seconds since the start")
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.suptitle("soak: the same speed and memory at the end as at the start?")
    fig.tight_layout()
    path = os.path.join(directory, "soak-over-time.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _memory(directory: str, summary: list[dict[str, Any]], contenders: list[str],
            colours: dict[str, Any]) -> str:
    """memory.png: the peak RSS of each contender's largest worker process after each
    test (at the largest concurrency and size measured)."""
    c, n = max(r["concurrency"] for r in summary), max(r["objects_per_txn"] for r in summary)
    rows = [r for r in summary if (r["concurrency"], r["objects_per_txn"]) == (c, n)
            and r.get("peak_rss_mb")]
    tests = list(dict.fromkeys(r["test"] for r in rows))
    present = [x for x in contenders if any(r["contender"] == x for r in rows)]
    width = 0.8 / max(len(present), 1)
    fig, ax = plt.subplots(figsize=(min(16.0, max(6.0, 1.2 + 0.9 * len(tests) * len(present))),
                                    4.5))
    for i, contender in enumerate(present):
        points = [(t, r["peak_rss_mb"]) for t, test in enumerate(tests) for r in rows
                  if r["test"] == test and r["contender"] == contender]
        ax.bar([t + (i - (len(present) - 1) / 2) * width for t, _ in points],
               [mb for _, mb in points], width * 0.95, label=contender,
               color=colours[contender])
    ax.set_xticks(range(len(tests)), tests, rotation=30, ha="right")
    ax.set_ylabel("peak RSS of a worker process (MB)")
    ax.set_title(f"memory (c={c}, n={n}; lower is better)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = os.path.join(directory, "memory.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _scaling(directory: str, axis: str, label: str, summary: list[dict[str, Any]],
             contenders: list[str], colours: dict[str, Any]) -> str:
    tests = [t for t in dict.fromkeys(r["test"] for r in summary)]
    cols = min(3, len(tests))
    rows_n = (len(tests) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 3.6 * rows_n), squeeze=False)
    other = "objects_per_txn" if axis == "concurrency" else "concurrency"
    for ax, test in zip(axes.flat, tests):
        rows = [r for r in summary if r["test"] == test]
        fixed = max(r[other] for r in rows)   # one line per contender at one value of the other
        for contender in contenders:
            points = sorted((r[axis], r["value"]) for r in rows
                            if r["contender"] == contender and r[other] == fixed)
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                        label=contender, color=colours[contender])
        ax.set_title(f"{rows[0]['title']} ({'n' if other == 'objects_per_txn' else 'c'}={fixed})",
                     fontsize=10)
        ax.set_xlabel(label, fontsize=9)
        ax.set_ylabel(rows[0]["unit"], fontsize=9)
        _format_values(ax, rows[0])
        values = sorted({r[axis] for r in rows})
        if axis == "objects_per_txn":
            ax.set_xscale("log")
        ax.set_xticks(values, [str(v) for v in values])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tests):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    # One row under the title, clear of every subplot.
    fig.suptitle(f"figures vs {label}", y=0.995)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.975),
               ncol=min(len(labels), 6), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path = os.path.join(directory, f"scaling-{_slug(axis)}.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _format_values(ax: Any, row: dict[str, Any]) -> None:
    """Rates as 12 k / 1.5 M; seconds as plain numbers (no "400 m" for 0.4 s)."""
    if not row.get("lower_is_better"):
        ax.yaxis.set_major_formatter(EngFormatter())
    ax.set_ylim(bottom=0)


def _short(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"
