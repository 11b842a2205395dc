"""The batching benchmark (issue 5): no batching, static dynamic batching and adaptive
batching, on `simple` and the ResNet-18-sized CNN, over HTTP and gRPC at concurrency 1, 8
and 32, with raw onnxruntime at its best batch size in the same run; then a mixed-priority
run (high priority at a low rate while low priority saturates) reporting each level's p99.

    export PYTHONPATH=$(tools/pyroot.sh)
    python3 bench/batching.py --out bench/results/batching            # the real run
    python3 bench/batching.py --out /tmp/b --quick --models simple     # a smoke run

Writes OUT.json / OUT.md / OUT.png (the sweep, via sweep.py and report.py) and
OUT_mixed.json / OUT_mixed.md, and appends the mixed-priority table to OUT.md. With
--skip-sweep only the OUT_mixed.* files are written.

Variants per model (the `config` column):
* `off`: no dynamic_batching (and auto-complete off, so none is added): one request, one run.
* `static0`: `dynamic_batching {}`: Triton's default, batches form from what queued while the
  slot was busy.
* `static`: a tuned static window and preferred sizes (see STATIC below).
* `static3ms` (`simple` only): a 3 ms window with preferred size 8. Over gRPC at 32
  clients on 2 cores it fills batches of ~7.5 against ~2.5 with no window, and ran
  1.2-1.4x `static0`'s throughput; over HTTP batches are 8 either way. At one client it
  waits the whole window every time: a setting for throughput only.
* `adaptive`: `dynamic_batching {}` plus `adaptive_batching: "true"`, budget derived.
* `static0x2`, `staticx2`, `adaptivex2` (CNN only): `static0`, `static` and `adaptive` with
  two slots, the cores split between them (intra-op threads = cores // 2), so one slot
  computes while the other is being filled. (Result files before these names call
  `adaptivex2` `adaptive2`.)

Mixed-priority run (CNN by default): two priority levels; the high level sends an open-loop
`--high-rate` (default 5 % of what the low class alone gets through, measured first), the
low level `--low-concurrency`
closed-loop clients. Configurations: `fifo` (no priority levels), `priority` (levels, static
batching) and `priority+adaptive` (levels, adaptive, the high level's latency budget set to
`--high-budget-us`, default four unbatched executions as raw ORT measured them in this run).

Why four: with one slot, an execution cannot be interrupted, so a high request's floor is
one low-priority execution it may arrive just behind plus its own, each ~10 % slower under
this load than alone (14.7 ms against 13.3 ms on 2 cores): ~30 ms before transport, the event
loop serving 32 low-priority clients and the load generator sharing the cores. Three
executions (39.8 ms) left too little of that: p99 44.8-46.7 ms in a quiet run
(bench/results/batching_prio_mixed.md); four (53 ms) holds with room
(bench/results/batching_prio4_mixed.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inputs import make_sample, specs_from_config
from loadgen import LoadClass, batched, run_load
from models import CACHE, Batching, RepoOptions, ensure_model, make_repo
from raw_ort import measure_raw
from report import markdown_table, save_rows
from sweep import Variant, Windows, sweep

from server import grpc_ready, serve

SHORT = {"simple": "simple", "resnet18_like": "cnn"}
# A tuned static setting per model: a window about a tenth of an unbatched execution on a
# modern 16-core host, and the sizes that fill a CNN's GEMMs well.
STATIC = {
    "simple": Batching(max_queue_delay_us=100, preferred=[4, 8]),
    "resnet18_like": Batching(max_queue_delay_us=2000, preferred=[8, 16, 32]),
}
# A long window for front-end-bound models, where each execution costs the host far more
# than its compute (see the variant list above).
LONG_WINDOW = {"simple": Batching(max_queue_delay_us=3000, preferred=[8])}
ADAPTIVE = {"adaptive_batching": "true"}
# The suffix of a setting with two slots ("adaptivex2": adaptive on two slots).
TWO_SLOTS = "x2"


def variants(model: str) -> list[Variant]:
    """The configurations compared for one model; names carry the model so that each
    variant gets its own repository."""
    short = SHORT.get(model, model)
    mbs = ensure_model(model).default_max_batch_size
    plain = RepoOptions(max_batch_size=mbs)
    found = [
        Variant(f"off-{short}", model, plain, flags=["--disable-auto-complete-config"]),
        Variant(f"static0-{short}", model, RepoOptions(max_batch_size=mbs, batching=Batching())),
        Variant(
            f"static-{short}",
            model,
            RepoOptions(max_batch_size=mbs, batching=STATIC.get(model, Batching())),
        ),
        Variant(
            f"adaptive-{short}",
            model,
            RepoOptions(max_batch_size=mbs, batching=Batching(), params=ADAPTIVE),
        ),
    ]
    if model in LONG_WINDOW:
        long = RepoOptions(max_batch_size=mbs, batching=LONG_WINDOW[model])
        found.insert(3, Variant(f"static3ms-{short}", model, long))
    if model == "resnet18_like":
        tuned = STATIC[model]
        for name, batching, params in (("static0", Batching(), {}), ("static", tuned, {}),
                                       ("adaptive", Batching(), ADAPTIVE)):  # fmt: skip
            two = RepoOptions(max_batch_size=mbs, batching=batching, params=params, instances=2)
            found.append(Variant(f"{name}{TWO_SLOTS}-{short}", model, two))
    return found


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


MIXED_COLUMNS = (
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="path prefix for the results")
    parser.add_argument("--models", nargs="+", default=["simple", "resnet18_like"])
    parser.add_argument("--protocol", nargs="+", default=["http", "grpc"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--only", nargs="+", help="run only these variant names")
    parser.add_argument("--mixed-model", default="resnet18_like")
    parser.add_argument("--mixed-duration", type=float, default=20.0)
    parser.add_argument("--high-rate", type=float, help="high-priority requests/s")
    parser.add_argument("--high-budget-us", type=int, help="the high level's latency budget")
    parser.add_argument("--low-concurrency", type=int, default=32)
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--skip-mixed", action="store_true")
    parser.add_argument("--quick", action="store_true", help="tiny windows: smoke only")
    args = parser.parse_args(argv)
    windows, raw_seconds, duration = Windows(3000, 6, 20.0), 2.0, args.mixed_duration
    if args.quick:
        windows, raw_seconds, duration = Windows(1000, 3, 50.0), 0.3, 3.0
    started = time.monotonic()
    lines: list[str] = []
    if not args.skip_sweep:
        chosen = [v for m in args.models for v in variants(m)]
        if args.only:
            chosen = [v for v in chosen if v.name in args.only]
        rows = sweep(chosen, args.protocol, args.concurrency, args.out, windows, raw_seconds)
        print(markdown_table(rows))
        lines.append(args.out.with_suffix(".md").read_text())
    if not args.skip_mixed:
        mixed = mixed_priority(
            args.mixed_model,
            args.protocol,
            duration,
            args.high_rate,
            args.high_budget_us,
            args.low_concurrency,
            raw_seconds,
        )
        save_rows(mixed, args.out.with_name(args.out.name + "_mixed.json"))
        table = markdown_table(mixed, MIXED_COLUMNS)
        print(table)
        section = "\n## Mixed priority\n\n" + table + "\n"
        args.out.with_name(args.out.name + "_mixed.md").write_text(section)
        lines.append(section)
    if not args.skip_sweep:
        # Only a run with the sweep rewrites OUT.md: --skip-sweep leaves its figures alone.
        args.out.with_suffix(".md").write_text("\n".join(lines))
    print(f"wrote {args.out}.* in {time.monotonic() - started:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
