"""GE executor slots on the simulated NPU: throughput with 1 slot versus 2 slots.

For `simple` and the ResNet-18-sized CNN, two variants each on one simulated device
(`--device sim`): `device_exec_blocks` 1 and 2 (streams on the device, each a slot with its
own model copy and onnxruntime session; intra-op threads = cores // slots unless
`intra_op_thread_count` is set). Dynamic batching is off (`--disable-auto-complete-config`)
so every request is one execution and the slots alone decide the concurrency on the device.
perf_analyzer over HTTP at each concurrency; raw onnxruntime's best from the same run sits
next to every row (`ratio_raw`); the closing table gives 2 slots ÷ 1 slot per concurrency
and best ÷ best.

    export PYTHONPATH=$(tools/pyroot.sh)
    python3 bench/ge_slots.py --out bench/results/ge_slots            # the real run
    python3 bench/ge_slots.py --out bench/results/raw/ge_slots --quick  # smoke: tiny windows

Quick runs prove the script works; their figures are not quotable.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models import MODELS, RepoOptions
from report import markdown_table, save_rows
from sweep import Variant, Windows, sweep

SLOTS = (1, 2)


def variants(models: Sequence[str], slots: Sequence[int]) -> list[Variant]:
    found = []
    for model in models:
        for count in slots:
            options = RepoOptions(
                backend="npu_ge",
                kind="KIND_GPU",
                params={"device_exec_blocks": str(count)},
            )
            flags = ["--device", "sim", "--sim-devices", "1", "--disable-auto-complete-config"]
            found.append(Variant(f"ge_{model}_{count}slot", model, options, flags))
    return found


def slot_count(row: dict[str, Any]) -> int:
    return int(str(row["config"]).rsplit("_", 1)[1].removesuffix("slot"))


def ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """2 slots ÷ 1 slot, per model, protocol and concurrency, then best ÷ best."""
    measured = [r for r in rows if "throughput" in r]
    keyed = {(r["model"], r["protocol"], r["concurrency"], slot_count(r)): r for r in measured}
    table: list[dict[str, Any]] = []
    for model, protocol in sorted({(r["model"], r["protocol"]) for r in measured}):
        for concurrency in sorted({r["concurrency"] for r in measured if r["model"] == model}):
            one = keyed.get((model, protocol, concurrency, 1))
            two = keyed.get((model, protocol, concurrency, 2))
            if one and two and float(one["throughput"]) > 0:
                table.append(
                    {
                        "model": model,
                        "protocol": protocol,
                        "concurrency": concurrency,
                        "1 slot": float(one["throughput"]),
                        "2 slots": float(two["throughput"]),
                        "ratio": float(two["throughput"]) / float(one["throughput"]),
                        "stable": bool(one.get("stable")) and bool(two.get("stable")),
                    }
                )
        best = {
            count: max(
                (
                    float(r["throughput"])
                    for r in measured
                    if r["model"] == model and r["protocol"] == protocol and slot_count(r) == count
                ),
                default=0.0,
            )
            for count in SLOTS
        }
        if best[1] > 0:
            table.append(
                {
                    "model": model,
                    "protocol": protocol,
                    "concurrency": "best",
                    "1 slot": best[1],
                    "2 slots": best[2],
                    "ratio": best[2] / best[1],
                }
            )
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["simple", "resnet18_like"], choices=MODELS)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--protocol", nargs="+", default=["http"], choices=["http", "grpc"])
    parser.add_argument("--out", type=Path, default=Path("bench/results/ge_slots"))
    parser.add_argument("--interval", type=int, default=3000)
    parser.add_argument("--max-trials", type=int, default=6)
    parser.add_argument("--stability", type=float, default=20.0)
    parser.add_argument("--raw-seconds", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="tiny windows: smoke only")
    args = parser.parse_args(argv)
    windows = Windows(args.interval, args.max_trials, args.stability)
    raw_seconds = args.raw_seconds
    if args.quick:
        windows, raw_seconds = Windows(500, 3, 50.0), 0.3
    started = time.monotonic()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = sweep(
        variants(args.models, SLOTS),
        args.protocol,
        args.concurrency,
        args.out,
        windows,
        raw_seconds,
    )
    table = ratios(rows)
    text = markdown_table(
        table, ["model", "protocol", "concurrency", "1 slot", "2 slots", "ratio", "stable"]
    )
    save_rows(table, args.out.with_name(args.out.name + "_ratio.json"))
    with open(args.out.with_suffix(".md"), "a", encoding="utf-8") as handle:
        handle.write("\n## 2 slots ÷ 1 slot (GE, simulated NPU)\n\n" + text)
    print(markdown_table(rows))
    print(text)
    if args.quick:
        print("quick run: tiny windows, figures are not quotable", file=sys.stderr)
    print(f"wrote {args.out}.json/.md/.png in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
