"""Smoke test of the bench tooling, well under a minute: serve examples/models, run
perf_analyzer on `simple` over HTTP and gRPC at concurrency 1 with tiny windows, run raw
onnxruntime on the same model, and print one table with the ratio.

    python -m bench run smoke [--png OUT.png] [--json OUT]

Exit status: 0 when every part that could run ran (perf_analyzer missing or a branch without
gRPC is reported as SKIPPED), 1 when perf_analyzer failed against the server.
These figures come from tiny windows on shared cores: they prove the tools work, not speed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.lib.inputs import input_json_for
from bench.lib.models import CACHE, EXAMPLES
from bench.lib.perfa import (
    PerfAnalyzerError,
    PerfAnalyzerUnavailable,
    find_perf_analyzer,
    run_perf_analyzer,
)
from bench.lib.raw_ort import measure_raw
from bench.lib.report import add_ratio, markdown_table, plot, save_rows
from bench.lib.server import grpc_ready, serve

PROG = "python -m bench run smoke"
# Tiny windows: 500 ms, at most 4 trials, 50 % stability.
TINY_INTERVAL_MS, TINY_TRIALS, TINY_STABILITY = 500, 4, 50.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--png", type=Path, help="also write a plot")
    parser.add_argument("--json", type=Path, help="also write the rows")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1])
    args = parser.parse_args(argv)
    started = time.monotonic()
    failures: list[str] = []
    rows: list[dict[str, Any]] = []

    try:
        pa: tuple[str, dict[str, str]] | None = find_perf_analyzer()
    except PerfAnalyzerUnavailable as exc:
        print(f"SKIPPED perf_analyzer: {exc}", file=sys.stderr)
        pa = None

    data = input_json_for(EXAMPLES / "simple", CACHE / "inputs" / "simple.json")
    if pa is not None:
        with serve(EXAMPLES) as srv:
            protocols = [("http", srv.http_url)]
            if grpc_ready(srv, timeout=3.0):
                protocols.append(("grpc", srv.grpc_url))
            else:
                print("SKIPPED grpc: the gRPC port does not answer ServerReady", file=sys.stderr)
            for protocol, url in protocols:
                for concurrency in args.concurrency:
                    try:
                        row = run_perf_analyzer(
                            "simple", url, protocol, concurrency, data,
                            measurement_interval_ms=TINY_INTERVAL_MS, max_trials=TINY_TRIALS,
                            stability_percentage=TINY_STABILITY, perf_analyzer=pa,
                        )  # fmt: skip
                    except PerfAnalyzerError as exc:
                        failures.append(f"{protocol} c={concurrency}: {exc}")
                        continue
                    row["config"] = "examples"
                    rows.append(row)

    raw = measure_raw(EXAMPLES / "simple", batch_sizes=(1, 8), seconds_per_size=0.5)
    best = raw["best"]
    add_ratio(rows, float(best["samples_per_s"]))
    print(markdown_table(rows))
    print(
        f"raw onnxruntime (simple, intra_op_threads={raw['intra_op_threads']}): "
        + ", ".join(f"b{r['batch_size']} {r['samples_per_s']:.0f}/s" for r in raw["rows"])
        + f"; best b{best['batch_size']}"
    )
    if args.json:
        save_rows(rows, args.json)
    if args.png and rows:
        plot(rows, args.png, series=("model", "protocol"), title="smoke: simple")
    for failure in failures:
        print(f"FAILED perf_analyzer {failure}", file=sys.stderr)
    print(f"smoke took {time.monotonic() - started:.1f}s")
    return 1 if failures else 0
