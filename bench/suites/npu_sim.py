"""Batching on the simulated NPU with the calibrated cost model (`--sim-cost`).

The simulated NPU's timing is modelled (backends/ge/sim_cost.py): one execution takes
launch + per sample x rows, the default profile derived from npu_ge's published ResNet-50
figures; results stay real (onnxruntime). Every figure here is simulated timing.

* `cnn`: a ResNet-class stand-in (input FP32 [3, 64, 64], 1000 classes: a strided conv,
  global pooling and a linear head, cheap enough that onnxruntime stays inside the
  modelled time; the cost model supplies ResNet-50's) at concurrency 1, 8 and 32, with
  no batching (`off`), static dynamic batching (`static`: 2 ms window) and `adaptive`,
  each on 2 slots (`device_exec_blocks: 2`) of one simulated device.

The encoder with ND gears against exact shapes, on the same profile and batching, is the
`buckets` suite (bench/suites/buckets.py).

The product's headline claim, tested on the simulation: with batching and slots, >= 5x
the unbatched throughput at concurrency 32, with p50 at least 50 % below the unbatched
p50 at the same concurrency.

    python -m bench run npu-sim --out bench/results/npu_sim
    python -m bench run npu-sim --out /tmp/n --concurrency 8 --interval-ms 1500  # smoke

Writes OUT.json and OUT.md. Needs perf_analyzer (bench/setup_perf_analyzer.sh).
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
from bench.lib.npu_models import CNN, write_cnn_repo
from bench.lib.perfa import find_perf_analyzer, run_perf_analyzer
from bench.lib.server import serve

PROG = "python -m bench run npu-sim"
CNN_CONFIGS = ("off", "static", "adaptive")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.md")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--sim-cost", default="default", help="--sim-cost for the server")
    parser.add_argument("--interval-ms", type=int, default=4000, help="perf_analyzer window")
    parser.add_argument("--protocol", default="grpc", choices=["http", "grpc"])
    return parser.parse_args(list(argv))


def measure(
    repo: Path, model: str, flags: Sequence[str], args: argparse.Namespace,
    concurrency: int,
) -> dict[str, Any]:  # fmt: skip
    with serve(repo, flags) as server:
        url = server.grpc_url if args.protocol == "grpc" else server.http_url
        row = run_perf_analyzer(
            model, url, args.protocol, concurrency=concurrency,
            measurement_interval_ms=args.interval_ms, perf_analyzer=find_perf_analyzer(),
        )  # fmt: skip
        stats = httpclient.InferenceServerClient(server.http_url)
        try:
            entry = stats.get_inference_statistics(model)["model_stats"][0]
        finally:
            stats.close()
    # Over the whole run (perf_analyzer's warm-up windows included): what batches formed.
    executions = int(entry["execution_count"])
    batch = int(entry["inference_count"]) / executions if executions else None
    return {"throughput": row["throughput"], "p50_us": row.get("p50_us"),
            "p99_us": row.get("p99_us"), "mean_batch": batch}  # fmt: skip


def run_cnn(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for config in CNN_CONFIGS:
        repo = write_cnn_repo(CACHE / "repos" / f"npu_sim_cnn_{config}", config)
        flags = ["--device", "sim", "--sim-cost", args.sim_cost, "--disable-auto-complete-config"]
        if config == "adaptive":
            flags += ["--adaptive-batching", "true"]
        for concurrency in args.concurrency:
            found = measure(repo, CNN, flags, args, concurrency)
            rows.append({"part": "cnn", "config": config, "concurrency": concurrency, **found})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["# Batching on the simulated NPU (timing simulated: --sim-cost)", ""]
    lines += [
        "| part | config | c | infer/s | p50 ms | p99 ms | mean batch |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p50 = f"{r['p50_us'] / 1000:.1f}" if r.get("p50_us") else "-"
        p99 = f"{r['p99_us'] / 1000:.1f}" if r.get("p99_us") else "-"
        batch = f"{r['mean_batch']:.1f}" if r.get("mean_batch") else "-"
        lines.append(f"| {r['part']} | {r['config']} | {r['concurrency']} "
                     f"| {r['throughput']:.0f} | {p50} | {p99} | {batch} |")  # fmt: skip
    cnn = {(r["config"], r["concurrency"]): r for r in rows if r["part"] == "cnn"}
    for config in ("static", "adaptive"):
        off, on = cnn.get(("off", 32)), cnn.get((config, 32))
        if off and on and off.get("p50_us") and on.get("p50_us"):
            lines.append("")
            lines.append(
                f"c=32 {config}: {on['throughput'] / off['throughput']:.2f}x the unbatched "
                f"throughput, p50 {100 * (1 - on['p50_us'] / off['p50_us']):.0f} % below "
                "unbatched (goal: >= 5x and >= 50 %)"
            )
    return lines


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    rows = run_cnn(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"sim_cost": args.sim_cost, "protocol": args.protocol, "timing": "simulated",
            "command": " ".join([PROG, *argv])}  # fmt: skip
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    text = "\n".join([*summary(rows), "", f"Command: `{meta['command']}`", ""])
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
