"""Shape-bucketed batching against exact-shape batching, for a BERT-sized encoder on the
simulated NPU, with requests of mixed lengths.

The model is a BERT-sized stand-in (random weights, built here): a 30522 x 768 token
embedding, `--layers` feed-forward blocks 768 -> 3072 -> 768 with residuals, and a mean
over the attention mask, giving a 768-wide embedding per request. It has no attention, so
its cost grows linearly with the sequence length: padding costs it less than it would a
real BERT, which makes the comparison conservative for buckets.

Two servers on the GE backend (`--device sim`), both up at once, take turns under the
same closed-loop load (bench/lib/loadgen.py, gRPC): `--concurrency` clients in all, spread
evenly over the lengths (16, 32, ..., 128 tokens by default), each sending requests of
its own length.

- exact: `dynamic_batching {}`; only requests of one length batch together (on GE, the
  model is compiled for every request length, as ND gears).
- bucketed: requests are padded up to the buckets (scheduler/buckets.py) and batch across
  lengths (on GE, the model is compiled for the bucket lengths only).

On GE the shapes are ND gears (`graph.ge.inputShape` with -1 dims, `graph.ge.dynamicDims`
with one value per -1 dim in each gear), which the GE backend reports as the scheduler's
shape buckets. `--backend onnxruntime` runs the same comparison on the host CPU with
configured `bucket_sizes` instead.

Each round runs both, in alternating order, for `--duration` seconds after `--warmup`.
Reported per variant: infer/s (all lengths), p50 and p99 per length, pooled over rounds;
and bucketed / exact for throughput and each length's p99.

    python -m bench run buckets --out bench/results/buckets --layers 0

With `--layers 0` the stand-in is the embedding and the masked mean only, so onnxruntime's
compute stays below the modelled device time (`--sim-cost`, default profile) and the
timing is the device's; with FFN layers on this CPU the host's compute would set it.
    python -m bench run buckets --out /tmp/b --rounds 1 --duration 4 --warmup 1 \\
        --backend onnxruntime --layers 1 --concurrency 8 --lengths 16 32 64 128   # sanity

Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.lib import loadgen
from bench.lib.inputs import Array
from bench.lib.models import CACHE, ONNX_CACHE
from bench.lib.report import markdown_table
from bench.lib.server import serve

PROG = "python -m bench run buckets"
VOCAB = 30522
HIDDEN = 768
FFN = 3072
MODEL = "bert_standin"


def build_model(layers: int, seed: int = 0) -> onnx.ModelProto:
    """input_ids, attention_mask INT64 [B, S] -> embedding FP32 [B, 768]."""
    rng = np.random.default_rng(seed)
    embed = (rng.standard_normal((VOCAB, HIDDEN)) * 0.02).astype(np.float32)
    inits = [numpy_helper.from_array(embed, "embed")]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["h0"])]
    hidden = "h0"
    for layer in range(layers):
        up = (rng.standard_normal((HIDDEN, FFN)) * 0.02).astype(np.float32)
        down = (rng.standard_normal((FFN, HIDDEN)) * 0.02).astype(np.float32)
        inits += [numpy_helper.from_array(up, f"up{layer}")]
        inits += [numpy_helper.from_array(down, f"down{layer}")]
        nodes += [
            helper.make_node("MatMul", [hidden, f"up{layer}"], [f"u{layer}"]),
            helper.make_node("Relu", [f"u{layer}"], [f"r{layer}"]),
            helper.make_node("MatMul", [f"r{layer}", f"down{layer}"], [f"d{layer}"]),
            helper.make_node("Add", [hidden, f"d{layer}"], [f"h{layer + 1}"]),
        ]
        hidden = f"h{layer + 1}"
    inits.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), "last"))
    inits.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"))
    nodes += [
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "last"], ["m3"]),
        helper.make_node("Mul", [hidden, "m3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["m", "axis1"], ["count"], keepdims=1),
        helper.make_node("Div", ["summed", "count"], ["embedding"]),
    ]
    graph = helper.make_graph(
        nodes,
        MODEL,
        [
            helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "S"])
            for n in ("input_ids", "attention_mask")
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["B", HIDDEN])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def config_text(backend: str, max_batch_size: int, lengths: Sequence[int], padded: bool) -> str:
    """The model's config. On GE the executors run only compiled shapes, so the shapes
    are ND gears (`graph.ge.inputShape` / `graph.ge.dynamicDims`, one gear per batch
    gear and length), which the backend reports as the scheduler's shape buckets:
    `lengths` are every request length (exact) or the buckets (padded). On onnxruntime
    any shape runs: exact has no buckets, padded configures `bucket_sizes`."""
    kind = "KIND_GPU" if backend == "npu_ge" else "KIND_CPU"
    text = f"""name: "{MODEL}"
