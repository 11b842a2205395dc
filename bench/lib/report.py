"""Render benchmark rows (a list of dicts, e.g. from perfa.run_perf_analyzer) as a markdown
table and a PNG: throughput against concurrency and latency against throughput (`plot`),
ratios with their intervals (`plot_intervals`, for time-shared results), or bars per row
(`plot_bars`).

    rows = [{"model": "simple", "protocol": "http", "config": "dyn", "concurrency": 8,
             "throughput": 2300.0, "p50_us": 3400, "p99_us": 9000}, ...]
    add_ratio(rows, raw_best_samples_per_s, key="ratio_raw")     # per-row infer/s ÷ reference
    print(markdown_table(rows))
    plot(rows, Path("bench/results/simple.png"), series=("model", "protocol", "config"))
    save_rows(rows, Path("bench/results/raw/run.json"))

Needs matplotlib for the PNG only (`pip install .[bench]`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Row = Mapping[str, Any]

DEFAULT_COLUMNS = (
    "model",
    "protocol",
    "config",
    "concurrency",
    "throughput",
    "p50_us",
    "p99_us",
    "server_queue_us",
    "server_compute_infer_us",
    "ratio_raw",
    "stable",
    "error",
)
HEADERS = {
    "throughput": "infer/s",
    "p50_us": "p50 µs",
    "p90_us": "p90 µs",
    "p95_us": "p95 µs",
    "p99_us": "p99 µs",
    "avg_us": "avg µs",
    "server_queue_us": "queue µs",
    "server_compute_infer_us": "infer µs",
    "server_compute_input_us": "input µs",
    "server_compute_output_us": "output µs",
    "ratio_raw": "÷ raw ORT",
    "samples_per_s": "samples/s",
}


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3f}"
    return str(value).replace("|", "\\|")


def markdown_table(rows: Sequence[Row], columns: Sequence[str] | None = None) -> str:
    """A GitHub markdown table. Default columns: those of DEFAULT_COLUMNS present in any row,
    in that order."""
    if columns is None:
        present = {k for r in rows for k in r}
        columns = [c for c in DEFAULT_COLUMNS if c in present]
    header = "| " + " | ".join(HEADERS.get(c, c) for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join([header, rule, *body]) + "\n"


def add_ratio(
    rows: Sequence[dict[str, Any]],
    reference: float,
    key: str = "ratio_raw",
    value_key: str = "throughput",
) -> None:
    """rows[i][key] = rows[i][value_key] / reference (e.g. ÷ raw onnxruntime's best)."""
    for row in rows:
        if reference > 0 and isinstance(row.get(value_key), int | float):
            row[key] = float(row[value_key]) / reference


def save_rows(rows: Sequence[Row], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(list(rows), indent=1, default=str))
    return path


def write_table(rows: Sequence[Row], out: Path, columns: Sequence[str], note: str) -> None:
    """OUT.json (the rows) and OUT.md (their table, then `note`); prints the table."""
    save_rows(rows, out.with_suffix(".json"))
    table = markdown_table(rows, columns)
    out.with_suffix(".md").write_text(f"{table}\n{note}\n")
    print(table)


def load_rows(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    if isinstance(data, dict):
        data = data.get("rows", [])
    return list(data)


def _series(rows: Sequence[Row], keys: Sequence[str]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = {}
    for row in rows:
        label = " / ".join(str(row[k]) for k in keys if k in row) or "all"
        groups.setdefault(label, []).append(row)
    return groups


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(
    rows: Sequence[Row],
    path: Path,
    series: Sequence[str] = ("model", "protocol", "config"),
    x: str = "concurrency",
    y: str = "throughput",
    latencies: Sequence[str] = ("p50_us", "p99_us"),
    title: str = "",
    reference: Mapping[str, float] | None = None,
) -> Path:
    """Two panels: `y` against `x` per series; and each latency (ms) against `y`.
    `reference`: {label: value} drawn as horizontal lines on the first panel (e.g. raw ORT)."""
    import matplotlib.ticker

    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = {"p50_us": "-", "p99_us": "--", "p90_us": ":", "p95_us": "-."}
    for index, (label, group) in enumerate(_series(rows, series).items()):
        color = f"C{index % 10}"
        points = sorted((float(r[x]), float(r[y]), r) for r in group if x in r and y in r)
        if not points:
            continue
        ax1.plot([p[0] for p in points], [p[1] for p in points], "o-", color=color, label=label)
        for lat in latencies:
            pts = [(p[1], float(p[2][lat]) / 1000) for p in points if lat in p[2]]
            if pts:
                ax2.plot(
                    [p[0] for p in pts], [p[1] for p in pts], marker="o",
                    linestyle=styles.get(lat, "-"), color=color,
                    label=f"{label} {lat.removesuffix('_us')}",
                )  # fmt: skip
    for name, value in (reference or {}).items():
        ax1.axhline(value, color="grey", linestyle=":", linewidth=1)
        ax1.annotate(name, (0, value), xycoords=("axes fraction", "data"), fontsize=8)
    ax1.set_xlabel(x)
    ax1.set_ylabel(HEADERS.get(y, y))
    ax1.set_title(f"{HEADERS.get(y, y)} vs {x}")
    if all(float(r[x]) > 0 for r in rows if x in r):
        ax1.set_xscale("log", base=2)
        ax1.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax1.set_ylim(bottom=0)
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=7)
    ax2.set_xlabel(HEADERS.get(y, y))
    ax2.set_ylabel("latency (ms)")
    ax2.set_title("latency vs " + HEADERS.get(y, y))
    ax2.set_ylim(bottom=0)
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return _save(plt, fig, path)


def parse_interval(text: Any) -> tuple[float, float] | None:
    """(low, high) from an interval cell ("0.947-0.974"), None when there is none."""
    if not isinstance(text, str) or "-" not in text:
        return None
    low, _, high = text.partition("-")
    try:
        return float(low), float(high)
    except ValueError:
        return None


def plot_intervals(
    rows: Sequence[Row],
    path: Path,
    label: str,
    panels: Sequence[tuple[str, str, str]],
    title: str = "",
) -> Path:
    """One panel per (value key, interval key, axis title): each row holding the value as a
    point labelled by `row[label]`, its interval as an error bar, and a line at 1. A panel
    no row has a value for is left out."""
    panels = [p for p in panels if any(isinstance(r.get(p[0]), int | float) for r in rows)]
    if not panels:
        raise ValueError("no row has a value to plot")
    plt = _pyplot()
    fig, axes = plt.subplots(
        1, len(panels), figsize=(6 * len(panels), 0.45 * len(rows) + 1.6), squeeze=False
    )
    for ax, (value_key, interval_key, axis_title) in zip(axes[0], panels, strict=True):
        shown = [r for r in rows if isinstance(r.get(value_key), int | float)]
        for index, row in enumerate(shown):
            value = float(row[value_key])
            found = parse_interval(row.get(interval_key))
            low, high = found if found else (value, value)
            # The cells are rounded to 3 decimals: a value may lie just outside its text.
            spread = [[max(0.0, value - low)], [max(0.0, high - value)]]
            ax.errorbar([value], [index], xerr=spread, fmt="o", color="C0", capsize=3)
        ax.set_yticks(range(len(shown)), [str(r[label]) for r in shown], fontsize=8)
        ax.axvline(1.0, color="grey", linestyle=":", linewidth=1)
        ax.invert_yaxis()
        ax.set_xlabel(axis_title)
        ax.grid(True, axis="x", alpha=0.3)
    if title:
        fig.suptitle(title)
    return _save(plt, fig, path)


def plot_bars(
    rows: Sequence[Row],
    path: Path,
    label: str,
    values: Sequence[str],
    scale: float = 1.0,
    unit: str = "",
    title: str = "",
) -> Path:
    """Horizontal bars, one group per row (labelled by `row[label]`), one bar per key of
    `values` (times `scale`)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(rows) * max(1, len(values)) / 2 + 1.6))
    height = 0.8 / max(1, len(values))
    for series, key in enumerate(values):
        positions = [i + series * height for i in range(len(rows))]
        widths = [float(r.get(key) or 0.0) * scale for r in rows]
        ax.barh(positions, widths, height=height, label=key.removesuffix("_us"))
    ax.set_yticks(
        [i + height * (len(values) - 1) / 2 for i in range(len(rows))],
        [str(r[label]) for r in rows],
        fontsize=8,
    )
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return _save(plt, fig, path)
