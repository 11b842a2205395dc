"""The sequence batcher: stateful models, with Triton's sequence-batching semantics.

Each request names a sequence (its correlation ID) and says whether it starts or ends
it (correlation.py). A sequence is bound to one sequence slot of one model instance
(executor slot) from its START request on, and every request of it runs on that
instance, in arrival order, one at a time. An instance has `max_batch_size` slots under
the `direct` strategy (the slot is the sequence's row in every batch) and
`max_candidate_sequences` under `oldest`. When every slot is taken, a new sequence
waits in the backlog, with all the requests it receives meanwhile, until a slot frees;
a request timeout refuses the whole backlogged sequence once it expires, as in Triton.

Whenever an instance is idle and one of its sequences has a request queued, a batch
forms: under `direct`, one request per ready slot at the slot's row, the rows between
filled with null requests (READY false, their outputs dropped), once
`minimum_slot_utilization` of the slots are ready or the oldest request has waited
`max_queue_delay_microseconds`; under `oldest`, the oldest heads of its sequences, by
Triton's dynamic-batching rules (preferred sizes, the delay). Requests batch only when
their shapes agree.

The scheduler fills each request's control inputs (START, END, READY, CORRID) and its
implicit state: a sequence's state input is its previous request's state output (the
configured initial state on START), and a state output the config does not list is not
returned. A sequence that sends nothing for `max_sequence_idle_microseconds` loses its
slot, and its next request without START gets Triton's error; so does a request of a
sequence that has ended. A queued request its client cancels ends its sequence when the
scheduler reaches it (the head of a queue, or a backlogged sequence given a slot), as in
Triton: the requests the sequence has queued are CANCELLED and its slot is released.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_serve.backends.base import takes_requests
from ge_serve.server.errors import (
    ErrorCode,
    FailureReason,
    SchedulerClosed,
    ServerError,
    invalid_arg,
    request_cancelled,
)

from .batch import client_error, execute_batch
from .correlation import CorrelationId
from .decision import BatchView, Take, TritonRules
from .dispatch import SlotPool
from .policy import BatchPolicy
from .sequence_config import SequencePolicy, Strategy, check_request, row_inputs
from .sequence_hold import DelayHold
from .sequence_slots import ActiveSequence, Instance, Request, Row, Slot, idle_slots
from .work import Array, Timings, WorkItem

log = logging.getLogger(__name__)

_NEVER_RAN = "model was unloaded before the request could run"


class SequenceBatcher:
    def __init__(
        self,
        pool: SlotPool,
        policy: SequencePolicy,
        gears: Sequence[int] = (),
        delay_counts: tuple[int, int] = (0, 0),
    ) -> None:
        """`delay_counts`: TRITONSERVER_DELAY_SCHEDULER and _BACKLOG_DELAY_SCHEDULER."""
        self._pool = pool
        self._policy = policy
        self._gears = tuple(gears)
        self._instances = [Instance(s, policy.slots_per_instance) for s in pool.slots]
        self._hold = DelayHold(policy.strategy, self._instances, *delay_counts)
        # Sequences whose requests are still expected, by ID (bound or in the backlog).
        self._sequences: dict[CorrelationId, ActiveSequence] = {}
        self._backlog: collections.deque[ActiveSequence] = collections.deque()
        self._rules = TritonRules(
            BatchPolicy(
                model=policy.model,
                max_batch_size=policy.max_batch_size,
                max_size=max(policy.max_batch_size, 1),
                preferred_sizes=policy.preferred_sizes,
                max_queue_delay_us=policy.max_queue_delay_us,
            )
        )
        self._pending = 0
        self._queued = 0
        self._reaper: asyncio.TimerHandle | None = None
        self._closing = False
        self._drained = asyncio.Event()

    @property
    def pending(self) -> int:
        return self._pending

    def queue_depths(self) -> dict[int, int]:
        return {0: self._queued}

    # --- admission -----------------------------------------------------------------------

    async def submit(self, item: WorkItem) -> dict[str, Array]:
        if self._closing:
            raise SchedulerClosed()
        flags = check_request(self._policy, item)
        now = time.monotonic_ns()
        item.enqueue_ns = item.enqueue_ns or now
        sequence = self._sequences.get(flags.correlation_id)
        if sequence is None:
            if not flags.start:
                raise invalid_arg(
                    f"inference request for sequence {flags.id_text()} to model "
                    f"'{self._policy.model}' must specify the START flag on the first "
                    "request of the sequence"
                )
            sequence = self._start(flags.correlation_id, now)
        elif flags.start:
            log.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not "
                "end before this sequence start. Previous sequence will be terminated early.",
                flags.id_text(),
                self._policy.model,
            )
        future: asyncio.Future[dict[str, Array]] = asyncio.get_running_loop().create_future()
        request = Request(item, flags, future, sequence)
        sequence.queue.append(request)
        sequence.last_ns = now
        if flags.end:
            # Forget the ID: a later START with it begins a new sequence.
            del self._sequences[flags.correlation_id]
        self._pending += 1
        self._queued += 1
        if self._hold.active:  # a request anywhere may be the one the hold waits for
            for instance in self._instances:
                self._kick(instance)
        elif sequence.slot is not None:
            self._kick(sequence.slot.instance)
        if sequence.slot is None and item.timeout_us:
            self._arm_expiry(sequence, now + item.timeout_us * 1000)
        self._arm_reaper()
        try:
            return await future
        except asyncio.CancelledError:
            if request in sequence.queue:
                # As in Triton, it stays queued, marked, until the scheduler reaches it:
                # then its whole sequence is cancelled (_kick, _release).
                request.cancelled = True
                if sequence.slot is not None:
                    self._kick(sequence.slot.instance)
            raise

    def _start(self, correlation_id: CorrelationId, now_ns: int) -> ActiveSequence:
        """A new sequence: bound to a free slot (least-loaded instance, lowest row), or
        into the backlog."""
        sequence = ActiveSequence(correlation_id, now_ns)
        self._sequences[correlation_id] = sequence
        free = [
            slot
            for instance in sorted(self._instances, key=Instance.bound)
            for slot in instance.slots
            if slot.sequence is None
        ]
        if free:
            self._bind(free[0], sequence)
        else:
            self._backlog.append(sequence)
        return sequence

    def _bind(self, slot: Slot, sequence: ActiveSequence) -> None:
        slot.sequence = sequence
        sequence.slot = slot
        if sequence.expiry is not None:
            sequence.expiry.cancel()
            sequence.expiry = None

    def _arm_expiry(self, sequence: ActiveSequence, deadline_ns: int) -> None:
        """A backlogged sequence times out with its earliest request timeout, as in
        Triton: all its requests are then refused."""
        if sequence.expiry_ns and sequence.expiry_ns <= deadline_ns:
            return
        sequence.expiry_ns = deadline_ns
        if sequence.expiry is not None:
            sequence.expiry.cancel()
        delay_s = max(deadline_ns - time.monotonic_ns(), 0) / 1e9
        loop = asyncio.get_running_loop()
        sequence.expiry = loop.call_later(delay_s, self._expire, sequence)

    def _expire(self, sequence: ActiveSequence) -> None:
        sequence.expiry = None
        if sequence.slot is not None or sequence not in self._backlog:
            return
        self._backlog.remove(sequence)
        error = ServerError(  # a timeout in the scheduler: Triton's REJECTED
            ErrorCode.UNAVAILABLE,
            "timeout of the corresponding sequence has been expired",
            FailureReason.REJECTED,
        )
        self._abandon(sequence, error)

    def _abandon(self, sequence: ActiveSequence, error: ServerError) -> None:
        """End a sequence that is not running: its ID is forgotten (a later request of it
        must START again) and every request it has queued fails with `error`."""
        if self._sequences.get(sequence.id) is sequence:
            del self._sequences[sequence.id]
        if sequence.expiry is not None:
            sequence.expiry.cancel()
            sequence.expiry = None
        while sequence.queue:
            request = sequence.queue.popleft()
            self._queued -= 1
            self._pending -= 1
            if not request.future.done():
                request.future.set_exception(error)
        self._check_drained()

    def _release(self, slot: Slot) -> None:
        """Free a slot; the oldest sequence in the backlog takes it."""
        sequence = slot.sequence
        if sequence is not None:
            sequence.slot = None
        slot.sequence = None
        while self._backlog:
            waiting = self._backlog.popleft()
            if any(request.cancelled for request in waiting.queue):
                # Triton: a backlogged sequence with a cancelled request is cancelled whole.
                self._abandon(waiting, request_cancelled())
                continue
            if waiting.queue or self._sequences.get(waiting.id) is waiting:
                waiting.last_ns = time.monotonic_ns()  # its idle time starts with its slot
                self._bind(slot, waiting)
                self._kick(slot.instance)
                return

    # --- batches -------------------------------------------------------------------------

    def _kick(self, instance: Instance) -> None:
        """If the instance is idle, form its next batch now, or arm a timer for when."""
        if instance.busy:
            return
        for slot, sequence in instance.cancelled_heads():
            # Triton ends the sequence, its queue and its slot (unless a nested _kick did).
            if slot.sequence is sequence:
                self._abandon(sequence, request_cancelled())
                self._release(slot)
        if instance.busy or self._hold.holds(instance, self._backlog):
            return
        if instance.timer is not None:
            instance.timer.cancel()
            instance.timer = None
        ready = [
            slot
            for slot in instance.slots
            if slot.sequence is not None and slot.sequence.queue and not slot.sequence.running
        ]
        if not ready:
            return
        now = time.monotonic_ns()
        oldest = min(ready, key=lambda s: _head(s).item.enqueue_ns)
        key = self._key(_head(oldest))
        ready = [slot for slot in ready if self._key(_head(slot)) == key]
        policy = self._policy
        wake_ns: int | None = None
        rows: list[Slot | None]
        if policy.strategy is Strategy.DIRECT:
            delay_ns = policy.max_queue_delay_us * 1000
            started = _head(oldest).item.enqueue_ns
            utilization = len(ready) / len(instance.slots)
            short = delay_ns and utilization < policy.minimum_slot_utilization
            if short and now < started + delay_ns:
                wake_ns = started + delay_ns
            last = max(slot.position for slot in ready)
            chosen = {slot.position: slot for slot in ready}
            rows = [chosen.get(position) for position in range(last + 1)]
        else:
            ready.sort(key=lambda s: _head(s).item.enqueue_ns)
            ready = ready[: max(policy.max_batch_size, 1)]
            totals = list(range(1, len(ready) + 1))
            full = len(ready) >= max(policy.max_batch_size, 1)
            started = _head(ready[0]).item.enqueue_ns
            view = BatchView(
                totals=totals,
                oldest_ns=started,
                level=0,
                head_samples=len(ready),
                idle_slots=0,
                idle_since_ns=now,
                full=full,
            )
            answer = self._rules.decide(view, now)
            if isinstance(answer, Take):
                rows = list(ready[: answer.samples])
            else:
                wake_ns = answer.deadline_ns
                rows = []
        if wake_ns is not None:
            delay_s = max(wake_ns - now, 0) / 1e9
            instance.timer = asyncio.get_running_loop().call_later(delay_s, self._kick, instance)
            return
        self._launch(instance, rows, now)

    def _key(self, request: Request) -> object:
        sequence_state = self._state_for(request)
        return (
            request.item.shape_key(),
            tuple((name, a.shape, a.dtype.str) for name, a in sequence_state.items()),
        )

    def _state_for(self, request: Request) -> dict[str, Array]:
        """The implicit state a request runs with: its sequence's, or on START (or
        before the sequence has one) the initial state."""
        state = request.sequence.state
        if request.flags.start or state is None:
            return {s.input_name: s.initial for s in self._policy.states}
        return state

    def _launch(self, instance: Instance, rows: list[Slot | None], now: int) -> None:
        template: WorkItem | None = None
        batch: list[Row] = []
        ended: list[ActiveSequence] = []
        for slot in rows:
            if slot is None or slot.sequence is None:
                batch.append((None, None, WorkItem({}, 1)))
                continue
            sequence = slot.sequence
            request = sequence.queue.popleft()
            self._queued -= 1
            item, flags = request.item, request.flags
            item.timings.queue_ns = now - item.enqueue_ns
            try:
                inputs = row_inputs(self._policy, item.inputs, flags, self._state_for(request))
            except Exception as exc:
                # It alone fails, as if it had run: its sequence is not left running, which
                # would hold its slot for good (the reaper skips running sequences).
                self._fail_unlaunched(request, exc, now)
                if flags.end:
                    ended.append(sequence)
                if self._policy.strategy is Strategy.DIRECT:  # the rows after keep their place
                    batch.append((None, None, WorkItem({}, 1)))
                continue
            sequence.running = True
            row = WorkItem(inputs, 1, context=item.context, timings=item.timings)
            template = template or row
            batch.append((sequence, request, row))
        if template is not None:
            self._run(instance, batch, template)
        else:  # the instance stays idle: other sequences' requests go in the next turn
            asyncio.get_running_loop().call_soon(self._kick, instance)
        # Only now: a backlogged sequence taking a slot kicks the instance.
        for slot in [sequence.slot for sequence in ended if sequence.slot is not None]:
            self._release(slot)
        self._check_drained()

    def _fail_unlaunched(self, request: Request, exc: Exception, now: int) -> None:
        where = f"sequence {request.flags.id_text()} for model '{self._policy.model}'"
        message = f"the control and state inputs of {where} could not be set"
        log.error("%s", message, exc_info=exc)
        request.sequence.last_ns = now
        self._pending -= 1
        message += f": {type(exc).__name__}: {exc}"
        reason = FailureReason.OTHER  # a fault of the scheduler's, not of the model
        if not request.future.done():
            request.future.set_exception(ServerError(ErrorCode.INTERNAL, message, reason))

    def _run(self, instance: Instance, batch: list[Row], template: WorkItem) -> None:
        """Run a batch; its null requests get a real one's tensors, READY false."""
        policy = self._policy
        for index, (_, real_request, _) in enumerate(batch):
            if real_request is None:
                inputs = row_inputs(policy, template.inputs, None, {})
                batch[index] = (None, None, WorkItem(inputs, 1, timings=Timings()))
        if takes_requests(instance.executor.executor):
            batch = [entry for entry in batch if entry[1] is not None]
        items = [entry[2] for entry in batch]
        real = [entry[2] for entry in batch if entry[1] is not None]
        gears, batching = self._gears, policy.batching
        instance.busy = True

        def job(executor: Any) -> list[dict[str, Array]]:
            results = execute_batch(executor, items, gears, batching)
            for number, item in enumerate(real):
                item.timings.first_in_batch = number == 0
            return results

        instance.executor.run_then(
            job, lambda results, exc: self._done(instance, batch, results, exc)
        )

    def _done(
        self,
        instance: Instance,
        batch: list[Row],
        results: list[dict[str, Array]] | None,
        exc: BaseException | None,
    ) -> None:
        instance.busy = False
        instance.executor.executions += 1
        policy = self._policy
        now = time.monotonic_ns()
        if exc is not None or results is None:
            exc = exc or RuntimeError("the batch returned no results")
            log.error("sequence batch failed on %s: %s", instance.executor.name, exc)
        ended: list[Slot] = []
        for index, (sequence, request, _row) in enumerate(batch):
            if sequence is None or request is None:
                continue
            sequence.running = False
            sequence.last_ns = now
            self._pending -= 1
            if results is None or exc is not None:
                if not request.future.done():
                    request.future.set_exception(client_error(exc or RuntimeError()))
            else:
                outputs = dict(results[index])
                if policy.states:
                    state = {}
                    for spec in policy.states:
                        value = outputs.get(spec.output_name)
                        if value is not None:
                            kept = value[0] if policy.batching else value
                            state[spec.input_name] = np.array(kept)
                        if spec.output_name not in policy.outputs:
                            outputs.pop(spec.output_name, None)
                    sequence.state = state or sequence.state
                if not request.future.done():
                    request.future.set_result(outputs)
            if request.flags.end and sequence.slot is not None:
                ended.append(sequence.slot)
        # Freed only now, so that a backlogged sequence taking a slot sees this batch's
        # sequences as ready again.
        for slot in ended:
            self._release(slot)
        self._kick(instance)
        self._check_drained()

    # --- idle sequences ------------------------------------------------------------------

    def _arm_reaper(self, delay_ns: int | None = None) -> None:
        if self._reaper is None:
            delay_s = (self._policy.idle_us * 1000 if delay_ns is None else delay_ns) / 1e9
            self._reaper = asyncio.get_running_loop().call_later(delay_s, self._reap)

    def _reap(self) -> None:
        """Free the slots of sequences idle for max_sequence_idle_microseconds; look
        again when the next one would be."""
        self._reaper = None
        now = time.monotonic_ns()
        idle_ns = self._policy.idle_us * 1000
        idle, next_ns = idle_slots(self._instances, idle_ns, now)
        for slot, sequence in idle:
            model = self._policy.model
            log.info("sequence %s of model '%s' idle: its slot is freed", sequence.id, model)
            if self._sequences.get(sequence.id) is sequence:
                del self._sequences[sequence.id]
            self._release(slot)
            if slot.sequence is not None:  # a backlogged sequence took it
                next_ns = now if next_ns is None else next_ns
        if next_ns is not None:
            self._arm_reaper(max(next_ns - now, 0) or idle_ns)
        elif self._backlog:
            self._arm_reaper()

    # --- closing -------------------------------------------------------------------------

    async def close(self, drain_timeout_s: float) -> None:
        deadline = time.monotonic() + drain_timeout_s  # one wait for the drain and the join
        self._closing = True
        self._check_drained()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), drain_timeout_s)
        if self._reaper is not None:
            self._reaper.cancel()
        error = SchedulerClosed(_NEVER_RAN)
        sequences = [s.sequence for i in self._instances for s in i.slots if s.sequence]
        for sequence in (*sequences, *self._backlog):
            while sequence.queue:
                request = sequence.queue.popleft()
                if not request.future.done():
                    request.future.set_exception(error)
        for instance in self._instances:
            if instance.timer is not None:
                instance.timer.cancel()
        for sequence in self._backlog:
            if sequence.expiry is not None:
                sequence.expiry.cancel()
        await self._pool.shutdown(error, deadline, f"'{self._policy.model}'")

    def _check_drained(self) -> None:
        if self._closing and self._pending == 0:
            self._drained.set()


def _head(slot: Slot) -> Request:
    assert slot.sequence is not None
    return slot.sequence.queue[0]
