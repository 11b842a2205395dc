"""Render benchmark rows (a list of dicts, e.g. from perfa.run_perf_analyzer) as a markdown
table and a PNG: throughput against concurrency, and latency against throughput.

    rows = [{"model": "simple", "protocol": "http", "config": "dyn", "concurrency": 8,
             "throughput": 2300.0, "p50_us": 3400, "p99_us": 9000}, ...]
    add_ratio(rows, raw_best_samples_per_s, key="ratio_raw")     # per-row infer/s ÷ reference
    print(markdown_table(rows))
    plot(rows, Path("bench/results/simple.png"), series=("model", "protocol", "config"))
    save_rows(rows, Path("bench/results/raw/run.json"))

CLI: python3 bench/report.py ROWS.json [--md OUT.md] [--png OUT.png] [--series model protocol]
Needs matplotlib for the PNG only (`pip install .[bench]`).
"""

from __future__ import annotations

import argparse
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
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="rows JSON -> markdown table and PNG")
    parser.add_argument("rows", type=Path, help="JSON list of row objects")
    parser.add_argument("--md", type=Path)
    parser.add_argument("--png", type=Path)
    parser.add_argument("--series", nargs="+", default=["model", "protocol", "config"])
    parser.add_argument("--columns", nargs="+")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    rows = load_rows(args.rows)
    table = markdown_table(rows, args.columns)
    print(table)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(table)
    if args.png:
        print(plot(rows, args.png, args.series, title=args.title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
