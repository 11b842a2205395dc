"""Mixed priority: high-priority requests at a low rate while low-priority clients saturate
the server, and each level's p50 and p99 under three configurations.

The high level sends an open-loop `--high-rate` (default 5 % of what the low class alone
gets through, measured first), the low level `--low-concurrency` closed-loop clients (the
load generator is bench/lib/loadgen.py: perf_analyzer cannot send a priority or mix
classes). Configurations: `fifo` (no priority levels), `priority` (levels, static batching)
and `priority+adaptive` (levels, adaptive batching, the high level's latency budget set to
`--high-budget-us`, by default four unbatched executions as raw onnxruntime measured them in
this run).

Why four: with one slot an execution cannot be interrupted, so a high request's floor is
one low-priority execution it may arrive just behind plus its own, each slower under this
load than alone; then transport, and the event loop serving the low-priority clients and
the load generator sharing the cores. Three executions left too little of that for the
p99 to hold (bench/RESULTS.md).

The configurations run one after another: the low level's throughput is not a comparison.

    python -m bench run priority --out bench/results/priority
    python -m bench run priority --out /tmp/p --quick                 # a smoke run

Writes OUT.json, OUT.md and OUT.png (`--from-json OUT.json` renders the last two again).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.lib.inputs import make_sample, specs_from_config
from bench.lib.loadgen import LoadClass, batched, run_load
from bench.lib.models import CACHE, Batching, RepoOptions, ensure_model, make_repo
from bench.lib.raw_ort import measure_raw
from bench.lib.report import load_rows, markdown_table, plot_bars, save_rows
from bench.lib.server import grpc_ready, serve
from bench.lib.variants import ADAPTIVE, SHORT

PROG = "python -m bench run priority"


def mixed_priority(
    model: str,
    protocols: Sequence[str],
    duration_s: float,
    high_rate: float | None,
    high_budget_us: int | None,
    low_concurrency: int,
    raw_seconds: float,
) -> list[dict[str, Any]]:
    """High priority at a low rate while low priority saturates; one row per level and
    configuration, with the high level's budget next to its p99."""
    mbs = ensure_model(model).default_max_batch_size
    raw = measure_raw(ensure_model(model).onnx_path, (1, 8), raw_seconds)
    unbatched_us = float(raw["rows"][0]["p50_ms"]) * 1000
    rate = high_rate
    budget = high_budget_us or int(4 * unbatched_us)
    levels = Batching(priority_levels=2, default_priority_level=2)
    configs = {
        "fifo": RepoOptions(max_batch_size=mbs, batching=Batching()),
        "priority": RepoOptions(max_batch_size=mbs, batching=levels),
        "priority+adaptive": RepoOptions(
            max_batch_size=mbs,
            batching=levels,
            params={**ADAPTIVE, "adaptive_latency_budget_us.1": str(budget)},
        ),
    }
    rows: list[dict[str, Any]] = []
    for name, options in configs.items():
        repo = make_repo(CACHE / "repos" / f"mixed_{SHORT.get(model, model)}_{name}", model,
                         options=options)  # fmt: skip
        sample = batched(make_sample(specs_from_config(repo / model), seed=0))
        with serve(repo) as srv:
            for protocol in protocols:
                if protocol == "grpc" and not grpc_ready(srv, 3.0):
                    print(f"[mixed {name}] SKIPPED grpc: port does not answer", file=sys.stderr)
                    continue
                url = srv.grpc_url if protocol == "grpc" else srv.http_url
                if rate is None:
                    # 5 % of what the low class alone gets through this server and client.
                    alone = LoadClass("low", concurrency=low_concurrency, priority=2)
                    calibration = run_load(url, protocol, model, sample, [alone],
                                           max(2.0, duration_s / 4))  # fmt: skip
                    rate = max(1.0, round(0.05 * float(calibration[0]["throughput"]), 1))
                    print(f"[mixed] high-priority rate: {rate}/s", file=sys.stderr)
                classes = [
                    LoadClass("high", rate=rate, priority=1),
                    LoadClass("low", concurrency=low_concurrency, priority=2),
                ]
                for row in run_load(url, protocol, model, sample, classes, duration_s):
                    row.update(
                        {
                            "model": model,
                            "config": name,
                            "protocol": protocol,
                            "high_rate": rate,
                            "high_budget_us": budget if name == "priority+adaptive" else None,
                            "unbatched_p50_us": unbatched_us,
                        }
                    )
                    rows.append(row)
                    print(
                        f"[mixed {name}] {protocol} {row['class']}: "
                        f"{row['throughput']:.1f}/s p50 {row.get('p50_us', 0):.0f} µs "
                        f"p99 {row.get('p99_us', 0):.0f} µs errors {row['errors']}",
                        file=sys.stderr,
                    )
    return rows


COLUMNS = (
    "model",
    "protocol",
    "config",
    "class",
    "priority",
    "throughput",
    "p50_us",
    "p99_us",
    "high_rate",
    "high_budget_us",
    "unbatched_p50_us",
    "errors",
)


def write_results(rows: Sequence[dict[str, Any]], out: Path, note: str) -> None:
    """OUT.json (the rows), OUT.md (their table and `note`) and OUT.png (p50 and p99 per
    configuration and level)."""
    save_rows(rows, out.with_suffix(".json"))
    table = markdown_table(rows, COLUMNS)
    out.with_suffix(".md").write_text(f"## Mixed priority\n\n{table}\n{note}\n")
    print(table)
    labelled = [
        {**r, "label": f"{r['protocol']} {r['config']} {r['class']}"} for r in rows if "p99_us" in r
    ]
    if labelled:
        plot_bars(
            labelled,
            out.with_suffix(".png"),
            label="label",
            values=("p50_us", "p99_us"),
            scale=1e-3,
            unit="latency (ms)",
            title=f"mixed priority: {rows[0]['model']}",
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="path prefix for the results")
    parser.add_argument("--model", default="resnet18_like")
    parser.add_argument("--protocol", nargs="+", default=["http", "grpc"])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per configuration")
    parser.add_argument("--high-rate", type=float, help="high-priority requests/s")
    parser.add_argument("--high-budget-us", type=int, help="the high level's latency budget")
    parser.add_argument("--low-concurrency", type=int, default=32)
    parser.add_argument("--raw-seconds", type=float, default=2.0, help="raw onnxruntime, per size")
    parser.add_argument("--quick", action="store_true", help="tiny windows: smoke only")
    parser.add_argument(
        "--from-json", type=Path, metavar="ROWS_JSON",
        help="measure nothing: write OUT.md and OUT.png again from a run's OUT.json",
    )  # fmt: skip
    args = parser.parse_args(argv)
    command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
    if args.from_json is not None:
        rows = load_rows(args.from_json)
        write_results(rows, args.out, f"`{command}`: {args.from_json}, rendered again.")
        return 0
    duration, raw_seconds = args.duration, args.raw_seconds
    if args.quick:
        duration, raw_seconds = 3.0, 0.3
    started = time.monotonic()
    rows = mixed_priority(
        args.model,
        args.protocol,
        duration,
        args.high_rate,
        args.high_budget_us,
        args.low_concurrency,
        raw_seconds,
    )
    write_results(rows, args.out, f"`{command}`, {time.monotonic() - started:.0f} s.")
    return 0
