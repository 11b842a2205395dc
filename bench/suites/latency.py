"""Latency profile: perf_analyzer's infer/s, p50 and p99 against concurrency for each
configuration, with raw onnxruntime's best from the same run next to every row.

The configurations run one after another (bench/lib/sweep.py), so this profiles each one's
latency and load curve; it does not compare their throughputs, which the machine's speed
swings move between configurations as much as the settings do (the batching suite compares
them, time-shared). By default the batching settings of `--models` (bench/lib/variants.py);
`--variant NAME key=value ...` (repeatable) profiles others instead (keys: model, batching
on|off, delay_us, preferred, instances, max_batch_size, kind, backend, param.KEY=VALUE,
flags="...", extra="raw pbtxt", shm=system).

    python -m bench run latency --out bench/results/latency
    python -m bench run latency --out /tmp/l --models simple --only static0-simple --quick
    python -m bench run latency --out /tmp/l --protocol grpc --concurrency 1 8 \\
        --variant dyn model=resnet18_like delay_us=2000 preferred=8,16,32

Writes OUT.json, OUT.md, OUT.png and OUT_raw.json. `--quick` uses tiny windows (smoke only,
figures not quotable).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.lib.report import markdown_table
from bench.lib.sweep import Windows, parse_variant, sweep
from bench.lib.variants import batching_variants

PROG = "python -m bench run latency"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="path prefix for .json/.md/.png")
    parser.add_argument("--models", nargs="+", default=["simple", "resnet18_like"])
    parser.add_argument("--only", nargs="+", help="of the batching settings, only these names")
    parser.add_argument("--variant", nargs="+", action="append", metavar="WORD")
    parser.add_argument("--protocol", nargs="+", default=["http", "grpc"], choices=["http", "grpc"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--interval", type=int, default=3000, help="ms per window")
    parser.add_argument("--max-trials", type=int, default=6)
    parser.add_argument("--stability", type=float, default=20.0)
    parser.add_argument("--raw-seconds", type=float, default=2.0)
    parser.add_argument("--async", dest="use_async", action="store_true")
    parser.add_argument("--quick", action="store_true", help="tiny windows: smoke only")
    args = parser.parse_args(argv)
    windows = Windows(args.interval, args.max_trials, args.stability)
    raw_seconds = args.raw_seconds
    if args.quick:
        windows, raw_seconds = Windows(500, 3, 50.0), 0.3
    if args.variant:
        variants = [parse_variant(v) for v in args.variant]
    else:
        variants = [v for m in args.models for v in batching_variants(m)]
        if args.only:
            variants = [v for v in variants if v.name in args.only]
    if not variants:
        parser.error("no variant to run (see --only and --variant)")
    started = time.monotonic()
    command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
    rows = sweep(
        variants, args.protocol, args.concurrency, args.out, windows, raw_seconds,
        args.use_async, note=f"`{command}`: variants one after another (a profile, not a "
        "comparison: see bench/lib/sweep.py).",
    )  # fmt: skip
    print(markdown_table(rows))
    print(f"wrote {args.out}.json/.md/.png in {time.monotonic() - started:.0f}s")
    return 0
