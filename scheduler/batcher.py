"""The dynamic batcher: priority queues in, batches out to idle executor slots.

`submit()` queues synchronously (no await before the request is in the queue) and wakes
the batch former (former.py), the task that waits for an idle slot and decides when a
batch goes and what it holds. The batch runs on the slot's thread; the results come back
to the loop through the slot's report callback, the slot goes straight back to the pool,
and the batcher answers each request, in arrival order under `preserve_ordering`.

In adaptive mode the batcher keeps the controller's event log (eventlog.py), and a
request that finds the system empty, a slot idle and nothing worth waiting for skips all
of that and runs on the slot at once, as the default scheduler would run it
(`_run_alone`): at low load that is every request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from ge_serve.backends.base import ShapeRejected
from ge_serve.server.errors import (
    ErrorCode,
    FailureReason,
    SchedulerClosed,
    ServerError,
    request_timeout,
)

from .adaptive import AdaptiveController
from .batch import execute_batch
from .dispatch import ExecutorSlot, SlotPool
from .eventlog import EventLog
from .former import BatchFormer
from .policy import BatchPolicy
from .queue import Entry, EntryState, RequestQueue
from .work import Array, WorkItem

log = logging.getLogger(__name__)

_NEVER_RAN = "model was unloaded before the request could run"


class DynamicBatcher:
    def __init__(
        self,
        pool: SlotPool,
        policy: BatchPolicy,
        gears: Sequence[int] = (),
        controller: AdaptiveController | None = None,
        delay_count: int = 0,
    ) -> None:
        """`delay_count` (TRITONSERVER_DELAY_SCHEDULER) holds batching until that many
        requests are queued, once, so that tests can observe exact batches."""
        self._pool = pool
        self._policy = policy
        self._gears = tuple(gears)
        self.controller = controller
        self._queue = RequestQueue(policy, self._rejected)
        self._order: collections.deque[Entry] | None = (
            collections.deque() if policy.preserve_ordering else None
        )
        self._pending = 0
        self._running = 0  # batches executing
        # What the controller has not been told of yet, and who is in the system; its
        # Presence is also read here, on submit's hot path, to decide a lone request.
        self._events = EventLog(controller)
        self._presence = self._events.presence
        # The request running alone in an otherwise empty system, if any (see _run_alone).
        self._alone: _Alone | None = None
        # Set once closing, when nothing is queued or running (close() waits for it).
        self._drained = asyncio.Event()
        self._closing = False
        self._former = BatchFormer(
            self._queue, pool, policy, controller, self._events, self._launch, self._finish,
            lambda: self._closing, delay_count,
        )  # fmt: skip
        self._batching = policy.batching

    # --- public --------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        return self._pending

    def queue_depths(self) -> dict[int, int]:
        """Queued (not yet executing) requests per priority level."""
        return self._queue.depths()

    def adaptive_snapshot(self) -> dict[str, Any] | None:
        """The adaptive controller's estimates and latest decision (see
        AdaptiveController.snapshot), up to date with every logged event; None when the
        model does not batch adaptively."""
        if self.controller is None:
            return None
        self._events.replay()
        return self.controller.snapshot()

    async def submit(self, item: WorkItem) -> dict[str, Array]:
        if self._closing:
            raise SchedulerClosed()
        policy = self._policy
        size = item.batch_size if self._batching else 1
        if size > policy.max_size:
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"inference request batch-size {size} exceeds the largest batch size "
                f"{policy.max_size} that model '{policy.model}' can execute",
            )
        loop = asyncio.get_running_loop()
        now = time.monotonic_ns()
        item.enqueue_ns = item.enqueue_ns or now
        future: asyncio.Future[dict[str, Array]] = loop.create_future()
        controller = self.controller
        if (
            controller is not None
            and self._alone is None
            and not self._presence.held
            and self._pool.idle_count
            and not self._queue
            and not self._former.hold
        ):
            # Asked as it will be once this request holds a slot: one fewer idle.
            idle_after = self._pool.idle_count - 1
            if self._presence.nothing_to_wait_for(idle_after, arriving=size):
                slot = self._pool.try_acquire()
                if slot is not None:
                    controller.sent_alone(size)
                    self._run_alone(slot, item, future, now, size)
                    return await future
        level = policy.level_for(item.priority)
        entry = Entry(item, future, level, now, size, None)
        slot = self._admit(entry)  # raises "Exceeds maximum queue size"
        self._pending += 1
        if self._order is not None:
            self._order.append(entry)
        if slot is not None:
            self._launch(slot, [entry])
        else:
            self._former.queued()
        try:
            return await future
        except asyncio.CancelledError:
            # The caller went away: a queued request leaves now; a running one finishes
            # on its slot and its result is dropped.
            if self._queue.remove(entry):
                self._finish(entry)
            raise

    async def close(self, drain_timeout_s: float) -> None:
        """Refuse new work, let queued and running work finish within the timeout, then
        close and join every slot.

        Requests still queued after the timeout never ran: they fail with SchedulerClosed,
        which the core retries on the version that replaced this one. Batches already
        executing finish before their slot's thread closes its executor.
        """
        self._closing = True
        self._check_drained()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), drain_timeout_s)
        await self._former.stop()
        for entry in self._queue.drain():
            self._finish(entry, error=SchedulerClosed(_NEVER_RAN))
        await self._pool.shutdown(
            SchedulerClosed(_NEVER_RAN), drain_timeout_s, f"'{self._policy.model}'"
        )

    # --- admission -----------------------------------------------------------------------

    def _admit(self, entry: Entry) -> ExecutorSlot | None:
        """Queue a new request and log its arrival for the controller; or, in adaptive
        mode, hand back an idle slot for it to run on alone at once.

        A request that finds nothing queued and a slot idle, and that the controller would
        send alone at once, takes that slot now: the batch former would decide the same a
        loop turn later, after planning it in full. Static batching keeps the former's
        turn, in which requests submitted together batch together."""
        controller = self.controller
        if self._alone is not None and not self._alone.logged:
            self._log_alone(self._alone)  # it is no longer alone
        slot = None
        if (
            controller is not None
            and self._pool.idle_count
            and not self._queue
            and not self._former.hold
        ):
            slot = self._pool.try_acquire()
        if controller is None or slot is None:
            self._enqueue(entry)
            if controller is not None:
                self._events.arrive(entry.enqueue_ns, entry.size, entry.level)
                self._events.replay_when_full()
            return None
        # Nothing is queued, so the queue has room for it should it have to wait after all.
        now, size, level = entry.enqueue_ns, entry.size, entry.level
        self._events.arrive(now, size, level)
        idle = self._pool.idle_count
        if self._presence.nothing_to_wait_for(idle):
            # Sent alone whatever the controller's estimates say: they can wait for the
            # next replay, behind this request.
            controller.sent_alone(size)
            return slot
        self._events.replay()  # the controller plans with this arrival
        try:
            plan = controller.plan(now, size, now, level, idle, size, now)
        except Exception:
            plan = None  # the former asks again, and answers its queue if it fails
        if plan is not None and plan.due(size, now):
            return slot
        self._pool.release(slot, executed=False)
        self._enqueue(entry)
        return None

    def _run_alone(
        self,
        slot: ExecutorSlot,
        item: WorkItem,
        future: asyncio.Future[dict[str, Array]],
        now: int,
        size: int,
    ) -> None:
        """Start a request that found the system empty, a slot idle and nothing worth
        waiting for (adaptive mode), on that slot at once, without queueing it.

        At low load this is every request, so it is the unbatched path and must cost what
        the default scheduler costs: no queue entry, and the controller is not told of it,
        only of its execution's cost. A request that arrives while it runs makes it part
        of the load the controller sees: its arrival is logged then (_log_alone), its
        departure as any other. With nothing else in the system, nothing can be answered
        out of order."""
        alone = _Alone(now, size, item.priority)
        self._alone = alone
        self._pending += 1
        self._running += 1
        item.timings.queue_ns = now - item.enqueue_ns
        gears, batching = self._gears, self._batching
        slot.run_then(
            lambda executor: execute_batch(executor, [item], gears, batching),
            lambda results, exc: self._alone_done(slot, alone, future, results, exc),
        )

    def _log_alone(self, alone: _Alone) -> None:
        """Log the arrival of the request running alone, now that another arrives."""
        alone.logged = True
        self._events.arrive(alone.arrive_ns, alone.size, self._policy.level_for(alone.priority))

    def _alone_done(
        self,
        slot: ExecutorSlot,
        alone: _Alone,
        future: asyncio.Future[dict[str, Array]],
        results: list[dict[str, Array]] | None,
        exc: BaseException | None,
    ) -> None:
        self._running -= 1
        self._pending -= 1
        self._alone = None
        self._pool.release(slot)
        done_ns = time.monotonic_ns()
        if exc is not None or results is None:
            exc = exc or RuntimeError("the batch returned no results")
            log.error("batch of %d failed on %s: %s", alone.size, slot.name, exc)
            if alone.logged:
                self._events.left_unlogged(alone.size)
            if not future.done():
                future.set_exception(_client_error(exc))
        else:
            # Priced by slot time, as in _batch_done.
            duration = done_ns - alone.arrive_ns
            if alone.logged:
                self._events.batch_left(done_ns, alone.size, alone.size, duration)
            else:
                self._events.ran_unseen(alone.size, duration)
            if not future.done():
                future.set_result(results[0])
            self._events.replay_soon()
        self._check_drained()

    def _enqueue(self, entry: Entry) -> None:
        if self._batching:
            entry.key = entry.item.shape_key()  # only queued requests are compared
        self._queue.put(entry)  # raises "Exceeds maximum queue size"

    # --- execution -----------------------------------------------------------------------

    def _launch(self, slot: ExecutorSlot, batch: list[Entry]) -> None:
        now = time.monotonic_ns()
        items = []
        for entry in batch:
            entry.state = EntryState.RUNNING
            entry.item.timings.queue_ns = now - entry.item.enqueue_ns
            items.append(entry.item)
        gears, batching = self._gears, self._batching
        self._running += 1
        slot.run_then(
            lambda executor: execute_batch(executor, items, gears, batching),
            lambda results, exc: self._batch_done(slot, batch, results, exc, now),
        )

    def _batch_done(
        self,
        slot: ExecutorSlot,
        batch: list[Entry],
        results: list[dict[str, Array]] | None,
        exc: BaseException | None,
        launched_ns: int,
    ) -> None:
        """A batch launched at `launched_ns` ended: free its slot and answer its requests."""
        self._running -= 1
        self._pool.release(slot)
        if exc is not None or results is None:
            exc = exc or RuntimeError("the batch returned no results")
            log.error("batch of %d failed on %s: %s", len(batch), slot.name, exc)
            for entry in batch:
                self._finish(entry, error=_client_error(exc))
        else:
            controller = self.controller
            if controller is not None:
                # The whole batch leaves at once: one departure, not one per request,
                # logged like the arrivals; an arrival logged after it is replayed after it.
                # The batch is priced by its slot time, from the hand-over to the slot
                # until the results are back here and the slot is free again: what the
                # slot could not be used for. Its compute time alone leaves out the slot
                # thread's wake-up and the way back, which on a busy host cost more than
                # a small model's compute, and which only fewer, fuller batches save.
                leaving = 0
                for entry in batch:
                    if entry.state is not EntryState.DONE:
                        leaving += entry.size
                done_ns = time.monotonic_ns()
                size = batch[0].item.timings.batch_size
                self._events.batch_left(done_ns, leaving, size, done_ns - launched_ns)
            for entry, result in zip(batch, results, strict=True):
                self._finish(entry, result=result, departed=True)
            self._events.replay_soon()
        self._check_drained()

    # --- answers -------------------------------------------------------------------------

    def _rejected(self, entry: Entry) -> None:
        self._finish(entry, error=request_timeout())
        self._former.wake()

    def _finish(
        self,
        entry: Entry,
        result: dict[str, Array] | None = None,
        error: BaseException | None = None,
        departed: bool = False,
    ) -> None:
        """Record an outcome; answer it now, or in arrival order under preserve_ordering.
        `departed`: the controller has already been told that the request left."""
        if entry.state is EntryState.DONE:
            return
        entry.state = EntryState.DONE
        entry.result = result
        entry.error = error
        self._pending -= 1
        if self.controller is not None and not departed:
            self._events.left_unlogged(entry.size)
        order = self._order
        if order is None or result is None:
            # Errors are answered at once, as Triton does for rejected requests.
            _answer(entry)
        if order is not None:
            while order and order[0].state is EntryState.DONE:
                _answer(order.popleft())
        self._check_drained()

    def _check_drained(self) -> None:
        if self._closing and self._pending == 0 and not self._running:
            self._drained.set()


class _Alone:
    """A request running alone: when it arrived, its samples and priority, and whether
    its arrival has been logged for the controller."""

    __slots__ = ("arrive_ns", "logged", "priority", "size")

    def __init__(self, arrive_ns: int, size: int, priority: int) -> None:
        self.arrive_ns = arrive_ns
        self.size = size
        self.priority = priority
        self.logged = False


def _answer(entry: Entry) -> None:
    future = entry.future
    if future.done():
        return
    if entry.error is not None:
        future.set_exception(entry.error)
    elif entry.result is not None:
        future.set_result(entry.result)
    entry.result = None


def _client_error(exc: BaseException) -> ServerError:
    """A fresh error per request (no two requests share one traceback), tagged as the
    model's execution failing."""
    if isinstance(exc, ServerError):
        return ServerError(exc.code, exc.message, exc.reason or FailureReason.BACKEND)
    if isinstance(exc, ShapeRejected):  # shapes the model cannot run: the input's fault
        return ServerError(ErrorCode.INVALID_ARG, str(exc), FailureReason.OTHER)
    return ServerError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}", FailureReason.BACKEND)
