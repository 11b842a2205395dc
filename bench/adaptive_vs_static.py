"""Adaptive batching head to head with the static settings (issue 5's acceptance figures).

For each model (`simple`, the ResNet-18-sized CNN) the configurations of bench/batching.py
(`off`, `static0`, `static`, `static3ms` on `simple`, `adaptive`) run side by side, one
server each, and are measured in rotating order over several rounds (bench/abba.py), so
that one noisy moment cannot decide a comparison that single sweep rows are too noisy to
settle:

* throughput at concurrency 32 (the static settings and `adaptive`): adaptive ÷ the best static
  median, and each ÷ raw onnxruntime's best from the same run;
* p50 at concurrency 1 (`off`, `adaptive`): adaptive ÷ unbatched.

c=1 and c=32 run on separate servers (`adaptive` has one of each), so that every server
measured at 32 has the same history. When one server measured both, adaptive carried its
c=1 history into c=32 and the static settings did not: in an A/B over HTTP that history
alone cost ~1-2 % at c=32.

Raw onnxruntime (bench/raw_ort.py, every batch size up to the model's maximum) runs right
before and right after each throughput measurement, with that server up and idle. Each
measurement's ratio is its throughput ÷ the mean of the two raw figures around it, at the
batch size whose median over the whole run is highest; the table gives the median ratio
and the lowest. Here the machine's speed drifts by 10-20 % over tens of seconds (raw
ResNet at batch 16, one call after another for a minute: 38-50 samples/s), so raw figures
taken minutes away from a measurement measured the drift as much as the server.

    export PYTHONPATH=$(tools/pyroot.sh)
    python3 bench/adaptive_vs_static.py --out bench/results/adaptive_vs_static
    python3 bench/adaptive_vs_static.py --out /tmp/a --quick --models simple   # smoke

`--shared-memory` makes perf_analyzer pass the tensors through system shared memory.
`--alone` starts a fresh server for each measurement with no other up, as raw onnxruntime
runs alone: with the four CNN servers up side by side, every configuration measured ~3 %
lower on this 2-core machine (0.92x raw against 0.95-0.96x alone, in runs an hour apart).
Writes OUT.json, OUT.md and OUT_rounds.json (every measurement, per server, in order).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from abba import Row, ServerSpec, compare, median
from batching import SHORT, variants
from inputs import input_json_for
from models import CACHE, ensure_model, make_repo
from perfa import PerfAnalyzerError, find_perf_analyzer, run_perf_analyzer
from raw_ort import DEFAULT_BATCH_SIZES, measure_raw
from report import write_table

from server import ServerProcess, grpc_ready

THROUGHPUT_AT = 32
LATENCY_AT = 1
THROUGHPUT_CONFIGS = ("static0", "static", "static3ms", "adaptive")
LATENCY_CONFIGS = ("off", "adaptive")
LATENCY = " c1"  # suffix of the servers that measure c=1 only


def run_model(
    model: str,
    protocols: Sequence[str],
    sessions: int,
    rounds: int,
    interval_ms: int,
    latency_interval_ms: int,
    raw_seconds: float,
    shared_memory: bool,
    alone: bool = False,
    rounds_out: dict[str, list[Row]] | None = None,
) -> list[dict[str, Any]]:
    """The table's rows for `model`; with `rounds_out`, also every measurement as taken,
    per server (for paired comparisons within a round)."""
    short = SHORT.get(model, model)
    chosen = {
        v.name.removesuffix(f"-{short}"): v
        for v in variants(model)
        if v.name.removesuffix(f"-{short}") in {*THROUGHPUT_CONFIGS, *LATENCY_CONFIGS}
    }
    specs: dict[str, ServerSpec] = {}
    data = CACHE / "inputs" / f"{model}.json"
    for name, variant in chosen.items():
        repo = make_repo(CACHE / "repos" / f"h2h_{variant.name}", model, options=variant.options)
        input_json_for(repo / model, data)
        # c=1 and c=32 on servers of their own, so that no server measured at 32 has
        # served c=1 first and every figure comes from a server with the same history.
        if name in THROUGHPUT_CONFIGS:
            specs[name] = ServerSpec(repo, variant.flags)
        if name in LATENCY_CONFIGS:
            specs[name + LATENCY] = ServerSpec(repo, variant.flags)
    tool = find_perf_analyzer()
    max_batch = ensure_model(model).default_max_batch_size
    sizes = tuple(b for b in DEFAULT_BATCH_SIZES if b <= max_batch)
    onnx_path = ensure_model(model).onnx_path

    def measure_raw_now() -> dict[int, float]:
        found = measure_raw(onnx_path, sizes, raw_seconds, warmup_calls=1)
        return {int(row["batch_size"]): float(row["samples_per_s"]) for row in found["rows"]}

    def measure(name: str, server: ServerProcess) -> Row:
        row: Row = {}
        protocols_up = [p for p in protocols if p != "grpc" or grpc_ready(server, 3.0)]
        latency = name.endswith(LATENCY)
        concurrency = LATENCY_AT if latency else THROUGHPUT_AT
        window = latency_interval_ms if latency else interval_ms
        for protocol in protocols_up:
            if not latency:
                # Raw onnxruntime right before and after every throughput measurement
                # (the server up and idle): the machine's speed drifts by 10-20 % over
                # tens of seconds here, so a ratio to raw figures taken minutes away
                # measures the drift as much as the server.
                row.setdefault(f"{protocol} raw before", measure_raw_now())
            url = server.grpc_url if protocol == "grpc" else server.http_url
            try:
                found = run_perf_analyzer(
                    model, url, protocol, concurrency, data,
                    measurement_interval_ms=window, max_trials=3,
                    stability_percentage=100, perf_analyzer=tool,
                    shared_memory="system" if shared_memory else "none",
                )  # fmt: skip
            except PerfAnalyzerError as exc:
                print(f"[{name}] {protocol} c={concurrency}: {exc}", file=sys.stderr)
                continue
            row[f"{protocol} c{concurrency} infer/s"] = float(found["throughput"])
            row[f"{protocol} c{concurrency} p50"] = float(found["p50_us"])
            if not latency:
                row[f"{protocol} raw after"] = measure_raw_now()
                following = protocols_up.index(protocol) + 1
                if following < len(protocols_up):  # the next protocol's "before"
                    row[f"{protocols_up[following]} raw before"] = row[f"{protocol} raw after"]
        return row

    results = compare(
        specs, sessions, rounds, measure, log=lambda line: print(line, file=sys.stderr),
        alone=alone,
    )  # fmt: skip
    if rounds_out is not None:
        rounds_out.update({f"{model} {name}": found for name, found in results.items()})
    return summarize(model, results, protocols, shared_memory)


def summarize(
    model: str, results: Mapping[str, Sequence[Row]], protocols: Sequence[str], shared_memory: bool
) -> list[dict[str, Any]]:
    """The table's rows from every measurement of one model, per server name."""
    # One protocol's "raw after" is the next one's "raw before": count each measurement
    # once (by content, so that rounds read back from OUT_rounds.json count alike).
    brackets = {tuple(sorted(r[k].items())): r[k] for name in THROUGHPUT_CONFIGS
                if name in results for r in results[name] for k in r if " raw " in k}  # fmt: skip
    raw_batch, raw, raw_low, raw_high = raw_figures(list(brackets.values()))
    chosen = [n for n in ("off", *THROUGHPUT_CONFIGS) if n in results or n + LATENCY in results]
    rows: list[dict[str, Any]] = []
    for protocol in protocols:
        key = f"{protocol} c{THROUGHPUT_AT} infer/s"
        throughput = {
            name: _median(results, name, key) for name in THROUGHPUT_CONFIGS if name in chosen
        }
        best_static = max(
            (v for k, v in throughput.items() if k != "adaptive" and v is not None), default=None
        )
        p50_key = f"{protocol} c{LATENCY_AT} p50"
        latency = {name: _median(results, name + LATENCY, p50_key) for name in LATENCY_CONFIGS}
        for name in chosen:
            measured = [r for r in results.get(name, []) if key in r]
            samples = [r[key] for r in measured]
            ratios = [bracketed_ratio(r, protocol, key, raw_batch) for r in measured]
            tp = throughput.get(name)
            p50, unbatched = latency.get(name), latency.get("off")
            row: dict[str, Any] = {
                "model": model,
                "protocol": protocol + (" +shm" if shared_memory else ""),
                "config": name,
                "c32 infer/s": tp,
                "c32 min": min(samples) if samples else None,
                "c32 max": max(samples) if samples else None,
                "÷ raw ORT": statistics.median(ratios) if ratios else None,
                "÷ raw min": min(ratios) if ratios else None,
                "÷ best static": tp / best_static if tp and best_static else None,
                "c1 p50 µs": p50,
                "c1 p50 ÷ off": p50 / unbatched if p50 and unbatched else None,
                "rounds": len(samples) or len(results.get(name + LATENCY, [])),
            }
            rows.append(row)
    for row in rows:
        row["raw best"] = raw
        row["raw batch"] = raw_batch
        row["raw min"] = raw_low
        row["raw max"] = raw_high
    return rows


