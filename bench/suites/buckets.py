"""Shape-bucketed batching against exact-shape batching, for a BERT-sized encoder on the
simulated NPU, with requests of mixed lengths.

The model is a BERT-sized stand-in (random weights, built here): a 30522 x 768 token
embedding, `--layers` feed-forward blocks 768 -> 3072 -> 768 with residuals, and a mean
over the attention mask, giving a 768-wide embedding per request. It has no attention, so
its cost grows linearly with the sequence length: padding costs it less than it would a
real BERT, which makes the comparison conservative for buckets.

Two servers on the GE backend (`--device sim`), both up at once, take turns under the
same closed-loop load (bench/lib/loadgen.py, gRPC): `--concurrency` clients in all, spread
evenly over the lengths, each sending requests of its own length. By default there are as
many lengths as clients (32 lengths from 16 to 128 tokens), so no two requests in flight
share a length, as with real text, whose lengths are near-continuous; `--lengths 16 32 ...
128` gives fewer lengths with several clients each, where exact shapes batch too.

- exact: `dynamic_batching {}`; only requests of one length batch together. On GE the
  model is compiled as a shape range over every length (`graph.ge.inputShape` with
  `1~32,16~128` dims): ND gears stop at 100 (atc's limit), too few for every batch size
  and length.
- bucketed: requests are padded up to the buckets (scheduler/buckets.py) and batch across
  lengths. On GE the model is compiled for the bucket lengths only, as ND gears
  (`graph.ge.dynamicDims`), which the GE backend reports as the scheduler's shape buckets.

`--backend onnxruntime` runs the same comparison on the host CPU with configured
`bucket_sizes` instead.

Each round runs both, in alternating order, for `--duration` seconds after `--warmup`.
Reported per variant: infer/s (all lengths), the mean executed batch (the server's
statistics), p50 and p99 per length, pooled over rounds; and bucketed / exact for
throughput and each length's p99.

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
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

from bench.lib import loadgen
from bench.lib.inputs import Array
from bench.lib.models import CACHE, ONNX_CACHE
from bench.lib.report import markdown_table
from bench.lib.server import ServerProcess, serve

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


def config_text(
    backend: str, max_batch_size: int, lengths: Sequence[int], padded: bool, instances: int = 1
) -> str:
    """The model's config. On GE, padded compiles the buckets as ND gears
    (`graph.ge.inputShape` / `graph.ge.dynamicDims`, one gear per batch gear and bucket),
    which the backend reports as the scheduler's shape buckets; exact compiles a shape
    range over every request length. On onnxruntime any shape runs: exact has no
    buckets, padded configures `bucket_sizes`. `lengths` are the request lengths (exact)
    or the buckets (padded)."""
    kind = "KIND_GPU" if backend == "npu_ge" else "KIND_CPU"
    text = f"""name: "{MODEL}"
backend: "{backend}"
max_batch_size: {max_batch_size}
input [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }}
]
output [ {{ name: "embedding" data_type: TYPE_FP32 dims: [ {HIDDEN} ] }} ]
instance_group [ {{ count: {instances} kind: {kind} }} ]
dynamic_batching {{ }}
"""
    params: dict[str, str] = {}
    if backend == "npu_ge" and padded:
        batches = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i <= max_batch_size]
        params["graph.ge.inputShape"] = "input_ids:-1,-1;attention_mask:-1,-1"
        params["graph.ge.dynamicDims"] = ";".join(
            f"{b},{n},{b},{n}" for b in batches for n in lengths
        )
    elif backend == "npu_ge":
        # Every length as its own shape: a shape range (GE's dynamic-shape mode), since ND
        # gears stop at 100 (atc --dynamic_dims) and cannot list a gear per batch and length.
        dims = f"1~{max_batch_size},{min(lengths)}~{max(lengths)}"
        params["graph.ge.inputShape"] = f"input_ids:{dims};attention_mask:{dims}"
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
        text = config_text(args.backend, args.max_batch_size, lengths, padded, args.instances)
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


def batch_counts(srv: ServerProcess) -> tuple[int, int]:
    """(inference_count, execution_count) from the server's statistics."""
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        entry = client.get_inference_statistics(MODEL)["model_stats"][0]
        return int(entry["inference_count"]), int(entry["execution_count"])
    finally:
        client.close()


