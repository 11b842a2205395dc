"""When a batch goes and how large it is: the one decision behind a narrow interface.

The dynamic batcher (batcher.py) and its batch former (former.py) own the mechanism:
queues, slots, the loop that forms batches. Whenever a slot is idle and requests are
queued, the former describes the batch that could go now as a `BatchView` and asks its
`Decider`: `decide(view, now_ns)` answers `Take(samples)` (send the leading requests
that fit in that many samples) or `WaitUntil(deadline_ns, target)` (look again at the
deadline, or as soon as `target` samples are queued behind the same head). The batcher
tells the decider what happened through `observe(event)`: a request arrived, a batch
left after running, requests left without running.

Two deciders exist. `TritonRules` (here) applies Triton's dynamic-batching rules:
preferred sizes and the maximum go at once, anything else once its oldest request is
`max_queue_delay_microseconds` old. `AdaptiveDecider` (adaptive.py) asks the adaptive
controller, which learns from the events. Both are pure enough to be unit-tested
without an event loop: a view in, an answer out.

A decider that `sees_device` also gets, in the view, the batches executing on the other
slots of the slot's device when that device runs one execution at a time (`on_device`):
a batch sent now would wait for them. The batcher asks it again when one of them ends.
The adaptive controller uses this to form a slot's batch when the device is about to
free; Triton's rules do not look.

The batcher's fast path ("nothing in the server and a slot idle: run now") asks the same
`decide()` about the arriving request alone, when the decider allows it (`immediate`),
before telling it of the arrival: a request that runs alone in an empty server is
reported only by its execution (`Ran`), unless another arrives while it runs. The
adaptive controller answers such a question from its estimates alone; Triton's rules
keep the former's loop turn, in which requests submitted together batch together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from .dispatch import Executing
from .policy import BatchPolicy


class Arrived(NamedTuple):
    """`size` samples of priority `level` arrived at `now_ns`."""

    now_ns: int
    size: int
    level: int


class Left(NamedTuple):
    """A batch of `size` samples (of bucket `bucket`) left at `now_ns` after `duration_ns`
    on its slot; `leaving` of its samples had not been answered before."""

    now_ns: int
    leaving: int
    size: int
    duration_ns: int
    bucket: int = 0


class Dropped(NamedTuple):
    """`size` samples left at `now_ns` without running: an error, a cancellation, a
    timeout."""

    now_ns: int
    size: int


class Ran(NamedTuple):
    """A request ran alone for `duration_ns` (`size` samples, bucket `bucket`), its
    arrival never observed: it found the server empty and left before anything else
    arrived (the batcher's fast path)."""

    size: int
    duration_ns: int
    bucket: int = 0


Event = Arrived | Left | Dropped | Ran


class BatchView(NamedTuple):
    """The batch that could go now: the queue's leading requests of the head's shape.

    `totals` holds the running sample count after each of those requests (so
    `totals[-1]` is what would go); `full` says the next request of that shape would not
    fit, or the maximum is reached. `head` identifies the request heading the batch
    (None: a request that found nothing queued, asked about at once). `unseen`: samples
    in the view whose arrival the decider has not been told of (the fast path asks
    before it tells). `on_device`: the batches executing on the other slots of the slot's
    device, when that device runs one execution at a time and the decider asks
    (`sees_device`), in the order they were handed over: a batch sent now waits for
    them. `joinable`: samples of the head's key (its shape, or its shape bucket) that may
    still arrive and join the batch: that key's clients outside the server (census.py);
    -1 where that is not known."""

    totals: Sequence[int]
    oldest_ns: int
    level: int
    head_samples: int
    idle_slots: int
    idle_since_ns: int
    full: bool
    head: object = None
    bucket: int = 0
    unseen: int = 0
    on_device: Sequence[Executing] = ()
    joinable: int = -1

    @property
    def queued(self) -> int:
        return self.totals[-1]


class Take(NamedTuple):
    """Send the leading requests that fit in `samples` (always at least one)."""

    samples: int


class WaitUntil(NamedTuple):
    """Send nothing yet; look again at `deadline_ns`, or on a new arrival. With `target`
    set, an arrival changes nothing until `target` samples are queued behind the same
    head, and the batcher need not ask before then."""

    deadline_ns: int
    target: int = 0


Answer = Take | WaitUntil


class Decider(Protocol):
    # Whether a request that finds nothing queued and a slot idle is decided at once.
    immediate: bool
    # Whether views carry the batches executing on the slot's device (`on_device`); the
    # batcher then asks again when one of them ends.
    sees_device: bool

    def observe(self, event: Event) -> None: ...

    def decide(self, view: BatchView, now_ns: int) -> Answer: ...


class TritonRules:
    """Triton's dynamic batcher: a preferred size (the largest one reachable) or the
    maximum goes at once; otherwise the batch waits until its oldest request is
    `max_queue_delay_microseconds` old, and then goes as it is."""

    immediate = False
    sees_device = False

    def __init__(self, policy: BatchPolicy) -> None:
        self._window_ns = policy.max_queue_delay_us * 1000
        self._preferred = frozenset(policy.preferred_sizes)
        self._target = max(policy.preferred_sizes, default=policy.max_size)

    def observe(self, event: Event) -> None:
        pass

    def decide(self, view: BatchView, now_ns: int) -> Answer:
        window = self._window_ns
        expired = window > 0 and now_ns - view.oldest_ns >= window
        totals = view.totals
        if not expired:
            best = preferred_prefix(totals, self._preferred, self._target)
            if best:
                return Take(best)
        total = totals[-1]
        if view.full or total >= self._target or window == 0 or expired:
            return Take(total)
        return WaitUntil(view.oldest_ns + window)


def preferred_prefix(totals: Sequence[int], preferred: frozenset[int], target: int) -> int:
    """The samples of the batch Triton prefers among these running totals: the largest
    total that is a preferred size; failing that, when the totals pass the largest
    preferred size (`target`), the last total before it. 0: no preference applies."""
    if not preferred:
        return 0
    best = 0
    before = 0
    for index, total in enumerate(totals):
        if total in preferred:
            best = total
        elif index and not best and not before and total > target:
            before = totals[index - 1]
    return best or before
