"""The loads that take turns in a time-shared run (timeshare.py): each a set of processes
frozen with SIGSTOP between its turns, and a counter of the work it has done.

* `ServerLoad`: a ge-serve process and a perf_analyzer driving it at a fixed concurrency;
  the work is the model's `inference_count` from the statistics extension.
* `RawLoad`: raw onnxruntime at one batch size (bench/lib/raw_worker.py), samples done.
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
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from bench.lib.perfa import build_command
from bench.lib.raw_worker import COUNTER_BYTES, COUNTER_FORMAT
from bench.lib.server import REPO_ROOT, ServerProcess


class Contender(Protocol):
    name: str

    def count(self) -> float: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...


class FrozenLoad(ABC):
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


class ServerLoad(FrozenLoad):
    """A perf_analyzer at `concurrency` against one running server (which this contender
    owns for the run: it freezes the server too). Starts frozen, perf_analyzer not yet
    connected: its startup happens in its first turns, so that no contender waits frozen
    while the others start (see timeshare.MAX_FROZEN_S)."""

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
        extra_args: Sequence[str] = (),
        use_async: bool = False,
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
            extra_args, measurement_interval_ms=int(window_s * 1000), max_trials=1,
            stability_percentage=1000, shared_memory=shared_memory, use_async=use_async,
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


class RawLoad(FrozenLoad):
    """Raw onnxruntime at `batch`, back to back, in bench/lib/raw_worker.py. Starts running
    (loading its model); `warm` pauses it once it counts."""

    def __init__(
        self, name: str, model: Path, batch: int, workdir: Path, slots: int = 1, int_high: int = 16
    ) -> None:
        self.name = name
        safe = "".join(ch if ch.isalnum() else "_" for ch in name)
        self._path = workdir / f"{safe}.counter"
        worker = [sys.executable, "-m", "bench.lib.raw_worker", str(model), str(batch)]
        # The worker imports bench.lib: put this checkout first on its path.
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        options = ["--slots", str(slots), "--int-high", str(int_high)]
        self._worker = subprocess.Popen([*worker, str(self._path), *options], env=env)
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
