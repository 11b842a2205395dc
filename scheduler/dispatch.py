"""Executor slots and dispatch: each slot owns one thread and one executor.

A slot knows its device, whether that device runs one execution at a time
(`SlotInfo.serial`), and the batch executing on it when its batcher says so
(`executing`); `SlotPool.beside(slot)` lists what a batch started on `slot` would wait
for on its device.

A slot whose executor may run on any thread (`LoadedModel.thread_free`) runs an
execution on the event loop's own thread when its executions are very short: handing a
job to the slot thread and reporting it back costs a futex wake, a GIL hand-over in each
direction and a wake-up of the loop, which for a model that computes for a few
microseconds is most of the request's CPU time. Whichever thread runs it, a job runs
alone on its slot and reports the same way.

What decides is the CPU time jobs took on the loop's thread (the time the loop is busy
with them), not their wall time, which preemption stretches on a busy host. A job on the
slot thread costs more CPU than the same job inline (the hand-overs, cold caches), so a
slot whose thread jobs are cheap enough tries one inline, and keeps running inline while
those stay short, or no longer than on the thread; when they do not (larger batches, a
slower model), it goes back to the thread and tries again after `_RETRY_AFTER` jobs there.
Jobs inline are sampled (one in `_MEASURE_EVERY`, and the first after the thread): a
thread's CPU clock is read by a system call, which a job of a few microseconds would
otherwise pay twice.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from ge_serve.backends.base import Executor

from .ratelimit import RateLimiter, SlotNeeds

log = logging.getLogger(__name__)

T = TypeVar("T")

# What a slot reports a job's end to, on the loop: (result, None) or (None, the exception).
Report = Callable[[Any, BaseException | None], None]
_Job = tuple[Callable[[Executor], Any], Report, asyncio.AbstractEventLoop]

# Jobs run on the loop's thread while those run there average less CPU time than this,
# or no more than those on the slot thread (which cost the loop its hand-overs on top).
INLINE_MAX_NS = 200_000
# A slot whose jobs on its thread average less than this tries one on the loop's thread;
# no job runs there while they average more.
_TRY_MAX_NS = 1_000_000
# How many jobs on the thread between two tries, once jobs inline were too long.
_RETRY_AFTER = 64
# The weight of the newest job in those averages.
_MEAN_WEIGHT = 0.25
# One job in this many inline is measured; those on the thread all are.
_MEASURE_EVERY = 4


class Executing(NamedTuple):
    """A batch executing on a slot: handed to it at `launched_ns`, `size` samples, padded
    to shape bucket `bucket` (0 without buckets)."""

    launched_ns: int
    size: int
    bucket: int = 0


class ExecutorSlot:
    """Runs jobs on its executor from one dedicated thread, one at a time.

    Results return to the loop with `call_soon_threadsafe`, so the loop never blocks.
    """

    def __init__(self, executor: Executor, inline: bool = False) -> None:
        """`inline`: the executor may run on any thread, so short jobs may run on the
        loop's (see the module docstring)."""
        self.executor = executor
        self.name = executor.slot.name
        self.device = executor.slot.device
        # The device runs one execution at a time (SlotInfo.serial).
        self.serial = executor.slot.serial
        self.busy = False
        # The batch executing on it, as the batcher told (cleared on release).
        self.executing: Executing | None = None
        self.executions = 0
        self.inline = inline
        # Running averages of a job's CPU time, inline and on the thread; None until one
        # has run there.
        self.inline_ns: float | None = None
        self.thread_ns: float | None = None
        self._thread_runs = 0  # jobs on the thread since the last one inline
        self._unmeasured = 0  # jobs inline to run before the next one measured
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # False once `abandon` has left the executor to its owner.
        self._closes_executor = True
        self._thread = threading.Thread(target=self._work, name=f"slot-{self.name}", daemon=True)
        self._thread.start()

    def run_then(self, job: Callable[[Executor], T], report: Report) -> None:
        """Run a job; `report(result, None)`, or `report(None, exc)` should it raise, is
        called on the loop when it ends, in the turn the result arrives in: no future in
        between whose callbacks take another turn (with a future and asyncio.shield, a
        result took three turns to reach the request's task, now two). A job short enough
        to run on the loop's thread reports before this returns."""
        if self.inline and self._runs_inline():
            # The first job inline after the thread, then one in _MEASURE_EVERY, is timed:
            # reading a thread's CPU clock is a system call, dearer than a short job's other
            # bookkeeping together.
            measured = bool(self._thread_runs) or not self._unmeasured
            if measured:
                self._thread_runs = 0
                self._unmeasured = _MEASURE_EVERY - 1
                started = time.thread_time_ns()
            else:
                self._unmeasured -= 1
            result: T | None = None
            failure: Exception | None = None
            try:
                result = job(self.executor)
            except Exception as exc:  # the caller's failure, as on the thread
                # Without its traceback, which holds this frame, which holds `failure`:
                # a cycle that would keep the batch's tensors until the collector ran.
                failure = exc.with_traceback(None)
            if measured:
                self.inline_ns = _averaged(self.inline_ns, time.thread_time_ns() - started)
            report(result, failure)
            return
        self._thread_runs += 1
        self._jobs.put((job, report, asyncio.get_running_loop()))

    def _runs_inline(self) -> bool:
        inline, thread = self.inline_ns, self.thread_ns
        if inline is not None and (
            inline < INLINE_MAX_NS or (thread is not None and inline <= min(thread, _TRY_MAX_NS))
        ):
            return True
        if thread is None or thread >= _TRY_MAX_NS:
            return False
        return inline is None or self._thread_runs >= _RETRY_AFTER

    def close(self) -> None:
        """Stop the thread after the queued jobs, then close the executor on it."""
        self._jobs.put(None)

    def abandon(self) -> None:
        """Stop the thread of a slot that never ran a job, leaving its executor open: a
        load that fails after its slots started closes every executor of the model itself
        (`LoadedModel.close`), and an executor is closed once."""
        self._closes_executor = False
        self._jobs.put(None)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _work(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                break
            job, report, loop = item
            started = time.thread_time_ns()
            try:
                result = job(self.executor)
            except BaseException as exc:  # every failure goes back to its caller
                self.thread_ns = _averaged(self.thread_ns, time.thread_time_ns() - started)
                _report(loop, report, None, exc)
            else:
                self.thread_ns = _averaged(self.thread_ns, time.thread_time_ns() - started)
                _report(loop, report, result, None)
                del result
            # The job holds its batch: the requests' tensors, and their futures, which hold
            # a failed one's error, whose traceback holds this frame. Let go of it now, not
            # when the next job comes, which on an idle slot may be never.
            del item, job, report, loop
        if not self._closes_executor:
            return
        try:
            self.executor.close()
        except Exception:
            log.exception("closing executor %s failed", self.name)


def _averaged(mean: float | None, sample: int) -> float:
    return sample if mean is None else mean + _MEAN_WEIGHT * (sample - mean)


def _report(
    loop: asyncio.AbstractEventLoop, report: Report, result: Any, exc: BaseException | None
) -> None:
    # A closed loop: a job that outlived the server's exit timeout has nobody to answer.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(report, result, exc)


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class SlotPool:
    """Hands out idle slots, least-loaded device first; waiters are served in FIFO order."""

    def __init__(
        self,
        slots: list[ExecutorSlot],
        limiter: RateLimiter | None = None,
        needs: list[SlotNeeds | None] | None = None,
    ) -> None:
        self.slots = slots
        # --rate-limit: a slot runs only while the resources it needs are free.
        self._limiter = limiter
        self._needs = {id(s): n for s, n in zip(slots, needs or [], strict=False)}
        for slot_needs in self._needs.values():
            if limiter is not None and slot_needs is not None:
                limiter.register(slot_needs)
        self._registered = limiter is not None
        # How many slots are idle, kept up to date by try_acquire and release.
        self.idle_count = sum(not slot.busy for slot in slots)
        self._waiters: collections.deque[asyncio.Future[ExecutorSlot]] = collections.deque()
        self._closed: BaseException | None = None
        # Per device that runs one execution at a time: when its latest execution ended.
        self._device_free_ns: dict[str, int] = {}

    @property
    def rate_limited(self) -> bool:
        """Whether a slot runs only while the resources it needs are free (--rate-limit)."""
        return self._limiter is not None

    def _pick(self) -> ExecutorSlot | None:
        if self._limiter is not None:
            return self._pick_limited(self._limiter)
        if len(self.slots) == 1:
            only = self.slots[0]
            return None if only.busy else only
        busy_by_device: dict[str, int] = {}
        for slot in self.slots:
            busy_by_device[slot.device] = busy_by_device.get(slot.device, 0) + int(slot.busy)
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None
        return min(idle, key=lambda s: (busy_by_device[s.device], s.executions))

    def _pick_limited(self, limiter: RateLimiter) -> ExecutorSlot | None:
        idle = [s for s in self.slots if not s.busy]
        allowed = [s for s in idle if limiter.allows(self._needs.get(id(s)))]
        if idle and not allowed:
            limiter.wait(self)
        return min(allowed, key=self._scaled, default=None)

    def _scaled(self, slot: ExecutorSlot) -> tuple[int, int]:
        """Triton's scaled priority of an instance (executions x priority), then priority."""
        needs = self._needs.get(id(slot))
        priority = needs.priority if needs is not None else 1
        return slot.executions * priority, priority

    def rank(self) -> tuple[int, int]:
        """The rank among pools waiting for resources (RateLimiter.give): that of the
        idle slot this pool would run next."""
        return min((self._scaled(s) for s in self.slots if not s.busy), default=(0, 1))

    def try_acquire(self) -> ExecutorSlot | None:
        slot = self._pick()
        if slot is not None:
            slot.busy = True
            self.idle_count -= 1
            if self._limiter is not None:
                self._limiter.take(self._needs.get(id(slot)))
        return slot

    async def acquire(self) -> ExecutorSlot:
        if self._closed is not None:
            raise self._closed
        slot = self.try_acquire()
        if slot is not None:
            return slot
        waiter: asyncio.Future[ExecutorSlot] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result(), executed=False)
            raise

    def started_ns(self, slot: ExecutorSlot, launched_ns: int, done_ns: int) -> int:
        """When the execution that ended at `done_ns` on `slot`, handed over at
        `launched_ns`, started on its device: on a device that runs one execution at a
        time, not before the one ahead of it there ended (its wait there is that one's
        time, not its own). Call once per execution, as each ends."""
        if not slot.serial:
            return launched_ns
        ahead_ended = self._device_free_ns.get(slot.device, 0)
        self._device_free_ns[slot.device] = done_ns
        return max(launched_ns, ahead_ended)

    def beside(self, slot: ExecutorSlot) -> tuple[Executing, ...]:
        """The batches executing on the other slots of `slot`'s device, in the order they
        were handed over, when that device runs one execution at a time (SlotInfo.serial):
        a batch `slot` starts now waits for them. Empty on any other device."""
        if not slot.serial:
            return ()
        device = slot.device
        found = [
            other.executing
            for other in self.slots
            if other.executing is not None and other is not slot and other.device == device
        ]
        if len(found) > 1:
            found.sort()
        return tuple(found)

    def release(self, slot: ExecutorSlot, executed: bool = True) -> None:
        """Give a slot back; it goes straight to the oldest waiter, if any."""
        slot.executing = None
        if executed:
            slot.executions += 1
        if slot.busy:
            slot.busy = False
            self.idle_count += 1
            needs = self._needs.get(id(slot))
            if self._limiter is not None and needs is not None:
                if self._waiters:
                    # It competes, by rank, for what it gives back (Triton's OnRelease
                    # stages the instance again when its model has requests pending).
                    # Only then: give() takes a pool off the waiting list only for what
                    # comes back, and a slot that needs nothing gives nothing back.
                    self._limiter.wait(self)
                self._limiter.give(needs)
        self.serve_waiters()

    def serve_waiters(self) -> None:
        """The oldest waiter gets an idle slot, if one may run."""
        if self._closed is not None:
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                chosen = self.try_acquire()
                if chosen is None:
                    self._waiters.appendleft(waiter)
                    return
                waiter.set_result(chosen)
                return

    async def run_on_slot(self, slot: ExecutorSlot, job: Callable[[Executor], T]) -> T:
        """Run a job and release the slot when it really ends, even if the caller is cancelled."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        def report(result: Any, exc: BaseException | None) -> None:
            self.release(slot)
            _settle(future, result, exc)

        slot.run_then(job, report)
        return await future

    def close(self, reason: BaseException | None = None) -> None:
        """Close every slot after its queued jobs; waiters for a slot get `reason`."""
        self._closed = reason or RuntimeError("the executor slots are closed")
        if self._registered and self._limiter is not None:
            # Once: the model's instances leave the limiter's books (a pool closes at
            # unload, or when the load that built it fails).
            self._registered = False
            for slot_needs in self._needs.values():
                if slot_needs is not None:
                    self._limiter.unregister(slot_needs)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(self._closed)
        for slot in self.slots:
            slot.close()

    async def shutdown(self, reason: BaseException, deadline: float, what: str) -> None:
        """Close every slot (waiters get `reason`), then wait off the loop, until the
        `time.monotonic()` deadline the caller's drain also counted against, for the slot
        threads to close their executors; log the ones a long run keeps alive."""
        self.close(reason)
        await asyncio.to_thread(self.join, max(deadline - time.monotonic(), 0.0))
        if self.threads_alive:
            # A run cannot be aborted; its slot closes the executor as soon as it ends.
            log.warning(
                "%d executor slot(s) of %s still running after the drain timeout",
                self.threads_alive,
                what,
            )

    def join(self, timeout: float | None = None) -> None:
        """Blocking: wait, `timeout` seconds for them all, for every slot thread to
        close its executor and exit."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for slot in self.slots:
            slot.join(None if deadline is None else max(deadline - time.monotonic(), 0.0))

    @property
    def threads_alive(self) -> int:
        return sum(slot.alive for slot in self.slots)
