"""HTTP against gRPC and gRPC streaming on `simple`, with raw onnxruntime as the reference,
time-shared.

Per concurrency (default 1 and 16, each a run of its own, so that at most 5 contenders
take turns): one server per protocol serving `simple` (examples/models), each driven by
its own perf_analyzer (`--streaming` for gRPC streaming, which needs its async mode), and
raw onnxruntime at batch 1 and 8, all taking turns in slices (bench/lib/timeshare.py).
Reported per contender: infer/s over the time it ran, ÷ HTTP at the same concurrency, ÷
raw onnxruntime's best size and ÷ raw at batch 1 (`simple` has no dynamic batching here, so
each request is one batch-1 execution: the ratio is what the front end costs), each with
a 90 % interval. At one client, mean latency = 1 ÷ throughput; no percentiles (the latency
suite profiles p50 and p99).

    python -m bench run protocols --out bench/results/protocols
    python -m bench run protocols --out /tmp/p --cycles 3                    # smoke

Writes OUT.json, OUT.md, OUT.png and OUT_slices.json (`--from-slices` summarises again).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.lib.inputs import input_json_for
from bench.lib.models import CACHE, EXAMPLES, ensure_model
from bench.lib.timeshare import Measured, RawContender, ServerContender
from bench.lib.timeshare_suite import (
    Group,
    ResultsLayout,
    command_line,
    raw_contenders,
    run_suite,
    suite_parser,
)
from bench.lib.timeshare_summary import Pooled, add_arguments, versus_rows

PROG = "python -m bench run protocols"
MODEL = "simple"
FLAGS = ("--model-control-mode", "explicit", "--load-model", MODEL)
# (contender prefix, protocol, perf_analyzer's extra arguments, async mode)
PROTOCOLS: tuple[tuple[str, str, tuple[str, ...], bool], ...] = (
    ("http", "http", (), False),
    ("grpc", "grpc", (), False),
    ("grpc-stream", "grpc", ("--streaming",), True),
)
RAW = "raw b"
RAW_SIZES = (1, 8)


def contenders(
    concurrency: int, protocols: Sequence[str], data: Path, raw_sizes: Sequence[int]
) -> tuple[list[ServerContender], list[RawContender]]:
    """One server per protocol at `concurrency` ("grpc c16"), and raw onnxruntime."""
    servers = [
        ServerContender(f"{name} c{concurrency}", EXAMPLES, FLAGS, MODEL, protocol,
                        concurrency, data, extra_args=extra, use_async=use_async)
        for name, protocol, extra, use_async in PROTOCOLS
        if name in protocols
    ]  # fmt: skip
    onnx = ensure_model(MODEL).onnx_path
    return servers, raw_contenders(RAW, onnx, raw_sizes)


def http_for(contender: str) -> str:
    """The HTTP contender at the same concurrency ("grpc c16" -> "http c16")."""
    return "http c" + contender.rsplit(" c", 1)[1]


def summarize(label: str, runs: Sequence[Measured]) -> list[dict[str, Any]]:
    """The rows of one concurrency's run (or several, pooled)."""
    rows = versus_rows(runs, http_for, "÷ http", raw_prefix=RAW)
    pooled = Pooled(runs)
    raw_b1 = f"{RAW}1"
    for row in rows:
        name = row["contender"]
        row["concurrency"] = label
        if raw_b1 in pooled.rates and not name.startswith(RAW):
            row["÷ raw b1"] = pooled.rates[name] / pooled.rates[raw_b1]
            row["÷ raw b1 90%"] = pooled.interval(name, raw_b1)
    return rows


COLUMNS = ("concurrency", "contender", "infer/s", "÷ http", "÷ http 90%", "÷ raw best",
           "÷ raw 90%", "÷ raw b1", "÷ raw b1 90%", "threads lost", "slices",
           "raw best")  # fmt: skip
NOTE = (
    "Time-shared (bench/lib/timeshare.py): every server and raw onnxruntime up, one running "
    "at a time in slices, in random order. Intervals: 90 % bootstrap over runs of "
    "consecutive cycles (timeshare.ratio_interval)."
)


LAYOUT = ResultsLayout(
    COLUMNS,
    [
        ("÷ http", "÷ http 90%", "÷ HTTP at the same concurrency"),
        ("÷ raw b1", "÷ raw b1 90%", "÷ raw onnxruntime at batch 1"),
    ],
    plot_if=("÷ http",),
    title=lambda rows: f"{MODEL}: protocols, time-shared, 90 % intervals",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = suite_parser(PROG, __doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument(
        "--protocols", nargs="+", default=[p[0] for p in PROTOCOLS],
        choices=[p[0] for p in PROTOCOLS],
    )  # fmt: skip
    parser.add_argument("--raw-sizes", type=int, nargs="*", default=list(RAW_SIZES))
    add_arguments(parser, cycles=150, slice_s=0.6, warmup_s=6.0)
    args = parser.parse_args(argv)

    def groups() -> Iterator[Group]:
        data = input_json_for(EXAMPLES / MODEL, CACHE / "inputs" / f"{MODEL}.json")
        for concurrency in args.concurrency:
            servers, raws = contenders(concurrency, args.protocols, data, args.raw_sizes)
            yield f"c{concurrency}", servers, raws

    return run_suite(args, command_line(PROG, argv), groups, summarize, LAYOUT.write, NOTE)
