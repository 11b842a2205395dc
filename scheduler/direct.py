"""The default scheduler (no `dynamic_batching`): one request, one execution.

Concurrency comes from the free slots; requests wait for a slot in arrival order. With
shape buckets or batch inputs, each request is shaped as its batch of one (batch.Shaper).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from ge_serve.server.errors import SchedulerClosed

from .batch import Shaper, execute_batch
from .dispatch import SlotPool
from .inflight import InFlight
from .work import Array, WorkItem

log = logging.getLogger(__name__)


class DirectScheduler:
    def __init__(
        self,
        pool: SlotPool,
        gears: Sequence[int] = (),
        batching: bool = False,
        shaper: Shaper | None = None,
    ) -> None:
        self._pool = pool
        self._shaper = shaper
        self._gears = tuple(gears)
        self._batching = batching
        self._in_flight = InFlight()
        # Requests waiting for a slot: Triton's pending count ends as execution starts.
        self._waiting = 0

    @property
    def pending(self) -> int:
        """Requests accepted and not yet executing (the ones in flight are counted apart,
        for the drain on close)."""
        return self._waiting

    async def submit(self, item: WorkItem) -> dict[str, Array]:
        shaper = self._shaper
        bucket = shaper.assign(item) if shaper is not None else 0  # raises: fits none
        in_flight = self._in_flight
        in_flight.admit()
        try:
            item.enqueue_ns = item.enqueue_ns or time.monotonic_ns()
            self._waiting += 1
            try:
                slot = await self._pool.acquire()
            finally:
                self._waiting -= 1
            item.timings.queue_ns = time.monotonic_ns() - item.enqueue_ns
            gears, batching = self._gears, self._batching
            results = await self._pool.run_on_slot(
                slot, lambda ex: execute_batch(ex, [item], gears, batching, shaper, bucket)
            )
            return results[0]
        finally:
            in_flight.leave()

    async def close(self, drain_timeout_s: float) -> None:
        """Refuse new work, drain within the timeout, then close and join every slot.

        Requests still waiting for a slot after the timeout fail with UNAVAILABLE; the
        ones already executing finish before their slot's thread closes its executor.
        """
        deadline = time.monotonic() + drain_timeout_s  # one wait for the drain and the join
        await self._in_flight.close(drain_timeout_s)
        await self._pool.shutdown(
            SchedulerClosed("model was unloaded before the request could run"),
            deadline,
            "a model",
        )