def summarize(
    runs: dict[str, list[list[dict[str, Any]]]],
    batches: dict[str, list[float]],
    lengths: Sequence[int],
) -> tuple[list[Any], list[Any]]:
    """(one row per variant, one row per length)."""
    rows = []
    per_length: list[dict[str, Any]] = [{"length": n} for n in lengths]
    for variant, rounds in runs.items():
        row: dict[str, Any] = {"variant": variant}
        row["infer/s"] = sum(c["throughput"] for r in rounds for c in r) / len(rounds)
        row["errors"] = sum(c["errors"] for r in rounds for c in r)
        row["mean batch"] = float(np.median(batches[variant])) if batches[variant] else None
        p50s, p99s = [], []
        for index, length_row in enumerate(per_length):
            p50 = float(np.median([r[index].get("p50_us", np.nan) for r in rounds])) / 1000
            p99 = float(np.median([r[index].get("p99_us", np.nan) for r in rounds])) / 1000
            length_row[f"{variant} p50 ms"] = p50
            length_row[f"{variant} p99 ms"] = p99
            p50s.append(p50)
            p99s.append(p99)
        row["p50 ms (median of lengths)"] = float(np.median(p50s))
        row["p99 ms (worst length)"] = max(p99s)
        rows.append(row)
    if {"exact", "bucketed"} <= runs.keys():
        exact, bucketed = (
            next(r for r in rows if r["variant"] == v) for v in ("exact", "bucketed")
        )
        ratio: dict[str, Any] = {"variant": "bucketed / exact"}
        for key in ("infer/s", "mean batch", "p50 ms (median of lengths)"):
            ratio[key] = bucketed[key] / exact[key] if exact[key] else None
        worst = 0.0
        for length_row in per_length:
            e, b = length_row["exact p99 ms"], length_row["bucketed p99 ms"]
            length_row["p99 bucketed / exact"] = b / e if e else None
            worst = max(worst, b / e if e else 0.0)
        ratio["p99 ms (worst length)"] = worst
        rows.append(ratio)
    return rows, per_length


def spread(count: int, low: int = 16, high: int = 128) -> list[int]:
    """`count` lengths evenly from `low` to `high`."""
    if count == 1:
        return [high]
    return sorted({round(low + (high - low) * i / (count - 1)) for i in range(count)})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="output prefix (OUT.json, OUT.md)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=None,
        help="request lengths (default: as many as --concurrency, evenly over 16-128)",
    )
    parser.add_argument("--buckets", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument(
        "--backend",
        choices=["npu_ge", "onnxruntime"],
        default="npu_ge",
        help="npu_ge: the simulated NPU (the measurement); "
        "onnxruntime: the host CPU, buckets configured (a check of the suite itself)",
    )
    parser.add_argument(
        "--sim-cost",
        default="default",
        help="the simulated NPU's timing (ge-serve --sim-cost; 'off' for onnxruntime's own "
        "time). On the host CPU's own time padding costs real compute and batching gains "
        "little, the opposite of an NPU, so the measurement models the device's time",
    )
    parser.add_argument("--instances", type=int, default=2, help="instance_group count")
    parser.add_argument(
        "--server-flags", default="", help="more ge-serve flags for both servers (one string)"
    )
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds measured per run")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring")
    args = parser.parse_args(argv)
    if args.lengths is None:
        args.lengths = spread(args.concurrency)
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
    flags += shlex.split(args.server_flags)
    runs: dict[str, list[list[dict[str, Any]]]] = {"exact": [], "bucketed": []}
    batches: dict[str, list[float]] = {"exact": [], "bucketed": []}
    with serve(repos["exact"], flags) as exact, serve(repos["bucketed"], flags) as bucketed:
        servers = {"exact": exact, "bucketed": bucketed}
        for index in range(args.rounds):
            order = ["exact", "bucketed"] if index % 2 == 0 else ["bucketed", "exact"]
            for variant in order:
                srv = servers[variant]
                before = batch_counts(srv)
                result = asyncio.run(_load(srv.grpc_url, args.lengths, per_length, args))
                after = batch_counts(srv)
                executions = after[1] - before[1]
                if executions:
                    batches[variant].append((after[0] - before[0]) / executions)
                runs[variant].append(result)
                total = sum(c["throughput"] for c in result)
                print(f"round {index + 1} {variant}: {total:.1f} infer/s", flush=True)
    rows, per_length_rows = summarize(runs, batches, args.lengths)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join([PROG, *(argv if argv is not None else [])])
    args.out.with_suffix(".json").write_text(
        json.dumps(
            {"command": command, "rows": rows, "lengths": per_length_rows, "runs": runs},
            indent=1,
        )
    )
    device = "the simulated NPU" if args.backend == "npu_ge" else "the host CPU"
    timing = f", timing --sim-cost {args.sim_cost}" if args.backend == "npu_ge" else ""
    note = (
        f"`{command}`: {args.concurrency} gRPC clients over {len(args.lengths)} lengths "
        f"({min(args.lengths)}-{max(args.lengths)} tokens, {per_length} client(s) each), "
        f"buckets {args.buckets}, {args.layers}-layer BERT-sized stand-in on {args.backend} "
        f"({device}{timing}), {args.instances} instance(s), {args.rounds} rounds of "
        f"{args.duration:g} s (medians of per-round p50/p99; mean batch from the statistics)."
    )
    columns = ["variant", "infer/s", "errors", "mean batch"]
    columns += ["p50 ms (median of lengths)", "p99 ms (worst length)"]
    length_columns = ["length"]
    length_columns += [f"{v} p{p} ms" for v in ("exact", "bucketed") for p in (50, 99)]
    length_columns.append("p99 bucketed / exact")
    table = markdown_table(rows, columns)
    lengths_table = markdown_table(per_length_rows, length_columns)
    args.out.with_suffix(".md").write_text(note + "\n\n" + table + "\n" + lengths_table)
    print(table)
    print(lengths_table)
    return 0
