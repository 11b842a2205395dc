"""Per-priority-level request queues with deadlines on `time.monotonic_ns()`.

Each level keeps its live requests in arrival order, plus, for the DELAY timeout action, the
requests whose timeout expired: they stay queued but go behind the level's live ones, as in
Triton. Every deadline has its own loop timer, so a timeout fires on time even while the
batcher sits idle waiting for a slot or for more requests.

Levels are sparse: the levels the config names are kept for good; any other level is
opened when a request first arrives at it and dropped once it is empty again. A model
with `priority_levels` at the uint64 maximum costs what a model with two levels costs.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import enum
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ge_serve.server.errors import queue_full

from .policy import BatchPolicy, QueuePolicy, TimeoutAction
from .work import Array, WorkItem


class EntryState(enum.Enum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    DONE = "DONE"


@dataclass(eq=False, slots=True)
class Entry:
    """One request while the scheduler holds it. Compared by identity."""

    item: WorkItem
    future: asyncio.Future[dict[str, Array]]
    level: int
    enqueue_ns: int
    size: int
    key: Any
    deadline_ns: int = 0
    # The shape bucket the request is padded to (0 for a model without buckets).
    bucket: int = 0
    delayed: bool = False
    state: EntryState = EntryState.QUEUED
    timer: asyncio.TimerHandle | None = None
    # Held here until released, when responses must leave in arrival order.
    result: dict[str, Array] | None = None
    error: BaseException | None = None

    @property
    def cancelled(self) -> bool:
        return self.future.cancelled()


@dataclass(slots=True)
class _Level:
    policy: QueuePolicy
    live: collections.deque[Entry] = field(default_factory=collections.deque)
    delayed: collections.deque[Entry] = field(default_factory=collections.deque)

    def __len__(self) -> int:
        return len(self.live) + len(self.delayed)


class RequestQueue:
    """The queued requests of one model, highest priority (level 1) first.

    `on_rejected` is called on the loop for a request whose timeout expired under REJECT,
    after it has left the queue; the owner answers it. `on_delayed` is called once one
    expired under DELAY has gone behind its level's live requests: the queue's order
    changed, and a batch that was not possible may be now.
    """

    def __init__(
        self,
        policy: BatchPolicy,
        on_rejected: Callable[[Entry], None],
        on_delayed: Callable[[], None],
    ) -> None:
        self._policy = policy
        self._named = frozenset(policy.levels)
        self._levels = {level: _Level(p) for level, p in sorted(policy.levels.items())}
        # The open levels' numbers in order, and their queues in the same order.
        self._numbers = sorted(self._levels)
        self._order = [self._levels[level] for level in self._numbers]
        self._on_rejected = on_rejected
        self._on_delayed = on_delayed
        self._count = 0
        # Samples queued (requests carry their own batch dim), all levels and shapes.
        self.samples = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def depths(self) -> dict[int, int]:
        """Queued requests per priority level (level 0 when the model has no levels)."""
        return {level: len(q) for level, q in self._levels.items()}

    def put(self, entry: Entry) -> None:
        """Queue a request, or raise "Exceeds maximum queue size" when its level is full."""
        level = self._levels.get(entry.level)
        if level is None:  # not `or`: an empty level is falsy, and must not open again
            level = self._open(entry.level)
        policy = level.policy
        if policy.max_queue_size and len(level) >= policy.max_queue_size:
            raise queue_full()  # (never a level just opened: it is empty)
        timeout_us = policy.timeout_us(entry.item.timeout_us)
        level.live.append(entry)
        self._count += 1
        self.samples += entry.size
        if timeout_us:
            entry.deadline_ns = entry.enqueue_ns + timeout_us * 1000
            self._arm(entry)

    def __iter__(self) -> Iterator[Entry]:
        """Every queued request in the order batches take them."""
        for level in self._order:
            yield from level.live
            yield from level.delayed

    def first(self) -> Entry | None:
        for level in self._order:
            if level.live:
                return level.live[0]
            if level.delayed:
                return level.delayed[0]
        return None

    def remove(self, entry: Entry) -> bool:
        """Take one request out (cancelled, or going into a batch); False if not queued."""
        if entry.state is not EntryState.QUEUED:
            return False
        level = self._levels[entry.level]
        lane = level.delayed if entry.delayed else level.live
        if lane and lane[0] is entry:
            lane.popleft()
        else:
            lane.remove(entry)
        self._count -= 1
        self.samples -= entry.size
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        if not lane:
            self._close_if_empty(entry.level, level)
        return True

    def _open(self, number: int) -> _Level:
        """Open a level the config does not name, at its place in the order."""
        level = _Level(self._policy.queue_policy(number))
        self._levels[number] = level
        index = bisect.bisect(self._numbers, number)
        self._numbers.insert(index, number)
        self._order.insert(index, level)
        return level

    def _close_if_empty(self, number: int, level: _Level) -> None:
        """Drop an empty level the config does not name (only levels in use are kept)."""
        if len(level) or number in self._named:
            return
        del self._levels[number]
        index = bisect.bisect_left(self._numbers, number)
        del self._numbers[index]
        del self._order[index]

    def drain(self) -> list[Entry]:
        """Remove and return everything queued (at close)."""
        entries = list(self)
        for entry in entries:
            self.remove(entry)
        return entries

    # --- deadlines -----------------------------------------------------------------------

    def _arm(self, entry: Entry) -> None:
        delay_s = max(entry.deadline_ns - time.monotonic_ns(), 0) / 1e9
        entry.timer = asyncio.get_running_loop().call_later(delay_s, self._expire, entry)

    def _expire(self, entry: Entry) -> None:
        entry.timer = None
        if entry.state is not EntryState.QUEUED or entry.delayed:
            return
        if time.monotonic_ns() <= entry.deadline_ns:
            # Loop timers can fire a little early (uvloop rounds to milliseconds).
            self._arm(entry)
            return
        level = self._levels[entry.level]
        if level.policy.timeout_action is TimeoutAction.DELAY:
            level.live.remove(entry)
            entry.delayed = True
            level.delayed.append(entry)
            self._on_delayed()
            return
        self.remove(entry)
        self._on_rejected(entry)
