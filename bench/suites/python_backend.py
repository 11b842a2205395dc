"""What a Python-backend model costs: Triton's python_backend `add_sub` example against the
same computation as an ONNX model, at concurrency 1 and 16, time-shared.

Two ge-serve processes, each serving one `add_sub` (FP32 [4] INPUT0, INPUT1 -> OUTPUT0 =
sum, OUTPUT1 = difference, no batching, one CPU instance): one the Python model of
tests/pymodels.py (python_backend's example, its `execute` in a worker process, tensors
through shared memory), the other an ONNX graph of an Add and a Sub on onnxruntime. Each is
driven by its own perf_analyzer; they take turns in slices (bench/lib/timeshare.py). The
result is Python ÷ ONNX throughput with a 90 % interval, per concurrency; at c=1, one
request at a time, 1 / infer/s is the time per request, so the ratio also reads as how many
times longer a request takes.

    python -m bench run python-backend --out bench/results/python_backend
    python -m bench run python-backend --out /tmp/p --cycles 4 --concurrency 1   # smoke

Writes OUT.json, OUT.md, OUT.png and OUT_slices.json (`--from-slices` summarises again).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper

from bench.lib.inputs import input_json_for
from bench.lib.models import CACHE, REPO_ROOT
from bench.lib.timeshare import Measured, ServerContender
from bench.lib.timeshare_suite import Group, ResultsLayout, command_line, run_suite, suite_parser
from bench.lib.timeshare_summary import add_arguments, versus_rows

# tests/ is not a package: its Python models are the python_backend examples' behaviour.
if str(REPO_ROOT / "tests") not in sys.path:
    sys.path.append(str(REPO_ROOT / "tests"))

import pymodels

PROG = "python -m bench run python-backend"
MODEL = "add_sub"
PYTHON, ONNX = "python", "onnx"

ONNX_CONFIG = """name: "add_sub"
backend: "onnxruntime"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
instance_group [{ kind: KIND_CPU count: 1 }]
"""


def add_sub_onnx() -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, FP32 [4]."""

    def value(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [4])

    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        MODEL,
        [value("INPUT0"), value("INPUT1")],
        [value("OUTPUT0"), value("OUTPUT1")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_repos(root: Path) -> dict[str, Path]:
    """The two repositories, each holding one `add_sub`; rewritten on every run."""
    python = root / PYTHON
    pymodels.write(python, MODEL)
    onnx_repo = root / ONNX
    folder = onnx_repo / MODEL / "1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(add_sub_onnx().SerializeToString())
    (onnx_repo / MODEL / "config.pbtxt").write_text(ONNX_CONFIG)
    return {PYTHON: python, ONNX: onnx_repo}


def contenders(
    repos: dict[str, Path], protocol: str, concurrency: int, data: Path
) -> list[ServerContender]:
    return [
        ServerContender(name, repo, (), MODEL, protocol, concurrency, data)
        for name, repo in repos.items()
    ]


def versus(name: str) -> str | None:
    return ONNX if name == PYTHON else None


def summarize(label: str, runs: Sequence[Measured]) -> list[dict[str, Any]]:
    rows = versus_rows(runs, versus, "ratio")
    for row in rows:
        row["load"] = label
        row["versus"] = versus(row["contender"])
        if label.endswith(" c1") and row["infer/s"] > 0:
            row["us/request"] = 1e6 / row["infer/s"]
    return rows


COLUMNS = ("load", "contender", "infer/s", "us/request", "versus", "ratio", "ratio 90%",
           "threads lost", "slices")  # fmt: skip
NOTE = (
    "Time-shared (bench/lib/timeshare.py): both servers up, one running at a time in slices, "
    "in random order. `ratio`: the Python model's throughput ÷ the ONNX model's, same "
    "computation (add_sub, FP32 [4], no batching, one instance). `us/request` at c=1 is "
    "1 / infer/s: one request at a time, end to end. Intervals: 90 % bootstrap over runs of "
    "consecutive cycles (timeshare.ratio_interval)."
)

LAYOUT = ResultsLayout(
    COLUMNS,
    [("ratio", "ratio 90%", "throughput ratio")],
    plot_if=("ratio",),
    title=lambda rows: "Python backend ÷ ONNX, add_sub, time-shared, 90 % intervals",
    label=lambda row: f"{row['load']}: {row['contender']} ÷ {row['versus']}",
    only_plotted=True,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = suite_parser(PROG, __doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    add_arguments(parser, cycles=120, slice_s=0.6, warmup_s=6.0)
    args = parser.parse_args(argv)

    def groups() -> Iterator[Group]:
        repos = write_repos(CACHE / "repos" / "python_backend")
        data = input_json_for(repos[ONNX] / MODEL, CACHE / "inputs" / "add_sub_fp32x4.json")
        for concurrency in args.concurrency:
            label = f"{MODEL} {args.protocol} c{concurrency}"
            yield label, contenders(repos, args.protocol, concurrency, data), []

    return run_suite(args, command_line(PROG, argv), groups, summarize, LAYOUT.write, NOTE)
