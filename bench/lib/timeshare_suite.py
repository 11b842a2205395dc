"""The glue a time-shared suite's `main` shares with the others: the parser's common part,
the loop that runs each group of contenders and keeps every run's slices as it ends,
`--from-slices` (summarise saved runs again), and writing the table and the interval plot.

A suite supplies what is its own: its groups of contenders (one label each), how a label's
runs become rows, and the layout of its results.

    parser = suite_parser(PROG, __doc__)
    ...
    return run_suite(args, command_line(PROG, argv), groups, summarize, LAYOUT.write, NOTE)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.report import Row, plot_intervals, write_table
from bench.lib.timeshare import (
    MAX_FROZEN_S,
    Measured,
    RawContender,
    ServerContender,
    load_runs,
    run_contenders,
    save_runs,
)
from bench.lib.timeshare_summary import stop_on_sigterm

# One group of contenders that take turns: (label, servers, raw onnxruntime).
Group = tuple[str, Sequence[ServerContender], Sequence[RawContender]]
# A label's runs (one, or several pooled) as the table's rows.
Summarize = Callable[[str, Sequence[Measured]], list[dict[str, Any]]]
WriteResults = Callable[[Sequence[dict[str, Any]], Path, str], None]


def suite_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser with the suite's first docstring paragraph and the --out every suite takes."""
    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="path prefix for the results")
    return parser


def command_line(prog: str, argv: Sequence[str] | None) -> str:
    """The command as a user would type it, for the results' note."""
    return " ".join([prog, *(sys.argv[1:] if argv is None else argv)])


def slices_path(out: Path) -> Path:
    """OUT_slices.json: every slice of every run, for `--from-slices`."""
    return out.with_name(out.name + "_slices.json")


def raw_contenders(
    prefix: str, onnx: Path, sizes: Sequence[int], slots: Sequence[int] = (1,)
) -> list[RawContender]:
    """Raw onnxruntime per batch size and session count ("raw b8", "raw b8 x2")."""
    return [
        RawContender(f"{prefix}{size}" + (f" x{n}" if n > 1 else ""), onnx, size, n)
        for size in sizes
        for n in slots
    ]


def log_for(label: str) -> Callable[[str], None]:
    """The runner's progress lines, on stderr, prefixed with the group's label."""

    def log(line: str) -> None:
        print(f"[{label}] {line}", file=sys.stderr, flush=True)

    return log


def run_suite(
    args: argparse.Namespace,
    command: str,
    groups: Callable[[], Iterable[Group]],
    summarize: Summarize,
    write_results: WriteResults,
    note: str,
) -> int:
    """With `--from-slices`, the saved runs summarised again; else each of `groups` run in
    turn (made only when its turn comes), its slices saved as it ends, then the results.
    `args` carries add_arguments' options and --out."""
    if args.from_slices is not None:
        rows = [r for label, runs in load_runs(args.from_slices).items()
                for r in summarize(label, runs)]  # fmt: skip
        write_results(rows, args.out, f"`{command}`: summarised again. {note}")
        return 0
    stop_on_sigterm()
    started = time.monotonic()
    measured: dict[str, Measured] = {}
    rows = []
    for label, servers, raws in groups():
        found = run_contenders(servers, raws, args.cycles, args.slice_s, args.warmup_s,
                               MAX_FROZEN_S, log_for(label))  # fmt: skip
        measured[label] = found
        save_runs(measured, slices_path(args.out))
        rows += summarize(label, [found])
    write_results(rows, args.out, f"`{command}`, {time.monotonic() - started:.0f} s. {note}")
    return 0


@dataclass(frozen=True, slots=True)
class ResultsLayout:
    """How a suite's rows are written: OUT.json and OUT.md with `columns`, and OUT.png with
    one interval panel per (value key, interval key, axis title) of `panels`, drawn when a
    row has a value under one of `plot_if`. `label` names a row on the plot; `only_plotted`
    leaves the rows without any `plot_if` value off it."""

    columns: Sequence[str]
    panels: Sequence[tuple[str, str, str]]
    plot_if: Sequence[str]
    title: Callable[[Sequence[Row]], str]
    label: Callable[[Row], str] = lambda row: str(row["contender"])
    only_plotted: bool = False

    def write(self, rows: Sequence[dict[str, Any]], out: Path, note: str) -> None:
        write_table(rows, out, self.columns, note)
        if not any(key in r for r in rows for key in self.plot_if):
            return
        shown = (
            [r for r in rows if any(k in r for k in self.plot_if)] if self.only_plotted else rows
        )
        labelled = [{**r, "label": self.label(r)} for r in shown]
        plot_intervals(labelled, out.with_suffix(".png"), "label", self.panels, self.title(rows))
