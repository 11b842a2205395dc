"""Time-shared measurement: contenders take turns on the machine in short slices.

On these shared 2-core machines the speed swings by up to 2x, in phases of ~5-30 s: raw
onnxruntime on `simple` at batch 8, timed per quarter second, sat at ~0.85x its median for
half a minute, then ~1.8x for the next. Two configurations measured one after the other
then compare the phases they fell in as much as themselves; 36 s windows in rotating order
still gave single rounds of 0.79-1.38 for identical settings.

Here every contender is up at once but only one runs: the others are frozen (SIGSTOP).
Each cycle every contender runs one slice (0.6-1 s), in an order drawn at random, so
each samples the machine's phases alike and the comparison shares them. A contender is a
load and a counter of work done:

* `ServerLoad`: a ge-serve process and a perf_analyzer driving it at a fixed concurrency;
  the work is the model's `inference_count` from the statistics extension.
* `RawLoad`: raw onnxruntime at one batch size (bench/raw_worker.py), samples done.

A contender's throughput is its work over the time it ran: the counter read right after
each resume and right before each pause. Nothing moves while it is frozen, so what it does
between a read and the pause (a request in flight, half a batch) is counted at its next
read, and the sum over slices telescopes to the work done in the time it ran.

What it cannot remove is the difference between two servers: on `simple` over HTTP, where
every static setting runs the same batches of 8, they came out up to ~4 % apart in 150
cycles, and which one led changed between runs. Compare against that spread (an A/A pair
of identical servers in the same run shows it), not against zero. Limits:

* No contender may stay frozen 5 s or more (`max_frozen_s`; first in one cycle and last
  in the next, up to 2 x (contenders - 1) x slice):
  uvicorn closes a keep-alive connection idle for 5 s, and on resuming it can close one
  whose next request is already waiting; perf_analyzer's worker thread for that connection
  then exits without a word (a failed request ends a sync worker). Frozen 6 s at a time, a
  c=1 perf_analyzer stopped within 4 turns; with uvicorn's timeout raised to 600 s it ran
  25 such turns, and frozen 3-4.4 s, 25-40 turns.
  Runs of 7 contenders at 0.6 s slices (frozen up to 7.2 s) lost both c=1 workers and
  one of a c=32 perf_analyzer's 32; `ServerLoad.threads_lost()` reports any such loss.
* The adaptive controller sees a pause inside an execution as a long execution (its cost
  model counts at most twice its estimate) and a pause between requests as a lull (its
  rates forget within ~0.5 s). With executions far shorter than a slice that is one
  execution in thousands; with a CNN's ~0.7 s batches it is a large share of them, so each
  server's mean batch size is reported (`ServerLoad.mean_batch`) to compare with a steady run.

    with ServerLoad("static0", srv, "simple", "http", 32, data, tool, workdir) as a, \\
         RawLoad("raw b8", onnx, 8, workdir) as b:
        slices = take_turns([a, b], cycles=100, slice_s=1.0)
    work = {name: slice_work(s) for name, s in slices.items()}
    rate(work["static0"]), ratio_interval(work["static0"], work["raw b8"])
"""

from __future__ import annotations

import contextlib
import http.client
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, Protocol, Self

import numpy as np
from perfa import build_command
from raw_worker import COUNTER_BYTES, COUNTER_FORMAT

from server import ServerProcess

HERE = Path(__file__).resolve().parent
# The longest a contender may stay frozen: under uvicorn's 5 s keep-alive timeout.
MAX_FROZEN_S = 4.9


class Slice(NamedTuple):
    """One turn: when it resumed and paused (monotonic s), the counter read right after
    resuming and right before pausing."""

    resumed: float
    paused: float
    count_at_start: float
    count_at_end: float


