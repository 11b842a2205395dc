"""Host and device resource sampling for the metrics endpoint, every --metrics-interval-ms.

Sampling runs on its own thread, so device queries (pyACL on real NPUs) never run on the
event loop; a scrape only reads the latest snapshot.

A backend exposes its devices by having a `device_metrics()` method
(`DeviceMetricsProvider`); it needs to import nothing from here, since the protocols are
structural.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import psutil

log = logging.getLogger(__name__)


class DeviceMetrics(Protocol):
    """One device's figures; any object with these attributes will do."""

    @property
    def device(self) -> str:
        """The label value, e.g. "npu0" or "sim0"."""
        ...

    @property
    def utilization(self) -> float:
        """Busy fraction, 0.0 to 1.0, since the previous call; negative when unknown."""
        ...

    @property
    def memory_used_bytes(self) -> int: ...

    @property
    def memory_total_bytes(self) -> int: ...

    @property
    def pool_bytes(self) -> int:
        """Bytes held by buffer pools (reusable I/O buffers), part of the memory used."""
        ...


@runtime_checkable
class DeviceMetricsProvider(Protocol):
    def device_metrics(self) -> Sequence[DeviceMetrics]:
        """Called from the sampler thread once per interval; must be thread-safe."""
        ...


@dataclass(frozen=True, slots=True)
class DeviceSample:
    device: str
    utilization: float
    memory_used_bytes: int
    memory_total_bytes: int
    pool_bytes: int
    # The cost model's profile when the device's execution time is modelled, else "".
    simulated_timing: str = ""
    # Graph executions on the device so far (one per graph run: a batch split across
    # instance_exec_blocks graphs counts once per graph); -1 when the device cannot say.
    executions: int = -1


@dataclass(frozen=True, slots=True)
class ResourceSnapshot:
    cpu_utilization: float | None = None
    cpu_memory_total_bytes: int | None = None
    cpu_memory_used_bytes: int | None = None
    devices: tuple[DeviceSample, ...] = ()


class ResourceSampler:
    """Samples CPU, host memory and devices on a thread; `snapshot` is the latest result."""

    def __init__(
        self,
        interval_s: float,
        cpu: bool = True,
        providers: Sequence[DeviceMetricsProvider] = (),
    ) -> None:
        self.interval_s = max(0.01, interval_s)
        self.cpu = cpu
        self.providers = list(providers)
        self.snapshot = ResourceSnapshot()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing: set[int] = set()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="metrics-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        if self.cpu:
            psutil.cpu_percent(None)  # the first reading only starts the interval
        self.sample()
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        cpu_util = total = used = None
        if self.cpu:
            try:
                cpu_util = psutil.cpu_percent(None) / 100.0
                memory = psutil.virtual_memory()
                total, used = int(memory.total), int(memory.total - memory.available)
            except Exception:
                log.exception("reading CPU metrics failed")
        devices: list[DeviceSample] = []
        for index, provider in enumerate(self.providers):
            try:
                for stats in provider.device_metrics():
                    devices.append(
                        DeviceSample(
                            device=str(stats.device),
                            utilization=float(stats.utilization),
                            memory_used_bytes=int(stats.memory_used_bytes),
                            memory_total_bytes=int(stats.memory_total_bytes),
                            pool_bytes=int(stats.pool_bytes),
                            simulated_timing=str(getattr(stats, "simulated_timing", "")),
                            executions=int(getattr(stats, "executions", -1)),
                        )
                    )
                self._failing.discard(index)
            except Exception:
                if index not in self._failing:  # say it once, not every interval
                    log.exception("reading device metrics from %r failed", provider)
                    self._failing.add(index)
        # One reference swap: a scrape on the loop sees the old or the new snapshot whole.
        self.snapshot = ResourceSnapshot(cpu_util, total, used, tuple(devices))
