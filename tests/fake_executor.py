"""A fake Executor for scheduler tests: records every batch and runs only when allowed.

Tests hold executions with `block()` and let them go one at a time with `allow()`, or all
with `open()`; they learn that an execution started by awaiting `started()`. Nothing here
sleeps to synchronise: the slot thread waits on a semaphore the test controls.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ge_serve.backends.base import SlotInfo
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.adaptive import AdaptiveController
from ge_serve.scheduler.batcher import DynamicBatcher
from ge_serve.scheduler.dispatch import ExecutorSlot, SlotPool
from ge_serve.scheduler.policy import BatchPolicy
from ge_serve.scheduler.work import WorkItem

Array = npt.NDArray[Any]

GATE_TIMEOUT_S = 20.0


class Gate:
    """When a fake model's executions may run: each reports its start (`started()`) and,
    unless the gate is open, waits on the slot thread for the test's `allow()`."""

    def __init__(self, blocked: bool = False) -> None:
        self._loop = asyncio.get_running_loop()
        self._started: asyncio.Queue[int] = asyncio.Queue()
        self._permits = threading.Semaphore(0)
        self._open = threading.Event()
        if not blocked:
            self._open.set()

    def block(self) -> None:
        self._open.clear()

    def allow(self, count: int = 1) -> None:
        self._permits.release(count)

    def open(self) -> None:
        self._open.set()
        self._permits.release(1000)

    async def started(self) -> int:
        """Wait for the next execution to start; returns its batch size."""
        return await asyncio.wait_for(self._started.get(), GATE_TIMEOUT_S)

    def enter(self, batch_size: int) -> None:
        """On the slot thread, as an execution starts: report it, and wait for its turn."""
        self._loop.call_soon_threadsafe(self._started.put_nowait, batch_size)
        if not self._open.is_set() and not self._permits.acquire(timeout=GATE_TIMEOUT_S):
            raise RuntimeError("the test never let this execution run")


class FakeExecutor(Gate):
    def __init__(
        self,
        name: str = "fake",
        blocked: bool = False,
        cost_s: float = 0.0,
        device: str = "cpu",
        serial: bool = False,
    ) -> None:
        """`device`, `serial`: where the slot says it runs (SlotInfo); nothing here
        serialises executions, the test's gates decide when each ends."""
        super().__init__(blocked)
        self.slot = SlotInfo(name=name, device=device, serial=serial)
        # Each execution's input rows ("x", first column), in execution order.
        self.batches: list[list[float]] = []
        self.shapes: list[tuple[int, ...]] = []
        self.cost_s = cost_s
        self.closed = False

    @property
    def sizes(self) -> list[int]:
        return [len(rows) for rows in self.batches]

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        x = inputs["x"]
        self.batches.append([float(v) for v in x.reshape(x.shape[0], -1)[:, 0]])
        self.shapes.append(tuple(x.shape))
        self.enter(x.shape[0])
        if self.cost_s:
            time.sleep(self.cost_s)  # stands in for compute time; not synchronisation
        return {"y": x * 2, "n": np.full((x.shape[0], 1), x.shape[0], dtype=np.int64)}

    def close(self) -> None:
        self.closed = True


POISON = 13.0


class Poisoned(FakeExecutor):
    """Fails any execution whose rows include POISON (after its gate lets it end), as a
    graph fails on one value."""

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        outputs = super().execute(inputs)
        if (inputs["x"] == POISON).any():
            raise RuntimeError(f"cannot take {POISON}")
        return outputs


def make_config(
    max_batch_size: int = 8,
    preferred: Sequence[int] = (),
    delay_us: int = 0,
    priority_levels: int = 0,
    default_level: int = 0,
    preserve_ordering: bool = False,
    parameters: Mapping[str, str] | None = None,
) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig(name="m", max_batch_size=max_batch_size)
    dyn = config.dynamic_batching
    dyn.SetInParent()
    dyn.preferred_batch_size.extend(preferred)
    dyn.max_queue_delay_microseconds = delay_us
    dyn.priority_levels = priority_levels
    dyn.default_priority_level = default_level
    dyn.preserve_ordering = preserve_ordering
    for key, value in (parameters or {}).items():
        config.parameters[key].string_value = value
    return config


_TIMEOUT_ACTIONS = {
    "REJECT": model_config_pb2.ModelQueuePolicy.REJECT,
    "DELAY": model_config_pb2.ModelQueuePolicy.DELAY,
}


def set_policy(
    config: model_config_pb2.ModelConfig,
    level: int | None,
    action: str = "REJECT",
    timeout_us: int = 0,
    allow_override: bool = False,
    max_queue_size: int = 0,
) -> None:
    """Set the default queue policy (level None) or one level's."""
    dyn = config.dynamic_batching
    policy = dyn.default_queue_policy if level is None else dyn.priority_queue_policy[level]
    # The enum wrapper's Value() is typed as a bare int; the field wants the enum member.
    policy.timeout_action = _TIMEOUT_ACTIONS[action]
    policy.default_timeout_microseconds = timeout_us
    policy.allow_timeout_override = allow_override
    policy.max_queue_size = max_queue_size


def make_batcher(
    config: model_config_pb2.ModelConfig,
    executors: Sequence[FakeExecutor],
    gears: Sequence[int] = (),
    delay_count: int = 0,
) -> DynamicBatcher:
    policy = BatchPolicy.from_config(config, gears)
    controller = AdaptiveController(policy, gears) if policy.adaptive else None
    pool = SlotPool([ExecutorSlot(executor) for executor in executors])
    return DynamicBatcher(pool, policy, gears, controller, delay_count)


def item(
    value: float, rows: int = 1, width: int = 4, priority: int = 0, timeout_us: int = 0
) -> WorkItem:
    x = np.full((rows, width), value, dtype=np.float32)
    return WorkItem(inputs={"x": x}, batch_size=rows, priority=priority, timeout_us=timeout_us)


async def queued(batcher: DynamicBatcher, count: int) -> None:
    """Yield to the loop until `count` requests sit in the batcher's queues (bounded)."""
    for _ in range(1000):
        if sum(batcher.queue_depths().values()) == count:
            return
        await asyncio.sleep(0)  # a bare yield, so submitted tasks reach the queue
    raise AssertionError(f"expected {count} queued, have {batcher.queue_depths()}")
