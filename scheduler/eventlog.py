"""What the batcher tells its adaptive controller: an event log, and who is in the system.

The batcher does not call the controller per arrival. It logs each arrival, each batch
that leaves and now and then a lone request's execution as a small tuple (arrivals.Event),
and replays the log in order before the controller is asked anything, and otherwise once
LOG_LIMIT events are pending, in a later loop turn behind the answers just given. Done
one by one between requests, these updates touched the controller's state with the caches
cold; replayed together, they run back to back.

Beside the log it keeps a Presence, updated as each event happens, so that the batcher can
decide a lone request ("anything to wait for?") without replaying the log first.
"""

from __future__ import annotations

import asyncio
import time

from .adaptive import AdaptiveController
from .arrivals import Event, Presence

# The log is replayed at the latest when it holds this many events: saturated, batches go
# out full without asking the controller, and a replay every few batches costs the loop
# about half what a call per arrival and a replay per batch cost.
LOG_LIMIT = 64
# Of the requests that ran alone and unseen, the controller's cost model is told of the
# execution of one in this many (see EventLog.ran_unseen).
ALONE_COST_EVERY = 8


class EventLog:
    """The events `controller` has not been told of yet, in the order they happened, and
    the Presence they add up to. Without a controller, nothing is logged or replayed."""

    __slots__ = ("_controller", "_events", "_log", "_replay_queued", "presence", "unseen")

    def __init__(self, controller: AdaptiveController | None) -> None:
        self._controller = controller
        self._events: list[Event] = []
        self._log = self._events.append
        self._replay_queued = False
        # Who is in the system, up to date with the log (the controller is only up to
        # date with what it replayed).
        self.presence = Presence()
        # How many requests have run alone and unseen.
        self.unseen = 0

    def arrive(self, now_ns: int, size: int, level: int) -> None:
        """`size` samples of priority `level` arrived at `now_ns`."""
        self.presence.arrive(size)
        self._log((now_ns, size, level))

    def batch_left(self, done_ns: int, leaving: int, size: int, duration_ns: int) -> None:
        """A batch of `size` left at `done_ns` after `duration_ns` on its slot: `leaving`
        samples (those not answered before), one departure for the whole batch."""
        self._log((done_ns, leaving, size, duration_ns))
        self.presence.leave(leaving, True)

    def ran_unseen(self, size: int, duration_ns: int) -> None:
        """A request that ran alone, its arrival never logged, took `duration_ns`.

        At low load this is every request, and replaying each one's cost would be a
        sizeable share of the loop's work per request; one in ALONE_COST_EVERY, the
        first of them included, keeps the estimate of a lone execution current (its
        EWMA then follows a few dozen requests)."""
        if self.unseen % ALONE_COST_EVERY == 0:
            self._log((size, duration_ns))
            self.presence.measured = True
        self.unseen += 1

    def left_unlogged(self, size: int) -> None:
        """`size` samples left without a logged execution (an error, a cancellation, a
        timeout): tell the controller now, after what the log holds."""
        controller = self._controller
        if controller is None:
            return
        if self._events:
            self.replay()
        controller.record_departure(time.monotonic_ns(), size)
        self.presence.leave(size, False)

    def catch_up(self) -> None:
        """Replay what is logged, if anything: before the controller is asked."""
        if self._events:
            self.replay()

    def replay_when_full(self) -> None:
        """Replay now once the log holds LOG_LIMIT events."""
        if len(self._events) >= LOG_LIMIT:
            self.replay()

    def replay_soon(self) -> None:
        """Once the log holds LOG_LIMIT events, replay it in a later turn: behind the
        answers just given, whose callers resume first."""
        if len(self._events) >= LOG_LIMIT and not self._replay_queued:
            self._replay_queued = True
            asyncio.get_running_loop().call_soon(self.replay)

    def replay(self) -> None:
        """Replay the logged arrivals and departures to the controller, in order."""
        self._replay_queued = False
        events = self._events
        if events and self._controller is not None:
            self._controller.record(events)
        events.clear()