backend: "{backend}"
max_batch_size: {max_batch_size}
input [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }}
]
output [ {{ name: "embedding" data_type: TYPE_FP32 dims: [ {HIDDEN} ] }} ]
instance_group [ {{ count: 1 kind: {kind} }} ]
dynamic_batching {{ }}
"""
    params: dict[str, str] = {}
    if backend == "npu_ge":
        batches = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i <= max_batch_size]
        params["graph.ge.inputShape"] = "input_ids:-1,-1;attention_mask:-1,-1"
        params["graph.ge.dynamicDims"] = ";".join(
            f"{b},{n},{b},{n}" for b in batches for n in lengths
        )
    elif padded:
        params["bucket_inputs"] = "input_ids:0,attention_mask:0"
        params["bucket_sizes"] = ",".join(str(n) for n in lengths)
    if padded:
        params["bucket_pad_values"] = "input_ids:0,attention_mask:0"
    for key, value in params.items():
        text += f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
    return text


def make_repos(args: Any) -> dict[str, Path]:
    layers = args.layers
    path = ONNX_CACHE / f"{MODEL}_{layers}l.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(build_model(layers), str(path))
    repos = {}
    for variant, padded in (("exact", False), ("bucketed", True)):
        repo = CACHE / "repos" / f"buckets_{variant}_{args.backend}_{layers}l"
        folder = repo / MODEL / "1"
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / "model.onnx"
        if not target.exists():
            # A hard link (the server refuses symbolic links out of the model folder).
            os.link(path, target)
        lengths = args.buckets if padded else args.lengths
        text = config_text(args.backend, args.max_batch_size, lengths, padded)
        (repo / MODEL / "config.pbtxt").write_text(text)
        repos[variant] = repo
    return repos


def sample(length: int, seed: int) -> dict[str, Array]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(1, length), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones((1, length), dtype=np.int64)}


async def _load(url: str, lengths: Sequence[int], per_length: int, args: Any) -> list[Any]:
    """One closed-loop class per length, all at once."""
    runs = [
        loadgen.run_load_async(
            url,
            "grpc",
            MODEL,
            sample(length, length),
            [loadgen.LoadClass(f"len{length}", concurrency=per_length)],
            duration_s=args.duration,
            warmup_s=args.warmup,
        )
        for length in lengths
    ]
    return [rows[0] for rows in await asyncio.gather(*runs)]


def summarize(runs: dict[str, list[list[dict[str, Any]]]], lengths: Sequence[int]) -> list[Any]:
    rows = []
    for variant, rounds in runs.items():
        row: dict[str, Any] = {"variant": variant}
        row["infer/s"] = sum(c["throughput"] for r in rounds for c in r) / len(rounds)
        row["errors"] = sum(c["errors"] for r in rounds for c in r)
        for index, length in enumerate(lengths):
            p50 = [r[index].get("p50_us", float("nan")) for r in rounds]
            p99 = [r[index].get("p99_us", float("nan")) for r in rounds]
            row[f"p50 ms @{length}"] = float(np.median(p50)) / 1000
            row[f"p99 ms @{length}"] = float(np.median(p99)) / 1000
        rows.append(row)
    if {"exact", "bucketed"} <= runs.keys():
        exact, bucketed = (
            next(r for r in rows if r["variant"] == v) for v in ("exact", "bucketed")
        )
        ratio: dict[str, Any] = {"variant": "bucketed / exact"}
        ratio["infer/s"] = bucketed["infer/s"] / exact["infer/s"] if exact["infer/s"] else None
        for length in lengths:
            key = f"p99 ms @{length}"
            ratio[key] = bucketed[key] / exact[key] if exact[key] else None
        rows.append(ratio)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="output prefix (OUT.json, OUT.md)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(range(16, 129, 16)))
    parser.add_argument("--buckets", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument(
        "--backend",
        choices=["npu_ge", "onnxruntime"],
        default="npu_ge",
        help="npu_ge: the simulated NPU, shapes as ND gears (the measurement); "
        "onnxruntime: the host CPU, buckets configured (a check of the suite itself)",
    )
    parser.add_argument(
        "--sim-cost",
        default="default",
        help="the simulated NPU's timing (ge-serve --sim-cost; 'off' for onnxruntime's own "
        "time). On the host CPU's own time padding costs real compute and batching gains "
        "little, the opposite of an NPU, so the measurement models the device's time",
    )
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds measured per run")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring")
    args = parser.parse_args(argv)
    if args.concurrency % len(args.lengths):
        parser.error("--concurrency must be a multiple of the number of --lengths")
    if max(args.lengths) > max(args.buckets):
        parser.error("the largest bucket must hold the longest length")
    per_length = args.concurrency // len(args.lengths)
    repos = make_repos(args)
    flags = ["--device", "sim", "--sim-devices", "1", "--log-verbose", "0"]
    if args.sim_cost != "off":
        flags += ["--sim-cost", args.sim_cost]
    if args.backend == "onnxruntime":
        flags = ["--log-verbose", "0"]
    runs: dict[str, list[list[dict[str, Any]]]] = {"exact": [], "bucketed": []}
    with serve(repos["exact"], flags) as exact, serve(repos["bucketed"], flags) as bucketed:
        servers = {"exact": exact, "bucketed": bucketed}
        for index in range(args.rounds):
            order = ["exact", "bucketed"] if index % 2 == 0 else ["bucketed", "exact"]
            for variant in order:
                url = servers[variant].grpc_url
                result = asyncio.run(_load(url, args.lengths, per_length, args))
                runs[variant].append(result)
                total = sum(c["throughput"] for c in result)
                print(f"round {index + 1} {variant}: {total:.1f} infer/s", flush=True)
    rows = summarize(runs, args.lengths)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join([PROG, *(argv if argv is not None else [])])
    args.out.with_suffix(".json").write_text(
        json.dumps({"command": command, "rows": rows, "runs": runs}, indent=1)
    )
    note = (
        f"`{command}`: {args.concurrency} gRPC clients over lengths {args.lengths}, "
        f"buckets {args.buckets}, {args.layers}-layer BERT-sized stand-in on {args.backend} "
        f"({'the simulated NPU' if args.backend == 'npu_ge' else 'the host CPU'}"
        f"{', timing --sim-cost ' + args.sim_cost if args.backend == 'npu_ge' else ''}), "
        f"{args.rounds} rounds of {args.duration:g} s (medians of per-round p50/p99)."
    )
    columns = ["variant", "infer/s", "errors"]
    columns += [f"p{p} ms @{n}" for n in args.lengths for p in (50, 99)]
    table = markdown_table(rows, columns)
    args.out.with_suffix(".md").write_text(note + "\n\n" + table + "\n")
    print(table)
    return 0