class Contender(Protocol):
    name: str

    def count(self) -> float: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...


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
    numerator: Sequence[tuple[float, float]],
    denominator: Sequence[tuple[float, float]],
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
    anti-correlated (lag-1 autocorrelation -0.14 to -0.36 on the CNN at 32 clients, where
    a 3 s slice holds a few batches). Resampled one by one, cycles break that pairing up
    and the interval comes out wider than the run's real spread; within a run of cycles
    the errors cancel, as they do in the point estimate."""
    cycles = min(len(numerator), len(denominator))
    if cycles == 0:
        raise ValueError("no slices")
    if block is None:
        block = max(1, round(cycles ** (1 / 3)))
    block = min(max(block, 1), cycles)
    a = np.asarray(numerator[:cycles], dtype=float)
    b = np.asarray(denominator[:cycles], dtype=float)
    runs = -(-cycles // block)
    starts = np.random.default_rng(seed).integers(0, cycles, size=(draws, runs, 1))
    picks = ((starts + np.arange(block)) % cycles).reshape(draws, runs * block)[:, :cycles]
    ratios = (a[picks, 0].sum(1) / a[picks, 1].sum(1)) / (b[picks, 0].sum(1) / b[picks, 1].sum(1))
    tail = (1 - coverage) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


class _Frozen(ABC):
    """Pause/resume for a set of processes: paused in the given order, resumed in reverse
    (so a load generator stops before its server and starts after it)."""

    name: str
    _pids: list[int]

    def pause(self) -> None:
        for pid in self._pids:
            os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in reversed(self._pids):
            os.kill(pid, signal.SIGCONT)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    @abstractmethod
    def close(self) -> None: ...


class ServerLoad(_Frozen):
    """A perf_analyzer at `concurrency` against one running server (which this contender
    owns for the run: it freezes the server too). Starts frozen, perf_analyzer not yet
    connected: its startup happens in its first turns, so that no contender waits frozen
    while the others start (see MAX_FROZEN_S)."""

    def __init__(
        self,
        name: str,
        server: ServerProcess,
        model: str,
        protocol: str,
        concurrency: int,
        input_data: Path,
        perf_analyzer: tuple[str, dict[str, str]],
        workdir: Path,
        shared_memory: str = "none",
        window_s: float = 86_400,
    ) -> None:
        self.name, self.model, self.server = name, model, server
        host, port = server.http_url.rsplit(":", 1)
        self._stats = http.client.HTTPConnection(host, int(port), timeout=30)
        binary, env = perf_analyzer
        url = server.grpc_url if protocol == "grpc" else server.http_url
        safe = "".join(ch if ch.isalnum() else "_" for ch in name)
        self._log_path = workdir / f"perf_analyzer_{safe}.log"
        # One window far longer than the run: it is killed at the end, never reports.
        command = build_command(
            binary, model, url, protocol, concurrency, workdir / f"{safe}.csv", input_data,
            measurement_interval_ms=int(window_s * 1000), max_trials=1,
            stability_percentage=1000, shared_memory=shared_memory,
        )  # fmt: skip
        with self._log_path.open("w") as log:
            self._load = subprocess.Popen(command, env=env, cwd=workdir, stdout=log, stderr=log)
        self._pids = [self._load.pid, server.process.pid]
        self.pause()
        self._since: tuple[int, int] | None = None
        self._last: tuple[int, int] | None = None
        self._threads: int | None = None

    def count(self) -> float:
        """Samples the model has inferred (all versions), from the statistics extension."""
        samples, executions = self._read()
        if self._since is None:
            self._since = (samples, executions)
        self._last = (samples, executions)
        return float(samples)

    def mean_batch(self) -> float | None:
        """Samples per execution between the first read since `restart_batches()` and the
        last read."""
        if self._since is None or self._last is None or self._last[1] == self._since[1]:
            return None
        return (self._last[0] - self._since[0]) / (self._last[1] - self._since[1])

    def restart_batches(self) -> None:
        self._since = None

    def _read(self) -> tuple[int, int]:
        """(inference_count, execution_count) over all versions. Uvicorn drops idle
        keep-alive connections, and a frozen one is idle: reconnect."""
        for attempt in range(3):
            try:
                self._stats.request("GET", f"/v2/models/{self.model}/stats")
                response = self._stats.getresponse()
                body = response.read()
                if response.status != 200:
                    raise RuntimeError(f"{self.name}: stats answered {response.status}: {body!r}")
                found = json.loads(body)["model_stats"]
                return (sum(int(v["inference_count"]) for v in found),
                        sum(int(v["execution_count"]) for v in found))  # fmt: skip
            except (ConnectionError, http.client.HTTPException):
                self._stats.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def threads(self) -> int:
        """perf_analyzer's thread count (Linux): one per concurrent request, and the main one."""
        status = Path(f"/proc/{self._load.pid}/status").read_text()
        return int(status.split("Threads:", 1)[1].split()[0])

    def mark_threads(self) -> None:
        """Remember the thread count now (after warm-up), for `threads_lost`."""
        self._threads = self.threads()

    def threads_lost(self) -> int:
        """perf_analyzer's threads gone since `mark_threads`. A worker whose request failed
        exits alone, silently, and the load runs on at a lower concurrency."""
        return 0 if self._threads is None else max(0, self._threads - self.threads())

    def check(self) -> None:
        """Raise if perf_analyzer has exited (it only ends by being killed)."""
        if self._load.poll() is not None:
            output = self._log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name}: perf_analyzer exited {self._load.returncode}:\n"
                               f"{output}")  # fmt: skip

    def close(self) -> None:
        """Kill perf_analyzer; leave the server running (its owner stops it)."""
        self._stats.close()
        if self._load.poll() is None:
            self._load.kill()
        for pid in self._pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._load.wait()


