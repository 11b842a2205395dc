"""Time-shared measurement: contenders take turns on the machine in short slices.

The shared machines' speed swings by up to 2x, in phases of seconds to tens of seconds. Two
configurations measured one after the other then compare the phases they fell in as much as
themselves, and rotating them over rounds still leaves single rounds of identical settings
far apart (bench/RESULTS.md, "Method"). This is the bench's one way of comparing
configurations.

Here every contender is up at once but only one runs: the others are frozen (SIGSTOP).
Each cycle every contender runs one slice, in an order drawn at random, so each samples the
machine's phases alike and the comparison shares them. A contender is a load and a counter
of work done (frozen_loads.py): a ge-serve process with the perf_analyzer that drives it
(`ServerLoad`), or raw onnxruntime at one batch size (`RawLoad`).

A contender's throughput is its work over the time it ran: the counter read right after
each resume and right before each pause. Nothing moves while it is frozen, so what it does
between a read and the pause (a request in flight, half a batch) is counted at its next
read, and the sum over slices telescopes to the work done in the time it ran.

What it cannot remove is the difference between two servers: two servers of one setting
measure a few per cent apart, and which one leads changes between runs. Compare against
that spread (an A/A pair of identical servers in the same run shows it), not against zero.
Limits:

* No contender may stay frozen 5 s or more (`max_frozen_s`; first in one cycle and last
  in the next, up to 2 x (contenders - 1) x slice): uvicorn closes a keep-alive connection
  idle for 5 s, and on resuming it can close one whose next request is already waiting;
  perf_analyzer's worker thread for that connection then exits without a word (a failed
  request ends a sync worker), and the load runs on at a lower concurrency.
  `ServerLoad.threads_lost()` reports any such loss. gRPC connections survive longer
  freezes, so a gRPC-only run may raise the limit for longer slices.
* The adaptive controller sees a pause inside an execution as a long execution and a pause
  between requests as a lull. With executions far shorter than a slice that is one
  execution in thousands; with executions near a slice's length it is a large share of
  them, so each server's mean batch size is reported (`ServerLoad.mean_batch`) to compare
  with a steady run, and such models need slices of several executions.

`run_contenders` does a whole run: it starts the servers and raw workers, warms them up,
takes turns and returns every contender's slices; `slice_work`, `rate` and `ratio_interval`
(or `pooled_ratio_interval` over several runs) turn those into figures, and
timeshare_summary.py into the suites' tables:

    measured = run_contenders(
        [ServerContender("static0", repo, [], "simple", "http", 32, data)],
        [RawContender("raw b8", onnx, 8)], cycles=100, slice_s=0.6, warmup_s=6)
    work = {name: slice_work(s) for name, s in measured.slices.items()}
    rate(work["static0"]), ratio_interval(work["static0"], work["raw b8"])
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from bench.lib.frozen_loads import Contender, RawLoad, ServerLoad, warm
from bench.lib.perfa import find_perf_analyzer, server_flags
from bench.lib.server import grpc_ready, serve

# The longest a contender may stay frozen: under uvicorn's 5 s keep-alive timeout.
MAX_FROZEN_S = 4.9

Work = Sequence[tuple[float, float]]  # (work, seconds run) per slice


class Slice(NamedTuple):
    """One turn: when it resumed and paused (monotonic s), the counter read right after
    resuming and right before pausing."""

    resumed: float
    paused: float
    count_at_start: float
    count_at_end: float


def take_turns(
    contenders: Sequence[Contender],
    cycles: int,
    slice_s: float,
    log: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    max_frozen_s: float = MAX_FROZEN_S,
    seed: int = 0,
) -> dict[str, list[Slice]]:
    """Run `cycles` cycles; in each, every contender (all paused on entry, paused again on
    return) runs one slice of `slice_s`, in an order drawn at random (seeded) each cycle:
    so every contender follows each of the others, and waits as long, equally often. (A
    fixed rotation gives each contender its own neighbours and gaps.)"""
    slices: dict[str, list[Slice]] = {c.name: [] for c in contenders}
    if len(slices) != len(contenders):
        raise ValueError("contender names must be unique")
    # The first of one cycle can be the last of the next: it waits for everyone twice.
    frozen = 2 * (len(contenders) - 1) * slice_s
    if frozen > max_frozen_s:
        raise ValueError(
            f"{len(contenders)} contenders with {slice_s} s slices stay frozen {frozen:.1f} s,"
            f" over {max_frozen_s} s (see timeshare.py): use shorter slices or fewer contenders"
        )
    orders = np.random.default_rng(seed)
    for cycle in range(cycles):
        for index in orders.permutation(len(contenders)):
            contender = contenders[int(index)]
            contender.resume()
            resumed = clock()
            try:
                start = contender.count()
                sleep(max(0.0, resumed + slice_s - clock()))
                end = contender.count()
            finally:
                contender.pause()
            slices[contender.name].append(Slice(resumed, clock(), start, end))
        if log is not None and (cycle + 1) % 10 == 0:
            rates = ", ".join(f"{n} {rate(slice_work(s)):.1f}" for n, s in slices.items())
            log(f"cycle {cycle + 1}/{cycles}: {rates}")
    return slices


def slice_work(slices: Sequence[Slice]) -> list[tuple[float, float]]:
    """(work, seconds run) per slice. A slice's work runs from its first read to the next
    slice's first read (nothing moves in between but its own tail), the last one's to its
    own final read; its time from resume to pause."""
    work: list[tuple[float, float]] = []
    for index, part in enumerate(slices):
        following = slices[index + 1].count_at_start if index + 1 < len(slices) else None
        done = (part.count_at_end if following is None else following) - part.count_at_start
        work.append((done, part.paused - part.resumed))
    return work


def rate(work: Sequence[tuple[float, float]]) -> float:
    """Work per second run over all slices."""
    seconds = sum(s for _, s in work)
    return sum(w for w, _ in work) / seconds if seconds > 0 else 0.0


def ratio_interval(
    numerator: Work,
    denominator: Work,
    draws: int = 2000,
    coverage: float = 0.9,
    seed: int = 0,
    block: int | None = None,
) -> tuple[float, float]:
    """A bootstrap interval of rate(numerator) ÷ rate(denominator): cycles resampled with
    replacement, the two contenders' slices of a cycle kept together, in runs of `block`
    consecutive cycles (a circular moving-block bootstrap; by default cycles ** (1/3),
    rounded, 3 for 40 cycles).

    Why runs: neighbouring cycles are not independent. What a slice leaves unfinished (a
    batch in flight at the pause) is counted in its contender's next slice, so one slice
    reads high where the one before read low, and the ratios of neighbouring cycles are
    anti-correlated (most with slices of a few executions). Resampled one by one, cycles
    break that pairing up and the interval comes out wider than the run's real spread;
    within a run of cycles the errors cancel, as they do in the point estimate."""
    return pooled_ratio_interval([(numerator, denominator)], draws, coverage, seed, block)


def pooled_ratio_interval(
    runs: Sequence[tuple[Work, Work]],
    draws: int = 2000,
    coverage: float = 0.9,
    seed: int = 0,
    block: int | None = None,
) -> tuple[float, float]:
    """`ratio_interval` over several runs of the same contenders: each run's cycles are
    resampled within that run (a block never spans two runs, which started from different
    machine states), and the resampled work and time are summed over the runs, as the
    pooled point estimate sums them. With one run it is `ratio_interval`."""
    rng = np.random.default_rng(seed)
    totals = np.zeros((4, draws))
    for numerator, denominator in runs:
        cycles = min(len(numerator), len(denominator))
        if cycles == 0:
            raise ValueError("no slices")
        size = max(1, round(cycles ** (1 / 3))) if block is None else block
        size = min(max(size, 1), cycles)
        a = np.asarray(numerator[:cycles], dtype=float)
        b = np.asarray(denominator[:cycles], dtype=float)
        count = -(-cycles // size)
        starts = rng.integers(0, cycles, size=(draws, count, 1))
        picks = ((starts + np.arange(size)) % cycles).reshape(draws, count * size)[:, :cycles]
        totals += np.stack(
            [a[picks, 0].sum(1), a[picks, 1].sum(1), b[picks, 0].sum(1), b[picks, 1].sum(1)]
        )
    ratios = (totals[0] / totals[1]) / (totals[2] / totals[3])
    tail = (1 - coverage) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


def slices_to_json(slices: Mapping[str, Sequence[Slice]]) -> dict[str, list[list[float]]]:
    return {name: [list(s) for s in found] for name, found in slices.items()}


def slices_from_json(saved: Mapping[str, Any]) -> dict[str, list[Slice]]:
    return {name: [Slice(*map(float, s)) for s in found] for name, found in saved.items()}


@dataclass(frozen=True)
class ServerContender:
    """A server contender of `run_contenders`: ge-serve on `repos` with `flags`, and a
    perf_analyzer at `concurrency` over `protocol` (`extra_args` and `use_async` passed on
    to it, e.g. ["--streaming"] with use_async=True) on `model` with `input_data`."""

    name: str
    repos: Path | Sequence[Path]
    flags: Sequence[str]
    model: str
    protocol: str
    concurrency: int
    input_data: Path
    shared_memory: str = "none"
    extra_args: Sequence[str] = ()
    use_async: bool = False


@dataclass(frozen=True)
class RawContender:
    """A raw onnxruntime contender: `model` at `batch`, as `slots` sessions in parallel,
    integer inputs drawn from [0, int_high)."""

    name: str
    model: Path
    batch: int
    slots: int = 1
    int_high: int = 16


class Measured(NamedTuple):
    """One run: every contender's slices, each server's mean batch, and the perf_analyzer
    load threads that died during the run (the load then ran at a lower concurrency)."""

    slices: dict[str, list[Slice]]
    mean_batch: dict[str, float | None]
    threads_lost: dict[str, int]


def run_contenders(
    servers: Sequence[ServerContender],
    raws: Sequence[RawContender],
    cycles: int,
    slice_s: float,
    warmup_s: float,
    max_frozen_s: float = MAX_FROZEN_S,
    log: Callable[[str], None] | None = None,
) -> Measured:
    """One time-shared run: start every server (idle), then the raw workers (each paused
    once it counts), then the loads, which start frozen, so that nothing waits frozen while
    another starts; take turns for `warmup_s` per contender uncounted, then `cycles` cycles
    of `slice_s` slices. Every process started is ended on return or on an exception."""
    tool = find_perf_analyzer()
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="timeshare-")))
        running = []
        for spec in servers:
            flags = [*spec.flags, *server_flags(spec.shared_memory)]
            server = stack.enter_context(serve(spec.repos, flags))
            if spec.protocol == "grpc" and not grpc_ready(server, 10.0):
                raise RuntimeError(f"{spec.name}: gRPC did not come up")
            running.append((spec, server))
        raw_loads: list[RawLoad] = []
        for raw_spec in raws:
            spec_args = (raw_spec.model, raw_spec.batch, workdir, raw_spec.slots)
            raw = stack.enter_context(RawLoad(raw_spec.name, *spec_args, raw_spec.int_high))
            warm(raw, 0.5)
            raw_loads.append(raw)
        loads = [
            stack.enter_context(
                ServerLoad(spec.name, server, spec.model, spec.protocol, spec.concurrency,
                           spec.input_data, tool, workdir, shared_memory=spec.shared_memory,
                           extra_args=spec.extra_args, use_async=spec.use_async)
            )
            for spec, server in running
        ]  # fmt: skip
        contenders: list[ServerLoad | RawLoad] = [*loads, *raw_loads]
        warmup = max(1, round(warmup_s / slice_s))
        if log is not None:
            log(f"{len(contenders)} contenders: {warmup} cycles of warm-up, then {cycles} "
                f"cycles of {slice_s} s slices")  # fmt: skip
        take_turns(contenders, warmup, slice_s, max_frozen_s=max_frozen_s)
        for load in loads:
            load.mark_threads()
            load.restart_batches()
        slices = take_turns(contenders, cycles, slice_s, log=log, max_frozen_s=max_frozen_s)
        for contender in contenders:
            contender.check()  # a load that died would read as slow
        lost = {load.name: load.threads_lost() for load in loads}
        if any(lost.values()) and log is not None:
            log(f"perf_analyzer threads lost (the load ran on at a lower concurrency): {lost}")
        return Measured(slices, {load.name: load.mean_batch() for load in loads}, lost)


def measured_to_json(measured: Measured) -> dict[str, Any]:
    return {
        "slices": slices_to_json(measured.slices),
        "mean batch": measured.mean_batch,
        "threads lost": measured.threads_lost,
    }


def measured_from_json(saved: Mapping[str, Any]) -> Measured:
    return Measured(
        slices_from_json(saved["slices"]),
        dict(saved.get("mean batch") or {}),
        dict(saved.get("threads lost") or {}),
    )


def save_runs(runs: Mapping[str, Measured], path: Path) -> None:
    """OUT_slices.json: {label: a run's slices, mean batches and threads lost}; rewritten
    as each run ends, so that a stopped run keeps what it measured."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: measured_to_json(m) for k, m in runs.items()}) + "\n")


def load_runs(paths: Sequence[Path]) -> dict[str, list[Measured]]:
    """The runs of one or more OUT_slices.json files, by label, in the order given: a label
    found in several files is one experiment run several times, to be pooled."""
    found: dict[str, list[Measured]] = {}
    for path in paths:
        for label, saved in json.loads(path.read_text()).items():
            found.setdefault(label, []).append(measured_from_json(saved))
    return found
