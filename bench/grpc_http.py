"""HTTP against gRPC on `simple`, with raw onnxruntime as the reference, in one run.

Serves examples/models, runs perf_analyzer on `simple` at each concurrency (default 1 and 16)
over HTTP, gRPC and gRPC streaming (`--streaming`), and measures raw onnxruntime on the same
model with the server backend's thread settings before and after the server runs (the drift
between the two says how noisy the machine was). Prints one table: infer/s, p50 and p99 per
protocol and concurrency, each row ÷ raw onnxruntime's best samples/s and ÷ its batch-1
calls/s (simple has no dynamic batching, so each request is one batch-1 execution), and
gRPC ÷ HTTP at each concurrency.

    export PYTHONPATH=$(tools/pyroot.sh)
    python3 bench/grpc_http.py                    # the real run (3 s windows, <= 6 trials)
    python3 bench/grpc_http.py --tiny             # smoke: 0.5 s windows, proves the chain
    python3 bench/grpc_http.py --out bench/results/grpc_http --concurrency 1 16

Writes OUT.json (rows, each with the perf_analyzer command), OUT.md (the tables) and OUT.png
(throughput against concurrency, latency against throughput) when --out is given.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inputs import input_json_for
from perfa import PerfAnalyzerError, find_perf_analyzer, run_perf_analyzer
from raw_ort import measure_raw
from report import add_ratio, markdown_table, plot, save_rows

from server import grpc_ready, serve

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples" / "models"
CACHE = HERE / ".cache"
MODEL = "simple"
RAW_BATCH_SIZES = (1, 2, 4, 8)

COLUMNS = (
    "protocol",
    "concurrency",
    "throughput",
    "p50_us",
    "p99_us",
    "server_queue_us",
    "server_compute_infer_us",
    "ratio_raw",
    "ratio_raw_b1",
    "ratio_http",
    "stable",
)


def measure_raw_reference(seconds: float) -> dict[str, Any]:
    raw = measure_raw(EXAMPLES / MODEL, batch_sizes=RAW_BATCH_SIZES, seconds_per_size=seconds)
    b1 = next(r for r in raw["rows"] if r["batch_size"] == 1)
    return {
        "best": float(raw["best"]["samples_per_s"]),
        "best_batch": int(raw["best"]["batch_size"]),
        "b1": float(b1["samples_per_s"]),
        "b1_p50_us": float(b1["p50_ms"]) * 1000.0,
        "b1_p99_us": float(b1["p99_ms"]) * 1000.0,
        "intra_op_threads": raw["intra_op_threads"],
        "rows": raw["rows"],
    }


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    pa = find_perf_analyzer()
    data = input_json_for(EXAMPLES / MODEL, CACHE / "inputs" / f"{MODEL}.json")
    windows: dict[str, Any] = {
        "measurement_interval_ms": args.interval_ms,
        "max_trials": args.trials,
        "stability_percentage": args.stability,
    }

    raw_before = measure_raw_reference(args.raw_seconds)
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    with serve(EXAMPLES) as srv:
        if not grpc_ready(srv, timeout=10.0):
            print("ERROR: the gRPC port does not answer ServerReady", file=sys.stderr)
            return 1
        runs: list[tuple[str, str, list[str]]] = [
            ("http", srv.http_url, []),
            ("grpc", srv.grpc_url, []),
        ]
        if args.stream:
            runs.append(("grpc", srv.grpc_url, ["--streaming"]))
        for protocol, url, extra in runs:
            label = protocol + ("-stream" if extra else "")
            for concurrency in args.concurrency:
                try:
                    row = run_perf_analyzer(
                        MODEL, url, protocol, concurrency, data, extra,
                        # perf_analyzer's --streaming needs its async mode.
                        use_async=bool(extra), perf_analyzer=pa, **windows,
                    )  # fmt: skip
                except PerfAnalyzerError as exc:
                    failures.append(f"{label} c={concurrency}: {exc}")
                    rows.append({"protocol": label, "concurrency": concurrency, "error": "failed"})
                    continue
                row["protocol"] = label
                rows.append(row)
    raw_after = measure_raw_reference(args.raw_seconds)

    # The reference is the mean of before and after; the drift says how noisy the run was.
    best = (raw_before["best"] + raw_after["best"]) / 2
    b1 = (raw_before["b1"] + raw_after["b1"]) / 2
    add_ratio(rows, best, key="ratio_raw")
    add_ratio(rows, b1, key="ratio_raw_b1")
    http = {r["concurrency"]: r for r in rows if r["protocol"] == "http" and "throughput" in r}
    for row in rows:
        base = http.get(row.get("concurrency"))
        if base and "throughput" in row and float(base["throughput"]) > 0:
            row["ratio_http"] = float(row["throughput"]) / float(base["throughput"])

    drift = abs(raw_after["best"] - raw_before["best"]) / max(raw_before["best"], 1e-9)
    reference = (
        f"raw onnxruntime on {MODEL} (intra_op_threads={raw_before['intra_op_threads']}): "
        f"best b{raw_before['best_batch']} {raw_before['best']:.0f} → "
        f"b{raw_after['best_batch']} {raw_after['best']:.0f} samples/s "
        f"(drift {drift:.0%}); batch 1: {raw_before['b1']:.0f} → {raw_after['b1']:.0f} "
        f"calls/s, p50 {raw_before['b1_p50_us']:.0f} µs, p99 {raw_before['b1_p99_us']:.0f} µs"
    )
    table = markdown_table(rows, [c for c in COLUMNS if any(c in r for r in rows)])
    print(table)
    print(reference)
    if args.tiny:
        print("(tiny windows: these figures prove the chain works, not speed)")
    if args.out is not None:
        save_rows(
            [*rows, {"raw_before": raw_before, "raw_after": raw_after}],
            args.out.with_suffix(".json"),
        )
        args.out.with_suffix(".md").write_text(
            f"# HTTP vs gRPC on {MODEL}\n\n{table}\n{reference}\n\nCommands:\n\n"
            + "".join(f"- `{r['command']}`\n" for r in rows if "command" in r)
        )
        measured = [r for r in rows if "throughput" in r]
        if measured:
            plot(
                measured,
                args.out.with_suffix(".png"),
                series=("protocol",),
                title=f"{MODEL}: HTTP vs gRPC",
                # No raw-ORT lines: on simple they sit ~100x above the server curves and
                # would flatten them; the ratios are in the table.
            )
    for failure in failures:
        print(f"FAILED perf_analyzer {failure}", file=sys.stderr)
    print(f"took {time.monotonic() - started:.0f}s")
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--interval-ms", type=int, default=3000)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--stability", type=float, default=20.0)
    parser.add_argument("--raw-seconds", type=float, default=2.0, help="per raw batch size")
    parser.add_argument(
        "--no-stream", dest="stream", action="store_false", help="skip gRPC --streaming"
    )
    parser.add_argument("--tiny", action="store_true", help="smoke run: tiny windows")
    parser.add_argument("--out", type=Path, help="write OUT.json, OUT.md and OUT.png")
    args = parser.parse_args(argv)
    if args.tiny:
        args.interval_ms, args.trials, args.stability, args.raw_seconds = 500, 4, 50.0, 0.3
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
