"""The dynamic batcher: priority queues in, batches out to idle executor slots.

`submit()` queues synchronously (no await before the request is in the queue) and wakes
the batch former (former.py), the task that waits for an idle slot and decides when a
batch goes and what it holds. The batch runs on the slot's thread; the results come back
to the loop through the slot's report callback, the slot goes straight back to the pool,
and the batcher answers each request, in arrival order under `preserve_ordering`.

The batcher owns the mechanism only. When a batch goes, and how large it is, is its
decider's to say (decision.py): Triton's rules, or the adaptive controller. The batcher
tells the decider of every arrival, every batch that leaves and every request dropped
unanswered, as typed events.

Each batch handed to a slot is recorded on it (`ExecutorSlot.executing`) until the slot is
released, so that a batch forming on another slot of a device that runs one execution
at a time can see what it would wait for; each release tells the former.

One fast path: a request that finds nothing queued and a slot idle is decided at once, as
a batch of one, when the decider allows it (the adaptive one does); if it goes, it takes
the slot in the turn it arrived in, with no turn of the batch former in between. A request
that finds the server empty is asked about before the decider hears of its arrival, and
if it goes alone it runs as the default scheduler would run it (`_run_alone`): no queue
entry, and the decider learns only of its execution (`Ran`), unless another request
arrives while it runs. At low load that is every request. Under Triton's rules with
nothing to wait for, such a request opens the batch of its loop turn instead (turn.py).
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
    SchedulerClosed,
    ServerError,
    request_timeout,
)

from .adaptive import AdaptiveController, AdaptiveDecider
from .batch import RunAlone, Shaper, client_error, execute_batch, execute_isolated
from .census import ShapeCensus
from .decision import Arrived, BatchView, Decider, Dropped, Left, Ran, Take, TritonRules
from .dispatch import Executing, ExecutorSlot, SlotPool
from .former import BatchFormer
from .policy import BatchPolicy
from .queue import Entry, EntryState, RequestQueue
from .turn import gathering
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
        shaper: Shaper | None = None,
    ) -> None:
        """`delay_count` (TRITONSERVER_DELAY_SCHEDULER) holds batching until that many
        requests are queued, once, so that tests can observe exact batches. With
        `shaper`, requests are shaped into batches its way: padded into shape buckets
        (buckets.py) or batched ragged (ragged.py)."""
        self._pool = pool
        self._shaper = shaper
        self._policy = policy
        self._gears = tuple(gears)
        self.controller = controller
        # A request delayed (DELAY) may complete a preferred batch: Triton sends it then.
        self._queue = RequestQueue(policy, self._rejected, lambda: self._former.reordered())
        self._order: collections.deque[Entry] | None = (
            collections.deque() if policy.preserve_ordering else None
        )
        self._pending = 0
        self._running = 0  # batches executing
        self._adaptive = AdaptiveDecider(controller) if controller is not None else None
        # The request running alone in an otherwise empty server, if any (_run_alone).
        self._alone: _Alone | None = None
        self._decider: Decider = self._adaptive or TritonRules(policy)
        # For the adaptive controller, per key, who is in the server and who may still
        # come to join a batch of that key (census.py).
        self._census = ShapeCensus() if self._adaptive is not None else None
        # Set once closing, when nothing is queued or running (close() waits for it).
        self._drained = asyncio.Event()
        self._closing = False
        # Under Triton's rules a request of another shape closes the batch ahead of it;
        # the adaptive controller and shape buckets look past it (former.py).
        closes = self._adaptive is None and (shaper is None or shaper.closes_on_shape_change)
        self._former = BatchFormer(
            self._queue, pool, policy, self._decider, self._launch, self._finish,
            lambda: self._closing, delay_count, shaper.max_batch if shaper is not None else None,
            closes, self._census,
        )  # fmt: skip
        self._batching = policy.batching
        # The turn path (turn.py), for Triton's rules with nothing to wait for.
        self._turns = gathering(policy, pool, self._launch) if closes and shaper is None else None

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
        if self._adaptive is None:
            return None
        self._adaptive.catch_up()
        return self._adaptive.controller.snapshot()

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
        level = policy.level_for(item.priority)
        bucket = self._shaper.assign(item) if self._shaper is not None else 0  # raises
        pool = self._pool
        if (
            self._adaptive is not None
            and self._order is None
            and self._alone is None
            and not self._pending
            and pool.idle_count
            and not self._former.hold
        ):
            # Asked as it will be once this request holds a slot: one fewer idle.
            view = BatchView(
                totals=(size,),
                oldest_ns=now,
                level=level,
                head_samples=size,
                idle_slots=pool.idle_count - 1,
                idle_since_ns=now,
                full=size >= policy.max_size,
                bucket=bucket,
                unseen=size,
            )
            try:
                alone = type(self._decider.decide(view, now)) is Take
            except Exception:
                alone = False  # it queues; the former asks again, and answers if it fails
            if alone:
                slot = pool.try_acquire()
                if slot is not None:
                    self._run_alone(slot, item, future, now, size, level, bucket)
                    return await future
        entry = Entry(item, future, level, now, size, None, bucket=bucket)
        if self._turns is not None and self._turns.gather(entry, self._queue or self._former.hold):
            self._pending += 1
            return await future
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
        deadline = time.monotonic() + drain_timeout_s  # one wait for the drain and the join
        self._closing = True
        if self._turns is not None:
            self._turns.flush()
        self._check_drained()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), drain_timeout_s)
        await self._former.stop()
        for entry in self._queue.drain():
            self._finish(entry, error=SchedulerClosed(_NEVER_RAN))
        await self._pool.shutdown(SchedulerClosed(_NEVER_RAN), deadline, f"'{self._policy.model}'")

    # --- admission -----------------------------------------------------------------------

    def _admit(self, entry: Entry) -> ExecutorSlot | None:
        """Queue a new request, or hand back the idle slot it runs on at once: the fast
        path, when nothing is queued, a slot is idle and the decider sends the request
        alone (it is told of the arrival first, and asked as the batch former would ask
        a turn later)."""
        decider = self._decider
        pool = self._pool
        census = self._census
        if census is not None:
            entry.key = self._key(entry.item, entry.bucket)
        if self._alone is not None and not self._alone.logged:
            self._log_alone(self._alone)  # it is no longer alone
        slot = None
        if decider.immediate and pool.idle_count and not self._queue and not self._former.hold:
            slot = pool.try_acquire()
        now, size, level = entry.enqueue_ns, entry.size, entry.level
        if slot is None:
            self._enqueue(entry)  # raises "Exceeds maximum queue size"
            if census is not None:
                census.arrived(entry.key, size)
            decider.observe(Arrived(now, size, level))
            return None
        joinable = -1
        if census is not None:
            census.arrived(entry.key, size)
            joinable = census.outside(entry.key)
        decider.observe(Arrived(now, size, level))
        view = BatchView(
            totals=(size,),
            oldest_ns=now,
            level=level,
            head_samples=size,
            idle_slots=pool.idle_count,
            idle_since_ns=now,
            full=size >= self._policy.max_size,
            bucket=entry.bucket,
            on_device=pool.beside(slot) if decider.sees_device else (),
            joinable=joinable,
        )
        try:
            answer = decider.decide(view, now)
        except Exception:
            answer = None  # the former asks again, and answers its queue if it fails
        if type(answer) is Take:
            return slot
        pool.release(slot, executed=False)
        # Nothing is queued, so the queue has room for it.
        self._enqueue(entry)
        return None

    def _run_alone(
        self,
        slot: ExecutorSlot,
        item: WorkItem,
        future: asyncio.Future[dict[str, Array]],
        now: int,
        size: int,
        level: int,
        bucket: int,
    ) -> None:
        """Start a request that found the server empty, a slot idle and nothing worth
        waiting for, on that slot at once, without queueing it.

        At low load this is every request, so it is the unbatched path and must cost what
        the default scheduler costs: no queue entry, and the decider is told only of its
        execution. A request that arrives while it runs makes it part of the load: its
        arrival is reported then (_log_alone), its departure as any other's. Models that
        preserve ordering never come here: the request behind would overtake it."""
        alone = _Alone(item, now, size, level, bucket)
        self._alone = alone
        slot.executing = Executing(now, size, bucket)
        self._pending += 1
        self._running += 1
        item.timings.queue_ns = now - item.enqueue_ns
        gears, batching, shaper = self._gears, self._batching, self._shaper
        slot.run_then(
            lambda executor: execute_batch(executor, [item], gears, batching, shaper, bucket),
            lambda results, exc: self._alone_done(slot, alone, future, results, exc),
        )

    def _log_alone(self, alone: _Alone) -> None:
        """Report the arrival of the request running alone, now that another arrives."""
        alone.logged = True
        if self._census is not None:
            alone.key = self._key(alone.item, alone.bucket)
            self._census.arrived(alone.key, alone.size)
        self._decider.observe(Arrived(alone.arrive_ns, alone.size, alone.level))

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
        self._former.slot_freed(slot)
        done_ns = time.monotonic_ns()
        if alone.logged and self._census is not None:
            self._census.left(alone.key, alone.size)
        # Told of every execution's end, failed ones too (the device was busy all the same).
        started = self._pool.started_ns(slot, alone.arrive_ns, done_ns)
        if exc is not None or results is None:
            exc = exc or RuntimeError("the batch returned no results")
            log.error("batch of %d failed on %s: %s", alone.size, slot.name, exc)
            if alone.logged:
                self._decider.observe(Dropped(done_ns, alone.size))
            if not future.done():
                future.set_exception(client_error(exc))
        else:
            # Priced by slot time, as in _batch_done.
            duration = done_ns - started
            if alone.logged:
                self._decider.observe(Left(done_ns, alone.size, alone.size, duration, alone.bucket))
            else:
                self._decider.observe(Ran(alone.size, duration, alone.bucket))
            if not future.done():
                future.set_result(results[0])
        self._check_drained()

    def _enqueue(self, entry: Entry) -> None:
        if self._census is None:
            # Only queued requests are compared (the census counts every one: _admit).
            entry.key = self._key(entry.item, entry.bucket)
        self._queue.put(entry)  # raises "Exceeds maximum queue size"

    def _key(self, item: WorkItem, bucket: int) -> Any:
        """What must agree for requests to batch together."""
        if self._shaper is not None:
            return self._shaper.key(item, bucket)
        if self._batching:
            return item.shape_key()
        return None

    # --- execution -----------------------------------------------------------------------

    def _launch(self, slot: ExecutorSlot, batch: list[Entry]) -> None:
        now = time.monotonic_ns()
        items = []
        samples = 0
        for entry in batch:
            entry.state = EntryState.RUNNING
            entry.item.timings.queue_ns = now - entry.item.enqueue_ns
            items.append(entry.item)
            samples += entry.size
        # What a batch forming on another slot of this device would wait for.
        slot.executing = Executing(now, samples, batch[0].bucket)
        gears, batching, shaper, bucket = (
            self._gears,
            self._batching,
            self._shaper,
            batch[0].bucket,
        )
        self._running += 1
        slot.run_then(
            lambda executor: execute_isolated(executor, items, gears, batching, shaper, bucket),
            lambda results, exc: self._batch_done(slot, batch, results, exc, now),
        )

    def _batch_done(
        self,
        slot: ExecutorSlot,
        batch: list[Entry],
        results: list[dict[str, Array]] | RunAlone | None,
        exc: BaseException | None,
        launched_ns: int,
    ) -> None:
        """A batch launched at `launched_ns` ended: free its slot and answer its requests
        (each with its own outcome, when it was run again request by request)."""
        self._running -= 1
        self._pool.release(slot)
        self._former.slot_freed(slot)
        done_ns = started = 0
        if self._adaptive is not None:
            # Told of every execution's end, failed ones too (the device was busy all the same).
            done_ns = time.monotonic_ns()
            started = self._pool.started_ns(slot, launched_ns, done_ns)
        if exc is not None or results is None:
            exc = exc or RuntimeError("the batch returned no results")
            log.error("batch of %d failed on %s: %s", len(batch), slot.name, exc)
            for entry in batch:
                self._finish(entry, error=client_error(exc), in_order=True)
        elif isinstance(results, RunAlone):
            # No batch left as one, so the controller prices nothing: each request is
            # dropped from its counts as a failed one is.
            log.error("batch of %d failed on %s; ran each request alone", len(batch), slot.name)
            for entry, outcome in zip(batch, results.outcomes, strict=True):
                if isinstance(outcome, Exception):
                    self._finish(entry, error=client_error(outcome), in_order=True)
                else:
                    self._finish(entry, result=outcome)
        else:
            if self._adaptive is not None:
                # The whole batch leaves at once: one departure, not one per request,
                # logged like the arrivals; an arrival logged after it is replayed after it.
                # The batch is priced by its slot time, from the hand-over to the slot
                # until the results are back here and the slot is free again: what the
                # slot could not be used for. Its compute time alone leaves out the slot
                # thread's wake-up and the way back, which on a busy host cost more than
                # a small model's compute, and which only fewer, fuller batches save. On
                # a device that runs one execution at a time, the time it waited there
                # behind another slot's execution is that one's, not its own.
                leaving = sum(e.size for e in batch if e.state is not EntryState.DONE)
                size = batch[0].item.timings.batch_size
                self._decider.observe(
                    Left(done_ns, leaving, size, done_ns - started, batch[0].bucket)
                )
                if self._census is not None:
                    self._census.left(batch[0].key, leaving)
            for entry, result in zip(batch, results, strict=True):
                self._finish(entry, result=result, departed=True)
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
        in_order: bool = False,
    ) -> None:
        """Record an outcome; answer it now, or in arrival order under preserve_ordering.
        `departed`: the controller was told it left; `in_order`: an execution's error."""
        if entry.state is EntryState.DONE:
            return
        entry.state = EntryState.DONE
        entry.result = result
        entry.error = error
        self._pending -= 1
        if self._adaptive is not None and not departed:
            self._decider.observe(Dropped(time.monotonic_ns(), entry.size))
            if self._census is not None:
                self._census.left(entry.key, entry.size)
        order = self._order
        if order is None or (result is None and not in_order):
            # Requests that never ran (timed out, cancelled, closed) skip the order, as in Triton.
            _answer(entry)
        if order is not None:
            while order and order[0].state is EntryState.DONE:
                _answer(order.popleft())
        self._check_drained()

    def _check_drained(self) -> None:
        if self._closing and self._pending == 0 and not self._running:
            self._drained.set()


class _Alone:
    """A request running alone: the request, when it arrived, its samples, level and
    bucket, and whether its arrival has been reported to the decider (with its key, when
    the batcher keeps a census)."""

    __slots__ = ("arrive_ns", "bucket", "item", "key", "level", "logged", "size")

    def __init__(self, item: WorkItem, arrive_ns: int, size: int, level: int, bucket: int) -> None:
        self.item = item
        self.key: Any = None
        self.arrive_ns = arrive_ns
        self.size = size
        self.level = level
        self.bucket = bucket
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