class RawLoad(_Frozen):
    """Raw onnxruntime at `batch`, back to back, in bench/raw_worker.py. Starts running
    (loading its model); `warm` pauses it once it counts."""

    def __init__(self, name: str, model: Path, batch: int, workdir: Path, slots: int = 1) -> None:
        self.name = name
        safe = "".join(ch if ch.isalnum() else "_" for ch in name)
        self._path = workdir / f"{safe}.counter"
        worker = [sys.executable, str(HERE / "raw_worker.py"), str(model), str(batch)]
        self._worker = subprocess.Popen([*worker, str(self._path), "--slots", str(slots)])
        self._pids = [self._worker.pid]
        self._counter: mmap.mmap | None = None

    def count(self) -> float:
        if self._counter is None:
            deadline = time.monotonic() + 120
            while not self._path.exists():
                if self._worker.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}: the raw worker did not start")
                time.sleep(0.05)
            with self._path.open("rb") as file:
                self._counter = mmap.mmap(file.fileno(), COUNTER_BYTES, prot=mmap.PROT_READ)
        return float(struct.unpack(COUNTER_FORMAT, self._counter[:COUNTER_BYTES])[0])

    def check(self) -> None:
        if self._worker.poll() is not None:
            raise RuntimeError(f"{self.name}: the raw worker exited {self._worker.returncode}")

    def close(self) -> None:
        if self._worker.poll() is None:
            self._worker.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._worker.pid, signal.SIGCONT)
        self._worker.wait()
        if self._counter is not None:
            self._counter.close()


def warm(contender: Contender, seconds: float) -> None:
    """Let one contender run alone for `seconds` once it counts, then pause it."""
    contender.resume()
    try:
        contender.count()
        time.sleep(seconds)
    finally:
        contender.pause()


def slices_to_json(slices: Mapping[str, Sequence[Slice]]) -> dict[str, list[list[float]]]:
    return {name: [list(s) for s in found] for name, found in slices.items()}


def slices_from_json(saved: Mapping[str, Any]) -> dict[str, list[Slice]]:
    return {name: [Slice(*map(float, s)) for s in found] for name, found in saved.items()}
