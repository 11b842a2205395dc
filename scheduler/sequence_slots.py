"""The sequence batcher's bookkeeping: requests, sequences, sequence slots, instances.

A sequence is bound to one slot of one instance (an executor slot) while it runs, or
waits in the backlog; its requests queue on it in arrival order. sequence.py holds the
rules that move them.
"""

from __future__ import annotations

import asyncio
import collections

from .correlation import CorrelationId, SequenceFlags
from .dispatch import ExecutorSlot
from .work import Array, WorkItem


class Request:
    __slots__ = ("cancelled", "flags", "future", "item", "sequence")

    def __init__(
        self,
        item: WorkItem,
        flags: SequenceFlags,
        future: asyncio.Future[dict[str, Array]],
        sequence: ActiveSequence,
    ) -> None:
        self.item = item
        self.flags = flags
        self.future = future
        self.sequence = sequence
        # Its client cancelled it while it was queued: its sequence ends when the
        # scheduler reaches it (sequence.py).
        self.cancelled = False


class ActiveSequence:
    __slots__ = ("expiry", "expiry_ns", "id", "last_ns", "queue", "running", "slot", "state")

    def __init__(self, correlation_id: CorrelationId, now_ns: int) -> None:
        self.id = correlation_id
        # While in the backlog: when its earliest request timeout expires, and its timer.
        self.expiry_ns = 0
        self.expiry: asyncio.TimerHandle | None = None
        self.slot: Slot | None = None  # None while in the backlog
        self.queue: collections.deque[Request] = collections.deque()
        self.state: dict[str, Array] | None = None
        self.last_ns = now_ns
        self.running = False


class Slot:
    __slots__ = ("instance", "position", "sequence")

    def __init__(self, instance: Instance, position: int) -> None:
        self.instance = instance
        self.position = position
        self.sequence: ActiveSequence | None = None


class Instance:
    __slots__ = ("busy", "executor", "hold", "slots", "timer")

    def __init__(self, executor: ExecutorSlot, slots: int) -> None:
        self.executor = executor
        self.slots = [Slot(self, position) for position in range(slots)]
        self.busy = False
        self.timer: asyncio.TimerHandle | None = None
        # TRITONSERVER_DELAY_SCHEDULER: the queued requests to wait for before the first
        # batch; 0 once reached (sequence_hold.py).
        self.hold = 0

    def bound(self) -> int:
        return sum(slot.sequence is not None for slot in self.slots)

    def cancelled_heads(self) -> list[tuple[Slot, ActiveSequence]]:
        """The slots whose sequence, not running, has a cancelled request next."""
        return [
            (slot, sequence)
            for slot in self.slots
            if (sequence := slot.sequence) is not None
            and sequence.queue
            and sequence.queue[0].cancelled
            and not sequence.running
        ]


def idle_slots(
    instances: list[Instance], idle_ns: int, now_ns: int
) -> tuple[list[tuple[Slot, ActiveSequence]], int | None]:
    """The slots whose sequences have had nothing queued or running for `idle_ns`, and
    when the next of the others could be idle (1 ms on at the soonest)."""
    idle: list[tuple[Slot, ActiveSequence]] = []
    next_ns: int | None = None
    for slot in (slot for instance in instances for slot in instance.slots):
        if (sequence := slot.sequence) is None:
            continue
        due_ns = sequence.last_ns + idle_ns
        if sequence.queue or sequence.running or now_ns < due_ns:
            due_ns = max(due_ns, now_ns + 1_000_000)
            next_ns = due_ns if next_ns is None else min(next_ns, due_ns)
        else:
            idle.append((slot, sequence))
    return idle, next_ns


# One row of a sequence batch: its sequence and request, or (None, None) for a null request.
Row = tuple[ActiveSequence | None, Request | None, WorkItem]
