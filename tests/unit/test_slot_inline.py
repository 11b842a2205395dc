"""Which thread an executor slot runs a job on: short jobs of a thread-free executor run on
the event loop's thread; long jobs, and every job of an executor bound to its thread, run
on the slot's."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from ge_serve.backends.base import SlotInfo
from ge_serve.scheduler.dispatch import ExecutorSlot, SlotPool

Array = Any


class ThreadRecorder:
    """Records the thread each execution ran on; spins `cost_s` of CPU time per run."""

    def __init__(self, cost_s: float = 0.0) -> None:
        self.slot = SlotInfo(name="rec", device="cpu")
        self.threads: list[str] = []
        self.cost_s = cost_s

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.threads.append(threading.current_thread().name)
        end = time.thread_time() + self.cost_s
        while time.thread_time() < end:
            pass
        return {"y": inputs["x"]}

    def close(self) -> None:
        pass


async def _run(pool: SlotPool, count: int) -> None:
    x = np.zeros((1, 2), dtype=np.float32)
    for _ in range(count):
        slot = await pool.acquire()
        out = await pool.run_on_slot(slot, lambda ex: ex.execute({"x": x}))
        assert out["y"] is x


async def test_short_jobs_of_a_thread_free_executor_run_on_the_loop_thread() -> None:
    executor = ThreadRecorder()
    pool = SlotPool([ExecutorSlot(executor, inline=True)])
    await _run(pool, 10)
    await pool.shutdown(RuntimeError("closed"), time.monotonic() + 10.0, "test")
    loop_thread = threading.current_thread().name
    # The first runs on the slot thread (nothing is known of its cost yet).
    assert executor.threads[0].startswith("slot-")
    assert executor.threads[-5:] == [loop_thread] * 5


async def test_a_thread_bound_executor_always_runs_on_its_slot_thread() -> None:
    executor = ThreadRecorder()
    pool = SlotPool([ExecutorSlot(executor)])
    await _run(pool, 10)
    await pool.shutdown(RuntimeError("closed"), time.monotonic() + 10.0, "test")
    assert all(name.startswith("slot-") for name in executor.threads)


async def test_long_jobs_stay_on_the_slot_thread() -> None:
    executor = ThreadRecorder(cost_s=0.003)  # above what may block the loop
    pool = SlotPool([ExecutorSlot(executor, inline=True)])
    await _run(pool, 8)
    await pool.shutdown(RuntimeError("closed"), time.monotonic() + 10.0, "test")
    assert all(name.startswith("slot-") for name in executor.threads)


async def test_a_failing_inline_job_reports_its_error() -> None:
    executor = ThreadRecorder()
    pool = SlotPool([ExecutorSlot(executor, inline=True)])
    await _run(pool, 3)

    def broken(ex: Any) -> None:
        raise ValueError("bad input")

    slot = await pool.acquire()
    with pytest.raises(ValueError, match="bad input"):
        await pool.run_on_slot(slot, broken)
    assert pool.idle_count == 1  # the slot went back to the pool
    await _run(pool, 1)
    await pool.shutdown(RuntimeError("closed"), time.monotonic() + 10.0, "test")
    assert executor.threads[-1] == threading.current_thread().name


async def test_inline_jobs_that_grow_long_go_back_to_the_slot_thread() -> None:
    executor = ThreadRecorder()
    pool = SlotPool([ExecutorSlot(executor, inline=True)])
    await _run(pool, 10)
    loop_thread = threading.current_thread().name
    assert executor.threads[-1] == loop_thread
    executor.cost_s = 0.003  # above what may block the loop
    await _run(pool, 20)
    await pool.shutdown(RuntimeError("closed"), time.monotonic() + 10.0, "test")
    # Sampled, so a few more run inline before the averages cross; never most of them.
    assert executor.threads[-5:] == [executor.threads[-1]] * 5
    assert executor.threads[-1].startswith("slot-")
