"""The batch former: the task that turns a model's queue into batches on idle slots.

It waits for a first request, then for an idle slot, and only then forms the batch:
requests keep piling up while every slot is busy, so batches grow with load on their own.
With a slot in hand it describes the batch that could go now (a `BatchView`: the queue's
leading requests of the head's shape, in the queue's order of priority, then arrival)
and asks the decider (decision.py) whether it goes. A `WaitUntil` with a target holds
until that many samples are queued behind the same head (of its key, counted by the
census where there is one) or its deadline passes; the former then sleeps without
asking again.

What a request of another shape does to that batch depends on who decides. Under
Triton's rules (`closes_on_shape_change`) it closes the batch: the batch can grow no
further in queue order, so it is `full` and goes now (its preferred part first), and
the newcomer heads the next batch, as Triton's dynamic batcher does. The adaptive
controller, and shape buckets, look past it (up to SCAN_LIMIT requests) for more
requests of the head's shape: the controller already bounds every wait by its latency
budget, and closing a batch at every shape change would leave mixed traffic unbatched.

For the adaptive controller the view also says how many requests of the head's key may
still arrive to join the batch (`joinable`, from the batcher's `ShapeCensus`): only
those are worth waiting for.

For a decider that sees the device, the view also lists the batches executing on the
other slots of the slot's device (`SlotPool.beside`). While the batch waits for those,
the end of any execution on that device (`slot_freed`) makes the former ask again: the
device may have freed sooner than the decider expected.

The DynamicBatcher owns the former; it hands each batch back through `launch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from ge_serve.server.errors import ErrorCode, ServerError

from .census import ShapeCensus
from .decision import BatchView, Decider, Take, WaitUntil
from .dispatch import ExecutorSlot, SlotPool
from .policy import BatchPolicy
from .queue import Entry, RequestQueue

log = logging.getLogger(__name__)

# How many requests of another shape the batch former looks past when it fills a batch.
SCAN_LIMIT = 256


class Finish(Protocol):
    """How the former answers a request it drops: a cancelled one, or all on a failure."""

    def __call__(self, entry: Entry, *, error: BaseException | None = ...) -> None: ...


class BatchFormer:
    """Forms one model's batches from `queue` onto `pool`'s slots, and hands each to
    `launch` with its slot. `delay_count` (TRITONSERVER_DELAY_SCHEDULER) holds batching
    until that many requests are queued, once, so that tests can observe exact batches.
    `closing` says whether the batcher is closing (a former ending then is no failure)."""

    def __init__(
        self,
        queue: RequestQueue,
        pool: SlotPool,
        policy: BatchPolicy,
        decider: Decider,
        launch: Callable[[ExecutorSlot, list[Entry]], None],
        finish: Finish,
        closing: Callable[[], bool],
        delay_count: int = 0,
        max_batch: Callable[[int], int] | None = None,
        closes_on_shape_change: bool = False,
        census: ShapeCensus | None = None,
    ) -> None:
        self._queue = queue
        # Per key, who is in the server and who may still arrive (census.py): the view
        # says how many of the head's key may join. None: the decider does not ask.
        self._census = census
        self._closes_on_shape_change = closes_on_shape_change
        self._pool = pool
        self._policy = policy
        # The largest batch of a shape bucket, when its gears fix it (0: no such limit).
        self._max_batch = max_batch
        self._decider = decider
        self._launch = launch
        self._finish = finish
        self._closing = closing
        # Requests to wait for before the first batch (delay_count); 0 once reached.
        self.hold = max(delay_count, 0)
        # The held answer for the batch forming on the slot in hand, with its head, and
        # what reaches its target: that many samples queued (without a census), or that
        # many of the head's key come (census.came).
        self._held: tuple[Entry, WaitUntil, int] | None = None
        # The device of the slot in hand while its batch waits for other slots'
        # executions there: when one of them ends, the decider is asked again.
        self._device_wait: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None

    def queued(self) -> None:
        """A request was queued: start the former if it is not running, and wake it."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._form_batches(), name="batcher"
            )
            self._task.add_done_callback(self._ended)
        self.wake()

    async def stop(self) -> None:
        """Cancel the former and wait for it to end."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The batch former only ends when cancelled at close. Should a bug end it, the
        queued requests get an error instead of waiting forever, and the next request
        starts a new former."""
        if task.cancelled() or self._closing():
            return
        exc = task.exception()
        log.error("the batcher of model '%s' stopped: %r", self._policy.model, exc)
        self._task = None
        error = ServerError(ErrorCode.INTERNAL, f"batcher failed: {exc!r}")
        for entry in self._queue.drain():
            self._finish(entry, error=error)

    def slot_freed(self, slot: ExecutorSlot) -> None:
        """An execution on `slot` ended and the slot is back in the pool: when the batch
        forming waits for that device, look again (the device frees)."""
        if self._device_wait is not None and slot.device == self._device_wait:
            self._device_wait = None
            self._held = None
            self.wake()

    def reordered(self) -> None:
        """A queued request moved (DELAY): the held target, which counts samples behind
        the same head, no longer tells what the decider would answer."""
        self._held = None
        self.wake()

    def wake(self) -> None:
        """Make the former look at the queue again (it changed)."""
        waiter = self._wake
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _sleep(self, until_ns: int | None) -> None:
        """Wait for a new request (or any other wake-up), or until `until_ns`."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._wake = waiter
        timer = None
        if until_ns is not None:
            delay_s = max(until_ns - time.monotonic_ns(), 0) / 1e9
            timer = loop.call_later(delay_s, _resolve, waiter)
        try:
            await waiter
        finally:
            self._wake = None
            if timer is not None:
                timer.cancel()

    async def _form_batches(self) -> None:
        while True:
            if not self._queue:
                await self._sleep(None)
                continue
            if self.hold:
                if len(self._queue) < self.hold:
                    await self._sleep(None)
                    continue
                self.hold = 0
            slot = await self._pool.acquire()
            try:
                batch = await self._collect(slot)
            except BaseException:
                self._pool.release(slot, executed=False)
                raise
            if batch:
                self._launch(slot, batch)
            else:
                self._pool.release(slot, executed=False)
            # The loop sleeps next, maybe for long: a batch still bound here would keep
            # its requests' tensors and results alive until the next batch.
            del batch

    async def _collect(self, slot: ExecutorSlot) -> list[Entry]:
        """With `slot` in hand: wait until a batch should go, then take it off the queue."""
        idle_since = time.monotonic_ns()
        self._held = None
        self._device_wait = None
        queue = self._queue
        while queue:
            now = time.monotonic_ns()
            held = self._held
            census = self._census
            if (
                held is not None
                and now < held[1].deadline_ns
                and (queue.samples if census is None else census.came(held[0].key)) < held[2]
                and queue.first() is held[0]
            ):
                # Still short of the held target, with the same head: what the decider
                # would answer, without going through the queue.
                await self._sleep(held[1].deadline_ns)
                continue
            batch, wake_ns = self._decide(now, idle_since, slot)
            if batch:
                self._held = None
                self._device_wait = None
                for entry in batch:
                    queue.remove(entry)
                return batch
            await self._sleep(wake_ns)
        self._held = None
        self._device_wait = None
        return []

    def _decide(
        self, now: int, idle_since: int, slot: ExecutorSlot
    ) -> tuple[list[Entry], int | None]:
        """The batch to send now on `slot`, or nothing and when to look again
        (`idle_since`: when the slot was taken).

        The candidates follow the queue's order (priority, then arrival), starting from
        its first request and taking only requests of the same shape, up to the largest
        size the model can run; under `closes_on_shape_change`, only up to the first
        request of another shape.
        """
        max_size = self._policy.max_size
        chosen: list[Entry] = []
        totals: list[int] = []
        cancelled: list[Entry] = []
        total = 0
        full = False
        skipped = 0
        key: object = None
        oldest = now
        level = 0
        head = 0  # samples of the head's own level
        for entry in self._queue:
            if entry.cancelled:
                cancelled.append(entry)
                continue
            if not chosen:
                key = entry.key
                level = entry.level
                if self._max_batch is not None:
                    max_size = min(max_size, self._max_batch(entry.bucket) or max_size)
            elif entry.key != key:
                if self._closes_on_shape_change:
                    full = True  # it cannot join: the batch goes as it is
                    break
                skipped += 1
                if skipped > SCAN_LIMIT:
                    break
                continue
            if total + entry.size > max_size:
                full = True
                break
            chosen.append(entry)
            total += entry.size
            totals.append(total)
            if entry.enqueue_ns < oldest:
                oldest = entry.enqueue_ns
            if entry.level == level:
                head += entry.size
            if total >= max_size:
                full = True
                break
        for entry in cancelled:
            if self._queue.remove(entry):
                self._finish(entry)
        if not chosen:
            return [], None
        decider = self._decider
        on_device = self._pool.beside(slot) if decider.sees_device else ()
        census = self._census
        joinable = census.outside(key) if census is not None else -1
        view = BatchView(
            totals=totals,
            oldest_ns=oldest,
            level=level,
            head_samples=head,
            idle_slots=self._pool.idle_count,
            idle_since_ns=idle_since,
            full=full,
            head=chosen[0],
            bucket=chosen[0].bucket,
            on_device=on_device,
            joinable=joinable,
        )
        answer = decider.decide(view, now)
        if type(answer) is Take:
            return _fit(chosen, answer.samples), None
        assert isinstance(answer, WaitUntil)
        if not answer.target:
            self._held = None
        elif census is None:
            self._held = (chosen[0], answer, answer.target)
        else:
            # Only requests of the head's key bring the batch to its target.
            self._held = (chosen[0], answer, census.came(key) + answer.target - total)
        self._device_wait = slot.device if on_device else None
        return [], answer.deadline_ns


def _fit(chosen: list[Entry], limit: int) -> list[Entry]:
    """The leading requests that fit in `limit` samples (always at least one)."""
    total = 0
    for count, entry in enumerate(chosen):
        total += entry.size
        if total > limit:
            return chosen[: max(count, 1)]
    return chosen


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
