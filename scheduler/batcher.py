"""The dynamic batcher: priority queues in, batches out to idle executor slots.

`submit()` queues synchronously (no await before the request is in the queue) and wakes
the batch-forming task. That task waits for a first request, then for an idle slot, and
only then forms the batch: requests keep piling up while every slot is busy, so batches
grow with load on their own. With a slot in hand it applies Triton's rules (a preferred
size or the maximum goes at once; otherwise the batch waits until its oldest request is
`max_queue_delay_microseconds` old), or asks the adaptive controller for a target size and
a window. The batch runs on the slot's thread; the results come back to the loop through
the slot's report callback, and the slot goes straight back to the pool.

In adaptive mode a request that finds the system empty, a slot idle and nothing worth
waiting for skips all of that and runs on the slot at once, as the default scheduler would
run it (`_run_alone`): at low load that is every request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from ge_serve.server.errors import (
    ErrorCode,
    FailureReason,
    SchedulerClosed,
    ServerError,
    request_timeout,
)

from .adaptive import AdaptiveController, Plan
from .arrivals import Event, Presence
from .batch import execute_batch
from .dispatch import ExecutorSlot, SlotPool
from .policy import BatchPolicy
from .queue import Entry, EntryState, RequestQueue
from .work import Array, WorkItem

log = logging.getLogger(__name__)

_NEVER_RAN = "model was unloaded before the request could run"

# How many requests of another shape the batch former looks past when it fills a batch.
SCAN_LIMIT = 256
# The controller's event log is replayed at the latest when it holds this many events
# (see DynamicBatcher._events).
LOG_LIMIT = 64
# Of the requests that ran alone and unseen, the controller's cost model is told of the
# execution of one in this many (see DynamicBatcher._alone_done).
ALONE_COST_EVERY = 8


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
        self._hold = max(delay_count, 0)
        self._queue = RequestQueue(policy, self._rejected)
        self._order: collections.deque[Entry] | None = (
            collections.deque() if policy.preserve_ordering else None
        )
        self._pending = 0
        self._running = 0  # batches executing
        # Arrivals and departures the controller has not been told of yet, in the order
        # they happened (see AdaptiveController.record): replayed before it is asked
        # anything, and otherwise once LOG_LIMIT are pending. Saturated, batches go out
        # full without asking it, and the log is replayed every few batches. Timed in the
        # server on `simple` (batches of 8): a call per arrival and a replay per batch
        # cost ~16 us per batch, caches cold; a replay every ~7 batches, ~8 us per batch.
        self._events: list[Event] = []
        self._log = self._events.append
        self._replay_queued = False
        # Who is in the system, up to date with the log (the controller is only up to
        # date with what it replayed): decides a lone request without a replay.
        self._presence = Presence()
        # The request running alone in an otherwise empty system, if any (see _run_alone),
        # and how many have run alone unseen.
        self._alone: _Alone | None = None
        self._alone_unseen = 0
        # The plan for the batch forming on the slot in hand, with the request heading it,
        # while the controller's plans for that head hold (AdaptiveController.plan_holds).
        self._held: tuple[Entry, Plan] | None = None
        # Set once closing, when nothing is queued or running (close() waits for it).
        self._drained = asyncio.Event()
        self._closing = False
        self._former: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self._batching = policy.batching
        self._max_delay_ns = policy.max_queue_delay_us * 1000
        self._preferred = frozenset(policy.preferred_sizes)
        self._max_preferred = max(policy.preferred_sizes, default=policy.max_size)

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
        self._record()
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
            and not self._hold
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
            if self._former is None:
                self._former = loop.create_task(self._form_batches(), name="batcher")
                self._former.add_done_callback(self._former_ended)
            self._wakeup()
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
        if self._former is not None:
            self._former.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._former
        for entry in self._queue.drain():
            self._finish(entry, error=SchedulerClosed(_NEVER_RAN))
        await self._pool.shutdown(
            SchedulerClosed(_NEVER_RAN), drain_timeout_s, f"'{self._policy.model}'"
        )

    # --- batch forming -------------------------------------------------------------------

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
        if controller is not None and self._pool.idle_count and not self._queue and not self._hold:
            slot = self._pool.try_acquire()
        if controller is None or slot is None:
            self._enqueue(entry)
            if controller is not None:
                self._presence.arrive(entry.size)
                self._log((entry.enqueue_ns, entry.size, entry.level))
                if len(self._events) >= LOG_LIMIT:
                    self._record()
            return None
        # Nothing is queued, so the queue has room for it should it have to wait after all.
        now, size, level = entry.enqueue_ns, entry.size, entry.level
        self._presence.arrive(size)
        self._log((now, size, level))
        idle = self._pool.idle_count
        if self._presence.nothing_to_wait_for(idle):
            # Sent alone whatever the controller's estimates say: they can wait for the
            # next replay, behind this request.
            controller.sent_alone(size)
            return slot
        self._record()  # the controller plans with this arrival
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
        self._presence.arrive(alone.size)
        self._log((alone.arrive_ns, alone.size, self._policy.level_for(alone.priority)))

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
                self._depart_unlogged(alone.size)
            if not future.done():
                future.set_exception(_client_error(exc))
        else:
            # Priced by slot time, as in _batch_done.
            duration = done_ns - alone.arrive_ns
            if alone.logged:
                self._log((done_ns, alone.size, alone.size, duration))
                self._presence.leave(alone.size, True)
            else:
                # At low load this is every request. Replaying each one's cost cost the
                # loop ~4 us per request (in process, `simple`-shaped, one client); one
                # in ALONE_COST_EVERY, the first of them included, keeps the estimate
                # of a lone execution current (the EWMA then follows ~40 requests).
                if self._alone_unseen % ALONE_COST_EVERY == 0:
                    self._log((alone.size, duration))
                    self._presence.measured = True
                self._alone_unseen += 1
            if not future.done():
                future.set_result(results[0])
            self._replay_if_full()
        self._check_drained()

    def _enqueue(self, entry: Entry) -> None:
        if self._batching:
            entry.key = entry.item.shape_key()  # only queued requests are compared
        self._queue.put(entry)  # raises "Exceeds maximum queue size"

    def _former_ended(self, task: asyncio.Task[None]) -> None:
        """The batch former only ends when cancelled at close. Should a bug end it, the
        queued requests get an error instead of waiting forever, and the next request
        starts a new former."""
        if task.cancelled() or self._closing:
            return
        exc = task.exception()
        log.error("the batcher of model '%s' stopped: %r", self._policy.model, exc)
        self._former = None
        error = ServerError(ErrorCode.INTERNAL, f"batcher failed: {exc!r}")
        for entry in self._queue.drain():
            self._finish(entry, error=error)

    def _wakeup(self) -> None:
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
            if self._hold:
                if len(self._queue) < self._hold:
                    await self._sleep(None)
                    continue
                self._hold = 0
            slot = await self._pool.acquire()
            try:
                batch = await self._collect()
            except BaseException:
                self._pool.release(slot, executed=False)
                raise
            if batch:
                self._launch(slot, batch)
            else:
                self._pool.release(slot, executed=False)

    async def _collect(self) -> list[Entry]:
        """With a slot in hand: wait until a batch should go, then take it off the queue."""
        idle_since = time.monotonic_ns()
        self._held = None
        queue = self._queue
        while queue:
            now = time.monotonic_ns()
            held = self._held
            if (
                held is not None
                and now < held[1].deadline_ns
                and queue.samples < held[1].target
                and queue.first() is held[0]
            ):
                # Still short of the held plan's target, with the same head: what
                # _plan would answer, without going through the queue.
                await self._sleep(held[1].deadline_ns)
                continue
            batch, wake_ns = self._plan(now, idle_since)
            if batch:
                self._held = None
                for entry in batch:
                    queue.remove(entry)
                return batch
            await self._sleep(wake_ns)
        self._held = None
        return []

    def _plan(self, now: int, idle_since: int) -> tuple[list[Entry], int | None]:
        """The batch to send now, or nothing and when to look again (`idle_since`: when
        the slot in hand was taken).

        The batch follows the queue's order (priority, then arrival), starting from its
        first request and taking only requests of the same shape, up to the largest size
        the model can run.
        """
        policy = self._policy
        max_size = policy.max_size
        chosen: list[Entry] = []
        cancelled: list[Entry] = []
        total = 0
        best = 0  # how many of `chosen` make the best preferred size
        full = False
        skipped = 0
        key: object = None
        target = self._max_preferred
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
            elif entry.key != key:
                skipped += 1
                if skipped > SCAN_LIMIT:
                    break
                continue
            if total + entry.size > max_size:
                full = True
                break
            if chosen and best == 0 and total + entry.size > target and self._preferred:
                best = len(chosen)
            chosen.append(entry)
            total += entry.size
            if entry.enqueue_ns < oldest:
                oldest = entry.enqueue_ns
            if entry.level == level:
                head += entry.size
            if total in self._preferred:
                best = len(chosen)
            if total >= max_size:
                full = True
                break
        for entry in cancelled:
            if self._queue.remove(entry):
                self._finish(entry)
        if not chosen:
            return [], None
        controller = self.controller
        if controller is not None:
            if full and controller.sends_full():
                return chosen, None  # saturated: no plan to make, nothing to cap
            held = self._held
            if (
                held is not None
                and held[0] is chosen[0]
                and not full
                and not held[1].due(total, now)
            ):
                return [], held[1].deadline_ns
            # A new head, or the held plan's target reached or its deadline passed: plan
            # again (on reaching its target, with more queued than planned, the controller
            # may find a larger batch worth the rest of the wait).
            if self._events:
                self._record()
            plan = controller.plan(
                now, total, oldest, level, self._pool.idle_count, head, idle_since
            )
            self._held = (chosen[0], plan) if controller.plan_holds(level) else None
            if full or plan.due(total, now):
                # The target is what to wait for; the limit caps what goes.
                return _fit(chosen, plan.limit), None
            return [], plan.deadline_ns
        window = self._max_delay_ns
        expired = window > 0 and now - oldest >= window
        if best and not expired:
            return chosen[:best], None
        if full or total >= target or window == 0 or expired:
            return chosen, None
        return [], oldest + window

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
                # thread's wake-up and the way back, which on a busy host cost far more
                # than a small model's compute (on `simple` over gRPC at 32 clients, 2
                # cores shared with perf_analyzer: ~0.6 ms for the thread to start the
                # job, ~0.1 ms to run it, ~0.07 ms back), and which only fewer, fuller
                # batches save.
                leaving = 0
                for entry in batch:
                    if entry.state is not EntryState.DONE:
                        leaving += entry.size
                done_ns = time.monotonic_ns()
                size = batch[0].item.timings.batch_size
                self._log((done_ns, leaving, size, done_ns - launched_ns))
                self._presence.leave(leaving, True)
            for entry, result in zip(batch, results, strict=True):
                self._finish(entry, result=result, departed=True)
            self._replay_if_full()
        self._check_drained()

    # --- answers -------------------------------------------------------------------------

    def _rejected(self, entry: Entry) -> None:
        self._finish(entry, error=request_timeout())
        self._wakeup()

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
            self._depart_unlogged(entry.size)
        order = self._order
        if order is None or result is None:
            # Errors are answered at once, as Triton does for rejected requests.
            _answer(entry)
        if order is not None:
            while order and order[0].state is EntryState.DONE:
                _answer(order.popleft())
        self._check_drained()

    def _depart_unlogged(self, size: int) -> None:
        """`size` samples left without a logged execution (an error, a cancellation, a
        timeout): tell the controller now, after what the log holds."""
        controller = self.controller
        if controller is None:
            return
        if self._events:
            self._record()
        controller.record_departure(time.monotonic_ns(), size)
        self._presence.leave(size, False)

    def _replay_if_full(self) -> None:
        """Once the log holds LOG_LIMIT events, replay it in a later turn: behind the
        answers just given, whose callers resume first."""
        if len(self._events) >= LOG_LIMIT and not self._replay_queued:
            self._replay_queued = True
            asyncio.get_running_loop().call_soon(self._record)

    def _record(self) -> None:
        """Replay the logged arrivals and departures to the controller, in order."""
        self._replay_queued = False
        events = self._events
        if events and self.controller is not None:
            self.controller.record(events)
        events.clear()

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


def _fit(chosen: list[Entry], limit: int) -> list[Entry]:
    """The leading requests that fit in `limit` samples (always at least one)."""
    total = 0
    for count, entry in enumerate(chosen):
        total += entry.size
        if total > limit:
            return chosen[: max(count, 1)]
    return chosen


def _answer(entry: Entry) -> None:
    future = entry.future
    if future.done():
        return
    if entry.error is not None:
        future.set_exception(entry.error)
    elif entry.result is not None:
        future.set_result(entry.result)
    entry.result = None


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _client_error(exc: BaseException) -> ServerError:
    """A fresh error per request (no two requests share one traceback), tagged as the
    model's execution failing."""
    if isinstance(exc, ServerError):
        return ServerError(exc.code, exc.message, exc.reason or FailureReason.BACKEND)
    return ServerError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}", FailureReason.BACKEND)
