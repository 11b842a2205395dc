"""From time-shared runs (timeshare.Measured) to the suites' tables: `Pooled` reads one
or several runs of the same contenders as one, `versus_rows` gives each contender's
throughput ÷ raw onnxruntime's best and ÷ the contender it is compared with, each with its
interval; and the options and signal handling every time-shared suite shares."""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from bench.lib.timeshare import MAX_FROZEN_S, Measured, pooled_ratio_interval, rate, slice_work


def interval_text(low_high: tuple[float, float]) -> str:
    return f"{low_high[0]:.3f}-{low_high[1]:.3f}"


class Pooled:
    """Several runs of the same contenders (or one) read as one: rates over all their
    slices, intervals resampling each run's cycles within that run."""

    def __init__(self, runs: Sequence[Measured]) -> None:
        self.runs = list(runs)
        self.names = list(dict.fromkeys(name for run in runs for name in run.slices))
        self._work = [{n: slice_work(found) for n, found in run.slices.items()} for run in runs]
        self.rates = {
            name: rate([w for run in self._work for w in run.get(name, [])]) for name in self.names
        }

    def slices(self, name: str) -> int:
        return sum(len(run.get(name, [])) for run in self._work)

    def interval(self, numerator: str, denominator: str) -> str:
        """The 90 % interval of rate(numerator) ÷ rate(denominator), as table text."""
        pairs = [(r[numerator], r[denominator]) for r in self._work
                 if numerator in r and denominator in r]  # fmt: skip
        return interval_text(pooled_ratio_interval(pairs))

    def best(self, prefix: str) -> str | None:
        """The fastest contender whose name starts with `prefix` (e.g. the raw ones)."""
        found = [n for n in self.names if n.startswith(prefix)]
        return max(found, key=lambda n: self.rates[n]) if found else None

    def mean_batch(self, name: str) -> float | str | None:
        """The server's mean batch: one run's, or each run's in order."""
        batches = [run.mean_batch.get(name) for run in self.runs]
        if len(batches) == 1 or all(b is None for b in batches):
            return batches[0] if batches else None
        return " / ".join("" if b is None else f"{b:.2f}" for b in batches)

    def threads_lost(self, name: str) -> int | None:
        lost = [run.threads_lost[name] for run in self.runs if name in run.threads_lost]
        return sum(lost) if lost else None


def versus_rows(
    runs: Sequence[Measured],
    versus: Callable[[str], str | None],
    versus_key: str,
    raw_prefix: str = "raw ",
) -> list[dict[str, Any]]:
    """Per contender: its infer/s; ÷ the fastest raw contender (`raw_prefix`) with its
    interval; ÷ the contender `versus(name)` names (if any, and not itself) as `versus_key`
    with its interval; mean batch, threads lost and slices."""
    pooled = Pooled(runs)
    raw_best = pooled.best(raw_prefix)
    rows: list[dict[str, Any]] = []
    for name in pooled.names:
        value = pooled.rates[name]
        row: dict[str, Any] = {"contender": name, "infer/s": value}
        raw = name.startswith(raw_prefix)
        if raw_best is not None and not raw:
            row["÷ raw best"] = value / pooled.rates[raw_best]
            row["÷ raw 90%"] = pooled.interval(name, raw_best)
        other = None if raw else versus(name)
        if other is not None and other != name and other in pooled.rates:
            row[versus_key] = value / pooled.rates[other]
            row[f"{versus_key} 90%"] = pooled.interval(name, other)
        row["mean batch"] = pooled.mean_batch(name)
        row["threads lost"] = pooled.threads_lost(name)
        row["slices"] = pooled.slices(name)
        row["raw best"] = raw_best
        rows.append(row)
    return rows


def add_arguments(
    parser: argparse.ArgumentParser, cycles: int, slice_s: float, warmup_s: float
) -> None:
    """The options every time-shared suite takes: --cycles, --slice-s, --warmup-s and
    --from-slices."""
    parser.add_argument("--cycles", type=int, default=cycles)
    parser.add_argument(
        "--slice-s", type=float, default=slice_s,
        help=f"2 x (contenders - 1) x slice: at most {MAX_FROZEN_S} s",
    )  # fmt: skip
    parser.add_argument(
        "--warmup-s", type=float, default=warmup_s, help="per contender: turns taken, not counted"
    )
    parser.add_argument(
        "--from-slices", type=Path, nargs="+", metavar="SLICES_JSON",
        help="measure nothing: summarise saved runs again (one label in several files: pooled)",
    )  # fmt: skip


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds the `with` blocks: every process started ends


def stop_on_sigterm() -> None:
    """Make SIGTERM stop a run as Ctrl-C does, ending every process it started."""
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
