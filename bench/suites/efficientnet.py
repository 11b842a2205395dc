"""Large-scale image classification with a real model on the simulated NPU: EfficientNet-
Lite0 (examples/efficientnet) at concurrency 1 and 32, with batching off, Triton's rules
and adaptive.

The classifier, `efficientnet_lite0` as examples/efficientnet/build.py writes it (ImageNet
weights, batch gears 1 to 32 on the GE backend), is served three ways, one server at a
time, on the simulated NPU (`--device sim`) with the default profile slowed down
`--slowdown` times (below):

* `off`: no `dynamic_batching`, one request one execution;
* `triton`: `dynamic_batching` with the example's 2 ms queue delay (times the slowdown),
  batches formed by Triton's rules;
* `adaptive`: the same config, with `--adaptive-batching true`.

perf_analyzer drives the classifier itself with 224 x 224 inputs (its random data: the
timing does not depend on the pixels), so the figures are the classifier's, not the Python
pre-processing's. Reported per configuration and concurrency: images/s, p50 and p99, and
the mean executed batch; then each batching configuration against `off` at the same
concurrency as ratios (images/s ÷ off, p50 ÷ off), and adaptive against Triton's rules.

Timing is simulated (backends/ge/sim_cost.py: launch + per sample x rows, the default
profile derived from npu_ge's ResNet-50 figures). onnxruntime still computes each result,
and an execution ends at its modelled end or when onnxruntime does, whichever is later.
At the profile's own speed onnxruntime is the later one: EfficientNet-Lite0 takes it about
25 ms an image on a 2-core host, at every batch size, against the profile's 5.2 ms for
batch 1 and 24 ms for batch 32, so the figures would measure the host CPU. `--slowdown F`
(default 64) therefore runs the profile F times slower (`--sim-cost
launch_us=4627.8F,per_sample_us=607.8F`) and scales Triton's queue delay by F too: every
modelled time keeps its proportion to the others, so images/s and p50 as ratios are the
profile's, while onnxruntime's compute (under 0.8 s for batch 32 against 1.54 s modelled)
and the transport fall inside the modelled times. Absolute figures are the profile's
divided by F. The adaptive controller's own time limits are not scaled (its derived
budget's 200 ms cap is below one slowed execution); what it waits for at c=32 is the
clients coming back after a batch, a few milliseconds, well inside that cap. docs/npu.md
has the arithmetic. Each row
says how much longer the executions took than their modelled device time (`host past
device`, from the server's per-batch-size statistics; near 0 the figures are the
device's), and whether the server logged an overrun at all.

    python -m bench run efficientnet --out bench/results/efficientnet --interval-ms 10000
    python -m bench run efficientnet --out /tmp/e --interval-ms 5000    # a quick check

Writes OUT.json and OUT.md. Needs perf_analyzer (bench/setup_perf_analyzer.sh) and the
packages examples/efficientnet/build.py reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tritonclient.http as httpclient

from bench.lib.models import CACHE
from bench.lib.perfa import find_perf_analyzer, run_perf_analyzer
from bench.lib.server import serve
from ge_serve.backends.base import gear_for
from ge_serve.backends.ge.sim_cost import DEFAULT_PROFILE, PROFILES, SimCost, parse_sim_cost

import cvrepo  # tests/cvrepo.py: bench.lib.server put tests/ on the path  # isort: skip

PROG = "python -m bench run efficientnet"
MODEL = "efficientnet_lite0"
CONFIGS = ("off", "triton", "adaptive")
OVERRUN = "simulated NPU: onnxruntime took"
# How much slower than the default profile the device runs (see the docstring).
SLOWDOWN = 64.0


def sim_cost(slowdown: float) -> str:
    """The default profile (npu_ge_resnet50) `slowdown` times slower, as --sim-cost."""
    profile = PROFILES[DEFAULT_PROFILE]
    return (
        f"launch_us={profile.launch_us * slowdown:.1f},"
        f"per_sample_us={profile.per_sample_us * slowdown:.1f}"
    )


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.md")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument(
        "--slowdown",
        type=float,
        default=SLOWDOWN,
        help="run the default profile (and Triton's queue delay) this many times slower, so "
        "that the simulated device, not onnxruntime on the host, sets the time "
        f"(default {SLOWDOWN:g})",
    )
    parser.add_argument(
        "--sim-cost",
        default=None,
        help="--sim-cost for the server, verbatim (default: the default profile slowed "
        "down --slowdown times)",
    )
    parser.add_argument("--interval-ms", type=int, default=4000, help="perf_analyzer window")
    parser.add_argument("--protocol", default="grpc", choices=["http", "grpc"])
    return parser.parse_args(list(argv))


def write_repo(config: str, slowdown: float) -> Path:
    """The classifier alone, as the example builds it, with or without dynamic batching
    (its queue delay `slowdown` times the example's)."""
    build = cvrepo.efficientnet_build()
    repo = CACHE / "repos" / f"efficientnet_{config}"
    delay_us = round(build.Options().delay_us * slowdown)
    options = build.Options(batching=config != "off", delay_us=delay_us)
    build.build(repo, options)
    return repo


def measure(config: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    repo = write_repo(config, args.slowdown)
    # As written: auto-complete would add dynamic_batching to `off`.
    flags = ["--device", "sim", "--sim-cost", args.sim_cost, "--disable-auto-complete-config"]
    if config == "adaptive":
        flags += ["--adaptive-batching", "true"]
    cost = parse_sim_cost(args.sim_cost)
    rows = []
    log_copy = CACHE / "logs" / f"efficientnet_{config}.log"
    with serve(repo, flags, keep_log=log_copy) as server:
        url = server.grpc_url if args.protocol == "grpc" else server.http_url
        for concurrency in args.concurrency:
            before = _counts(server.http_url)
            found = run_perf_analyzer(
                MODEL, url, args.protocol, concurrency=concurrency,
                measurement_interval_ms=args.interval_ms, perf_analyzer=find_perf_analyzer(),
            )  # fmt: skip
            after = _counts(server.http_url)
            executions = after[0] - before[0]
            batch = (after[1] - before[1]) / executions if executions else None
            rows.append({
                "config": config, "concurrency": concurrency,
                "images_per_s": found["throughput"], "p50_us": found.get("p50_us"),
                "p99_us": found.get("p99_us"), "mean_batch": batch,
                "stable": found.get("stable", True),
                "host_share": host_share(before[2], after[2], cost) if cost else None,
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        overrun = OVERRUN in server.log()
    for row in rows:
        row["overrun"] = overrun
    return rows


BatchStats = dict[int, tuple[int, int]]


def _counts(http_url: str) -> tuple[int, int, BatchStats]:
    """(executions, inferences, {batch size: (executions, compute_infer ns)}) of the
    classifier so far (perf_analyzer's warm-up windows included: what batches formed)."""
    client = httpclient.InferenceServerClient(http_url)
    try:
        entry = client.get_inference_statistics(MODEL)["model_stats"][0]
    finally:
        client.close()
    sizes = {
        int(b["batch_size"]): (
            int(b["compute_infer"].get("count", 0)),
            int(b["compute_infer"].get("ns", 0)),
        )
        for b in entry.get("batch_stats", [])
    }
    return int(entry.get("execution_count", 0)), int(entry.get("inference_count", 0)), sizes


def host_share(before: BatchStats, after: BatchStats, cost: SimCost) -> float | None:
    """How much longer the executions between two snapshots took than the device time
    modelled for them, as a share of that time: the host's part (onnxruntime running past
    the modelled end, copies, padding). Near 0, the figures are the device's. A batch of
    n runs at the smallest gear that holds it (powers of two up to MAX_BATCH)."""
    measured = modelled = 0
    for size, (count, ns) in after.items():
        old_count, old_ns = before.get(size, (0, 0))
        if count > old_count:
            measured += ns - old_ns
            modelled += (count - old_count) * cost.duration_ns(gear_for(size, GEARS))
    return measured / modelled - 1 if modelled else None


# The batch gears the GE backend compiles for the example's max_batch_size of 32.
GEARS = (1, 2, 4, 8, 16, 32)


def summary(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["# EfficientNet-Lite0 on the simulated NPU (timing simulated: --sim-cost)", ""]
    lines += [
        "| config | c | images/s | p50 ms | p99 ms | mean batch | host past device | overrun |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p50 = f"{r['p50_us'] / 1000:.1f}" if r.get("p50_us") else "-"
        p99 = f"{r['p99_us'] / 1000:.1f}" if r.get("p99_us") else "-"
        batch = f"{r['mean_batch']:.1f}" if r.get("mean_batch") else "-"
        share = r.get("host_share")
        past = f"{share:.1%}" if share is not None else "-"
        overrun = "yes" if r["overrun"] else "no"
        lines.append(f"| {r['config']} | {r['concurrency']} | {r['images_per_s']:.1f} | {p50} "
                     f"| {p99} | {batch} | {past} | {overrun} |")  # fmt: skip
    by = {(r["config"], r["concurrency"]): r for r in rows}
    ratios = []
    for config, base in (("triton", "off"), ("adaptive", "off"), ("adaptive", "triton")):
        for concurrency in sorted({r["concurrency"] for r in rows}):
            on, ref = by.get((config, concurrency)), by.get((base, concurrency))
            if not (on and ref and on.get("p50_us") and ref.get("p50_us")):
                continue
            ratios.append(
                f"| {config} ÷ {base} | {concurrency} "
                f"| {on['images_per_s'] / ref['images_per_s']:.2f} "
                f"| {on['p50_us'] / ref['p50_us']:.2f} |"
            )
    if ratios:
        lines += ["", "| ratio | c | images/s | p50 |", "|---|---|---|---|", *ratios]
    lines += ["", "Host past device: how much longer the executions took than their modelled "
              "device time (onnxruntime past the modelled end, copies), as a share of it; near "
              "0 the figures are the device's."]  # fmt: skip
    if any(r["overrun"] for r in rows):
        lines += ["", "Overrun: onnxruntime ran past the modelled time at least once (the server "
                  "logged it); the host-past-device share says how much that weighs."]  # fmt: skip
    return lines


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    if args.sim_cost is None:
        args.sim_cost = sim_cost(args.slowdown)
    rows = [row for config in args.configs for row in measure(config, args)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"sim_cost": args.sim_cost, "slowdown": args.slowdown, "protocol": args.protocol,
            "timing": "simulated", "model": MODEL, "command": " ".join([PROG, *argv])}  # fmt: skip
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    timing = (
        f"Timing: `--sim-cost {args.sim_cost}` (the default profile {args.slowdown:g}x slower; "
        "ratios are the profile's, absolute figures the profile's divided by that)."
    )
    text = "\n".join([*summary(rows), "", timing, "", f"Command: `{meta['command']}`", ""])
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
