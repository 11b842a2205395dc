"""The devices and streams of the simulated Ascend NPU (acl_sim.SimRuntime).

A SimDevice accounts its memory: every allocation (I/O buffers, model weights) counts
against its capacity, and one past it fails with an out-of-memory error naming what did
not fit. Device memory is real host memory behind fake device addresses, so copies to and
from the device really move the bytes. A SimStream is a worker thread that runs its queued
work in order, and reports a failed run on synchronize as ACL does.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .acl import (
    ACL_ERROR_INVALID_PARAM,
    ACL_ERROR_RT_INTERNAL_ERROR,
    AclError,
    Array,
    BusyClock,
    DeviceOutOfMemory,
)


def format_bytes(count: int) -> str:
    """`count` bytes for a person: 512 B, 1.5 KiB, 16.0 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return f"{count} B"


@dataclass(slots=True)
class Allocation:
    """One block of device memory: its fake address, size, the host bytes behind it, and
    what it holds (for out-of-memory messages)."""

    ptr: int
    size: int
    memory: Array
    what: str


class SimDevice:
    """One simulated NPU: memory accounting and busy time."""

    def __init__(self, device_id: int, capacity: int) -> None:
        self.device_id = device_id
        self.capacity = capacity
        self.clock = BusyClock()
        self._lock = threading.Lock()
        self._allocations: dict[int, Allocation] = {}
        self._next = (device_id + 1) << 40
        self.used = 0
        self.peak = 0
        self.bytes_h2d = 0
        self.bytes_d2h = 0

    def allocate(self, size: int, what: str, call: str) -> Allocation:
        if size <= 0:
            raise AclError(call, ACL_ERROR_INVALID_PARAM, f"cannot allocate {size} bytes")
        with self._lock:
            if self.used + size > self.capacity:
                raise DeviceOutOfMemory(
                    call,
                    f"simulated NPU {self.device_id} cannot fit {what} "
                    f"({format_bytes(size)}): {format_bytes(self.used)} of "
                    f"{format_bytes(self.capacity)} already in use (--sim-device-memory)",
                )
            ptr = self._next
            self._next += (size + 4095) // 4096 * 4096
            self.used += size
            self.peak = max(self.peak, self.used)
        allocation = Allocation(ptr, size, np.empty(size, dtype=np.uint8), what)
        with self._lock:
            self._allocations[ptr] = allocation
        return allocation

    def release(self, ptr: int, call: str) -> None:
        with self._lock:
            allocation = self._allocations.pop(ptr, None)
            if allocation is None:
                raise AclError(
                    call,
                    ACL_ERROR_INVALID_PARAM,
                    f"{ptr:#x} is not an allocation on NPU {self.device_id}",
                )
            self.used -= allocation.size

    def lookup(self, ptr: int, call: str) -> Allocation:
        allocation = self._allocations.get(ptr)
        if allocation is None:
            raise AclError(
                call,
                ACL_ERROR_INVALID_PARAM,
                f"{ptr:#x} is not device memory on NPU {self.device_id}",
            )
        return allocation

    def allocation_count(self) -> int:
        with self._lock:
            return len(self._allocations)


class SimStream:
    """A stream: one worker thread running queued work in order."""

    def __init__(self, device: SimDevice, index: int) -> None:
        self.device = device
        self.index = index
        self._worker = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"sim-npu{device.device_id}-stream{index}"
        )
        self._pending: list[concurrent.futures.Future[None]] = []

    def submit(self, work: Callable[[], None]) -> None:
        self._pending.append(self._worker.submit(work))

    def synchronize(self) -> None:
        pending, self._pending = self._pending, []
        failure: BaseException | None = None
        for future in pending:
            error = future.exception()
            if error is not None and failure is None:
                failure = error
        if failure is not None:
            if isinstance(failure, AclError):
                raise failure
            raise AclError(
                "aclrtSynchronizeStream (simulated)",
                ACL_ERROR_RT_INTERNAL_ERROR,
                f"model execution failed: {type(failure).__name__}: {failure}",
            ) from failure

    def close(self) -> None:
        self._worker.shutdown(wait=True)
