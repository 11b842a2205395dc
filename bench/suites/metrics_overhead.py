"""What metrics cost: throughput on `simple` at concurrency 16 over HTTP, metrics on against
off, time-shared.

Two ge-serve processes, one with the default metrics (summaries and histograms on) and one
with `--allow-metrics=false`, each driven by its own perf_analyzer, take turns in slices
(bench/lib/timeshare.py). The result is metrics on ÷ off with a 90 % interval. `--control`
adds a second metrics-on server: an A/A pair whose ratio is the noise floor of the method
in the same run (two servers of one setting measure a few per cent apart).

    python -m bench run metrics-overhead --control --out bench/results/metrics_overhead
    python -m bench run metrics-overhead --out /tmp/m --cycles 3                  # smoke

Writes OUT.json, OUT.md, OUT.png and OUT_slices.json (`--from-slices` summarises again).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.lib.inputs import input_json_for
from bench.lib.models import CACHE, EXAMPLES
from bench.lib.timeshare import Measured, ServerContender
from bench.lib.timeshare_suite import Group, ResultsLayout, command_line, run_suite, suite_parser
from bench.lib.timeshare_summary import add_arguments, versus_rows

PROG = "python -m bench run metrics-overhead"
MODEL = "simple"
FLAGS = ("--model-control-mode", "explicit", "--load-model", MODEL)
ON, OFF, TWIN = "metrics on", "metrics off", "metrics on'"


def contenders(concurrency: int, control: bool, data: Path) -> list[ServerContender]:
    """Metrics on and off, and with `control` a second metrics-on server."""
    configs = {ON: FLAGS, OFF: (*FLAGS, "--allow-metrics=false")}
    if control:
        configs[TWIN] = FLAGS
    return [
        ServerContender(name, EXAMPLES, flags, MODEL, "http", concurrency, data)
        for name, flags in configs.items()
    ]


def versus(name: str) -> str:
    """Metrics on against off; the control against its twin."""
    return ON if name == TWIN else OFF


def summarize(label: str, runs: Sequence[Measured]) -> list[dict[str, Any]]:
    rows = versus_rows(runs, versus, "ratio")
    for row in rows:
        row["load"] = label
        row["versus"] = versus(row["contender"]) if "ratio" in row else None
    return rows


COLUMNS = ("load", "contender", "infer/s", "versus", "ratio", "ratio 90%", "threads lost",
           "slices")  # fmt: skip
NOTE = (
    "Time-shared (bench/lib/timeshare.py): every server up, one running at a time in slices, "
    "in random order. `ratio`: this server's throughput ÷ `versus`'s (metrics on ÷ off; the "
    "A/A control, metrics on' ÷ metrics on, is the method's noise floor). Intervals: 90 % "
    "bootstrap over runs of consecutive cycles (timeshare.ratio_interval)."
)


LAYOUT = ResultsLayout(
    COLUMNS,
    [("ratio", "ratio 90%", "throughput ratio")],
    plot_if=("ratio",),
    title=lambda rows: f"metrics overhead: {rows[0]['load']}, time-shared, 90 % intervals",
    label=lambda row: f"{row['contender']} ÷ {row['versus']}",
    only_plotted=True,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = suite_parser(PROG, __doc__)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--control", action="store_true", help="add the A/A control")
    add_arguments(parser, cycles=150, slice_s=0.6, warmup_s=6.0)
    args = parser.parse_args(argv)

    def groups() -> Iterator[Group]:
        data = input_json_for(EXAMPLES / MODEL, CACHE / "inputs" / f"{MODEL}.json")
        label = f"{MODEL} http c{args.concurrency}"
        yield label, contenders(args.concurrency, args.control, data), []

    return run_suite(args, command_line(PROG, argv), groups, summarize, LAYOUT.write, NOTE)
