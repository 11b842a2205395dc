"""GE executor slots on the simulated NPU: throughput with 2 slots against 1, time-shared.

For `simple` and the ResNet-18-sized CNN on one simulated device (`--device sim`),
`device_exec_blocks` 1 and 2 (streams on the device, each a slot with its own model copy
and onnxruntime session; intra-op threads = cores // slots unless `intra_op_thread_count`
is set). Dynamic batching is off (`--disable-auto-complete-config`), so every request is
one execution and the slots alone decide the concurrency on the device. Per model and
concurrency (default 1, 2 and 4, each a run of its own) the two servers, each with its
perf_analyzer over HTTP, and raw onnxruntime at batch 1 as one and as two sessions take
turns in slices (bench/lib/timeshare.py). Reported: infer/s over the time each ran, 2 slots
÷ 1 slot, and each ÷ raw onnxruntime's best, with 90 % intervals.

    python -m bench run slots --out bench/results/slots
    python -m bench run slots --out /tmp/s --models simple --concurrency 2 --cycles 3  # smoke

Writes OUT.json, OUT.md, OUT.png and OUT_slices.json (`--from-slices` summarises again).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from bench.lib.inputs import input_json_for
from bench.lib.models import CACHE, MODELS, RepoOptions, ensure_model, make_repo
from bench.lib.timeshare import Measured, RawContender, ServerContender
from bench.lib.timeshare_suite import (
    Group,
    ResultsLayout,
    command_line,
    raw_contenders,
    run_suite,
    suite_parser,
)
from bench.lib.timeshare_summary import add_arguments, versus_rows
from bench.lib.variants import Variant

PROG = "python -m bench run slots"
SLOTS = (1, 2)
RAW = "raw b"


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


def slot_name(count: int, concurrency: int) -> str:
    return f"{count} slot{'s' if count > 1 else ''} c{concurrency}"


def contenders(
    model: str,
    concurrency: int,
    raw_sizes: Sequence[int],
    raw_slots: Sequence[int],
) -> tuple[list[ServerContender], list[RawContender]]:
    """A server per slot count at `concurrency` ("2 slots c4"), and raw onnxruntime."""
    data = CACHE / "inputs" / f"{model}.json"
    servers = []
    for variant in variants([model], SLOTS):
        repo = make_repo(CACHE / "repos" / f"slots_{variant.name}", model, options=variant.options)
        input_json_for(repo / model, data)
        count = int(variant.options.params["device_exec_blocks"])
        servers.append(ServerContender(slot_name(count, concurrency), repo, variant.flags,
                                       model, "http", concurrency, data))  # fmt: skip
    onnx = ensure_model(model).onnx_path
    return servers, raw_contenders(RAW, onnx, raw_sizes, raw_slots)


def one_slot_for(contender: str) -> str:
    """The 1-slot server at the same concurrency ("2 slots c4" -> "1 slot c4")."""
    return slot_name(1, int(contender.rsplit(" c", 1)[1]))


def summarize(label: str, runs: Sequence[Measured]) -> list[dict[str, Any]]:
    """The rows of one model and concurrency (a run, or several pooled)."""
    model = label.split(" ", 1)[0]
    rows = versus_rows(runs, one_slot_for, "÷ 1 slot", raw_prefix=RAW)
    return [{"model": model, **row} for row in rows]


COLUMNS = ("model", "contender", "infer/s", "÷ 1 slot", "÷ 1 slot 90%", "÷ raw best",
           "÷ raw 90%", "threads lost", "slices", "raw best")  # fmt: skip
NOTE = (
    "Time-shared (bench/lib/timeshare.py): both servers and raw onnxruntime up, one running "
    "at a time in slices, in random order; GE backend on the simulated NPU, HTTP, batching "
    "off. Intervals: 90 % bootstrap over runs of consecutive cycles (timeshare.ratio_interval)."
)


LAYOUT = ResultsLayout(
    COLUMNS,
    [
        ("÷ 1 slot", "÷ 1 slot 90%", "2 slots ÷ 1 slot"),
        ("÷ raw best", "÷ raw 90%", "÷ raw onnxruntime's best"),
    ],
    plot_if=("÷ raw best",),
    title=lambda rows: "GE slots on the simulated NPU, time-shared, 90 % intervals",
    label=lambda row: f"{row['model']} {row['contender']}",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = suite_parser(PROG, __doc__)
    parser.add_argument("--models", nargs="+", default=["simple", "resnet18_like"], choices=MODELS)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--raw-sizes", type=int, nargs="*", default=[1])
    parser.add_argument("--raw-slots", type=int, nargs="+", default=[1, 2], metavar="N")
    add_arguments(parser, cycles=100, slice_s=0.6, warmup_s=6.0)
    args = parser.parse_args(argv)

    def groups() -> Iterator[Group]:
        for model in args.models:
            for concurrency in args.concurrency:
                servers, raws = contenders(model, concurrency, args.raw_sizes, args.raw_slots)
                yield f"{model} c{concurrency}", servers, raws

    return run_suite(args, command_line(PROG, argv), groups, summarize, LAYOUT.write, NOTE)