def bracketed_ratio(row: Row, protocol: str, key: str, batch: int) -> float:
    """A throughput measurement ÷ raw onnxruntime at `batch`, the mean of the raw figures
    taken right before and right after it."""
    before = float(row[f"{protocol} raw before"][batch])
    after = float(row[f"{protocol} raw after"][batch])
    return float(row[key]) / ((before + after) / 2)


def raw_figures(measurements: Sequence[Mapping[int, float]]) -> tuple[int, float, float, float]:
    """(batch size, median samples/s, min, max) of raw onnxruntime at the batch size whose
    median over all measurements is highest. The median per size, not each measurement's
    best: the best of six noisy sizes would be biased upwards."""
    by_size: dict[int, list[float]] = {}
    for found in measurements:
        for size, value in found.items():
            by_size.setdefault(size, []).append(float(value))
    medians = {size: statistics.median(values) for size, values in by_size.items()}
    size = max(medians, key=lambda k: medians[k])
    values = by_size[size]
    return size, medians[size], min(values), max(values)


def _median(results: Mapping[str, Sequence[Row]], name: str, key: str) -> float | None:
    if name not in results or not any(key in r for r in results[name]):
        return None
    return median(results, name, key)


COLUMNS = (
    "model",
    "protocol",
    "config",
    "c32 infer/s",
    "c32 min",
    "c32 max",
    "÷ raw ORT",
    "÷ raw min",
    "÷ best static",
    "c1 p50 µs",
    "c1 p50 ÷ off",
    "rounds",
    "raw best",
    "raw batch",
    "raw min",
    "raw max",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="path prefix for the results")
    parser.add_argument("--models", nargs="+", default=["simple", "resnet18_like"])
    parser.add_argument("--protocol", nargs="+", default=["http", "grpc"])
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per session")
    parser.add_argument(
        "--interval-ms",
        type=int,
        default=3000,
        help="perf_analyzer window at c=32; the CNN needs ~12000: its requests complete in "
        "bursts of up to 31 every ~0.4 s, so a 3 s window counts them to within ~±4 %%",
    )
    parser.add_argument("--latency-interval-ms", type=int, default=3000, help="window at c=1")
    parser.add_argument("--shared-memory", action="store_true")
    parser.add_argument(
        "--alone",
        action="store_true",
        help="one server up at a time, fresh for each measurement (as raw onnxruntime runs "
        "alone); by default every configuration's server is up side by side",
    )
    parser.add_argument(
        "--raw-seconds", type=float, default=1.5, help="raw onnxruntime, per batch size"
    )
    parser.add_argument("--quick", action="store_true", help="tiny windows: smoke only")
    parser.add_argument(
        "--from-rounds",
        type=Path,
        help="measure nothing: summarise an earlier run's OUT_rounds.json again into OUT.*",
    )
    args = parser.parse_args(argv)
    command = " ".join(["python3 bench/adaptive_vs_static.py", *(argv or sys.argv[1:])])
    if args.from_rounds is not None:
        summary = resummarize(json.loads(args.from_rounds.read_text()), args.protocol,
                              args.shared_memory)  # fmt: skip
        source = f"the rounds of {args.from_rounds}, summarised"
        write_table(summary, args.out, COLUMNS, f"`{command}`: {source}.")
        return 0
    raw_seconds = args.raw_seconds
    if args.quick:
        args.sessions, args.rounds, raw_seconds = 1, 1, 0.3
        args.interval_ms = args.latency_interval_ms = 500
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    measured: dict[str, list[Row]] = {}
    for model in args.models:
        rows += run_model(
            model,
            args.protocol,
            args.sessions,
            args.rounds,
            args.interval_ms,
            args.latency_interval_ms,
            raw_seconds,
            args.shared_memory,
            args.alone,
            measured,
        )
    # Every measurement in the order taken, raw figures keyed by batch size.
    rounds_path = args.out.with_name(args.out.name + "_rounds.json")
    rounds_path.write_text(json.dumps(measured, indent=1) + "\n")
    note = (
        f"`{command}`: {args.sessions} sessions x {args.rounds} rounds per configuration "
        "in rotating order"
        + (", each on a fresh server alone" if args.alone else ", servers side by side")
        + "; medians, with the range of the c=32 rounds."
    )
    write_table(rows, args.out, COLUMNS, note)
    print(f"wrote {args.out}.* in {time.monotonic() - started:.0f}s", file=sys.stderr)
    return 0


def resummarize(
    saved: Mapping[str, list[Row]], protocols: Sequence[str], shared_memory: bool
) -> list[dict[str, Any]]:
    """The table's rows from OUT_rounds.json's content ({"MODEL SERVER": [measurement]}),
    with the raw figures' batch sizes back to ints."""
    by_model: dict[str, dict[str, list[Row]]] = {}
    for label, found in saved.items():
        model, name = label.split(" ", 1)
        by_model.setdefault(model, {})[name] = [
            {k: {int(b): float(x) for b, x in v.items()} if isinstance(v, dict) else v
             for k, v in row.items()}
            for row in found
        ]  # fmt: skip
    rows: list[dict[str, Any]] = []
    for model, results in by_model.items():
        rows += summarize(model, results, protocols, shared_memory)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
