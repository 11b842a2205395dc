"""The adaptive batch controller: picks each batch's window and target size from measurements.

The batcher owns the mechanism (queues, slots, the forming loop); the controller owns one
decision. When a slot is idle and a batch is forming, `plan()` says how large the batch
should get and how long it may wait for that, as a `Plan(target, deadline_ns, limit)`. The
controller runs on the event loop and learns from the batcher's log of arrivals,
departures and executions, replayed in order before it is asked anything.

It waits only when waiting is expected to pay, from three models:

* what a batch of each size costs, priced by slot time (`CostModel`, costmodel.py): a
  batch of `m` is worth waiting for only when its per-sample throughput beats sending
  the `n` queued now by MIN_GAIN, so on hardware where cost grows linearly it never waits;
* how soon a batch fills (`ArrivalModel`, arrivals.py): from arrivals that find the system
  busy, and from the clients outside, who come back within their turnaround;
* how long a request may take (`Budgets`, budgets.py): a latency budget per priority
  level bounds every wait, and a configured budget also caps the batches of less urgent
  levels and of the batch it heads.

Once the oldest request is past a derived budget the server is saturated and latency
follows throughput: a batch may then still wait for returning clients when that serves
everyone sooner, or when what is queued would run far less efficiently per sample.

At low load this reduces to "send now"; at high load the slots stay busy, requests pile up
while they run, and batches grow to the maximum (or to the most efficient measured size).
docs/adaptive-batching.md explains the design, its reasons and every constant.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from .arrivals import ArrivalModel, Event, fill_ns
from .budgets import Budgets, budgeted_levels
from .costmodel import CostModel
from .policy import BatchPolicy

# Waiting must buy at least this much per-sample throughput.
MIN_GAIN = 1.05
# A saturated slot waits for returning clients when that serves them all this much sooner.
LATE_GAIN = 1.01
# Among sizes worth waiting for, take the smallest within this fraction of the best.
NEAR_BEST = 0.97
# The window allows this many times the expected time to fill, plus a little loop slack.
FILL_MARGIN = 2.0
FILL_SLACK_NS = 50_000
# One batch in this many ignores the efficiency limit, so that large sizes stay measured.
EXPLORE_EVERY = 16


class Plan(NamedTuple):
    """What the batcher should do now: send when `target` <= what is queued, or when
    `deadline_ns` passes; otherwise wait for more requests. A batch never holds more than
    `limit` samples. (A tuple: one is made per batch, and tuples are cheap to make.)"""

    target: int
    deadline_ns: int
    limit: int

    def due(self, queued: int, now_ns: int) -> bool:
        """Whether `queued` samples go now: the target is reached or the deadline passed."""
        return queued >= self.target or now_ns >= self.deadline_ns


class AdaptiveController:
    """Chooses batch windows and target sizes for one model's batcher. Loop-only."""

    __slots__ = (  # see CostModel
        "_bound_ns", "_limit", "_max_size", "_target", "_watched", "_window_ns", "arrivals",
        "budgets", "cost",
    )  # fmt: skip

    def __init__(self, policy: BatchPolicy, gears: Sequence[int] = ()) -> None:
        assert policy.adaptive is not None
        self._max_size = policy.max_size
        self._bound_ns = policy.max_queue_delay_us * 1000
        self.cost = CostModel(gears)
        self.arrivals = ArrivalModel(budgeted_levels(policy))
        self.budgets = Budgets(policy, self.cost, self.arrivals)
        # The levels with a configured budget (the same frozenset the parts hold).
        self._watched = self.budgets.watched
        self._target = 1
        self._limit = self._max_size
        self._window_ns = 0

    # --- measurements --------------------------------------------------------------------

    def record(self, events: Sequence[Event]) -> None:
        """Replay logged arrivals and departures, in the order they happened.

        The batcher logs each request's arrival as a tuple and replays the log here every
        few batches, and before the controller is asked anything. A call per arrival on
        the hot path touched the controller's state between two requests, with the caches
        cold; replayed together, the same updates run back to back."""
        index, count = 0, len(events)
        while index < count:
            event = events[index]
            if len(event) == 3:
                index = self.arrivals.replay(events, index)
                continue
            if len(event) == 2:
                self.cost.record(*event)
                index += 1
                continue
            now_ns, leaving, size, duration_ns = event
            self.arrivals.record_departure(now_ns, leaving)
            self.cost.record(size, duration_ns)
            index += 1

    def record_arrival(self, now_ns: int, size: int, level: int) -> None:
        self.arrivals.record_arrival(now_ns, size, level)

    def record_departure(self, now_ns: int, size: int) -> None:
        """`size` samples left (a whole batch leaves in one call)."""
        self.arrivals.record_departure(now_ns, size)

    def record_execution(self, size: int, duration_ns: int) -> None:
        self.cost.record(size, duration_ns)

    def budget_ns(self, level: int) -> int:
        """The level's latency budget (see Budgets.budget_ns)."""
        return self.budgets.budget_ns(level)

    # --- the decision --------------------------------------------------------------------

    def sent_alone(self, size: int) -> None:
        """A request that found nothing queued and a slot idle went at once, for want of
        anything to wait for (the batcher asked its Presence): what plan() would have
        decided. Records the decision for metrics as plan() does."""
        self._target = size
        self._window_ns = 0

    def sends_full(self) -> bool:
        """For a full batch (as many samples of one shape queued as a batch holds): whether
        plan() would send it whole at once, answered without planning. It would unless
        something caps batches below the maximum: a level with a configured budget, or a
        size measured less efficient. Saturated, this is every batch, and a full plan for
        each would be the larger part of the loop's work per batch. Records the decision
        for metrics as plan() does."""
        if self._watched or self.cost.efficient_limit(self._max_size) < self._max_size:
            return False
        self._target = self._limit = self._max_size
        self._window_ns = 0
        return True

    def plan_holds(self, level: int) -> bool:
        """Whether a plan for a batch headed by a `level` request stays the plan while
        more requests arrive, until its target is queued or its deadline passes: unless
        the level has a configured budget, whose cap on the batch shrinks as the head
        waits. Re-planning on every arrival, with a log replay before each plan, costs the
        loop more than the fuller batches save on a small model."""
        return level not in self._watched

    def _nothing_to_wait_for(self, idle_slots: int) -> bool:
        """No costs measured yet, another slot idle, or no client outside to come back.
        Presence.nothing_to_wait_for answers the same from the batcher's side."""
        return (
            not self.cost.known
            or idle_slots > 0
            or int(self.arrivals.peak) <= self.arrivals.in_system
        )

    def plan(
        self,
        now_ns: int,
        queued: int,
        oldest_ns: int,
        level: int,
        idle_slots: int,
        head_samples: int | None = None,
        idle_since_ns: int | None = None,
    ) -> Plan:
        """Plan the batch forming on an idle slot: `queued` samples are ready (the oldest
        enqueued at `oldest_ns`, the most urgent at `level`, `head_samples` of them at that
        level: all when None); `idle_slots` other slots idle; the slot has been idle since
        `idle_since_ns` (now when None).
        """
        self.arrivals.tick(now_ns)
        head = queued if head_samples is None else head_samples
        limit = self.budgets.size_cap(level, now_ns)
        if level in self._watched:
            limit = min(limit, self.budgets.head_cap(level, now_ns, oldest_ns, head))
        if self.cost.executions % EXPLORE_EVERY != EXPLORE_EVERY - 1:
            limit = self.cost.efficient_limit(limit)
        since = now_ns if idle_since_ns is None else idle_since_ns
        plan = self._choose(now_ns, queued, oldest_ns, level, idle_slots, limit, since)
        self._target = plan.target
        self._limit = plan.limit
        self._window_ns = max(plan.deadline_ns - oldest_ns, 0)
        return plan

    def _choose(
        self,
        now_ns: int,
        n: int,
        oldest_ns: int,
        level: int,
        idle_slots: int,
        limit: int,
        idle_since_ns: int,
    ) -> Plan:
        send_now = Plan(min(n, limit), now_ns, limit)
        if n >= limit or self._nothing_to_wait_for(idle_slots):
            return send_now
        arrivals = self.arrivals
        potential = int(arrivals.peak) - arrivals.in_system
        rate, outside = arrivals.estimates()
        cost_ns = self.cost.cost_ns
        budget = self.budgets.planning_ns(level)
        end_ns = oldest_ns + int(budget)
        bound_ns = oldest_ns + self._bound_ns if self._bound_ns else end_ns
        # A derived budget lets a late batch wait for throughput (see the module's text
        # and docs/adaptive-batching.md, "Saturated"),
        # for at most the budget from when the slot went idle.
        late_by = -1
        if level not in self._watched:
            late_by = idle_since_ns + int(budget)
            if self._bound_ns:
                late_by = min(late_by, bound_ns)
        reachable = min(limit, n + potential)
        # Saturated, the slot serves the n queued and the `potential` coming back either
        # way: sending now pays for a second batch (and for any wait for them beyond the
        # first one's execution); waiting for m pays the wait, and a second batch only for
        # whoever is left.
        everyone = n + potential
        sent_cost = cost_ns(n)
        all_back = fill_ns(potential, potential, rate, outside)
        send_first_ns = max(sent_cost, all_back) + cost_ns(min(potential, limit))
        # Candidates n+1, n+2, n+4, ... below `reachable`, and `reachable`, ascending.
        # Timely ones fill in time for the budget (per-sample throughput, when they must
        # start); late ones only under a derived budget (per-sample throughput, time to
        # serve everyone).
        timely: list[tuple[int, float, int]] = []
        late: list[tuple[int, float, float]] = []
        step = 1
        while True:
            m = n + step if n + step < reachable else reachable
            cost = cost_ns(m)
            fill = fill_ns(m - n, potential, rate, outside)
            start_by = min(end_ns - int(cost), bound_ns)
            if now_ns + fill <= start_by:
                timely.append((m, m / cost, start_by))
            elif now_ns + fill <= late_by:
                rest = min(everyone - m, limit)
                total = fill + cost
                if rest > 0:
                    total = max(total, all_back) + cost_ns(rest)
                late.append((m, m / cost, total))
            if m == reachable:
                break
            step *= 2
        own_tp = n / sent_cost
        best_tp = max((tp for _, tp, _ in timely), default=0.0)
        if best_tp >= MIN_GAIN * own_tp:
            # The smallest candidate near the best: the shortest wait that is worth it.
            target, _, start_by = next(c for c in timely if c[1] >= NEAR_BEST * best_tp)
        elif late:
            # Saturated: latency follows throughput. The quickest way to serve everyone;
            # else, when what is queued would run a batch much less efficient than one
            # the returning clients fill in time, the smallest batch near the best.
            quickest, _, total = min(late, key=lambda c: c[2])
            best_tp = max(best_tp, max(tp for _, tp, _ in late))
            if total * LATE_GAIN < send_first_ns:
                target = quickest
            elif best_tp >= MIN_GAIN * own_tp:
                target = next(m for m, tp, _ in (*timely, *late) if tp >= NEAR_BEST * best_tp)
            else:
                return send_now
            start_by = late_by
        else:
            return send_now
        to_fill_ns = fill_ns(target - n, potential, rate, outside)
        deadline = min(start_by, now_ns + int(FILL_MARGIN * to_fill_ns) + FILL_SLACK_NS)
        return Plan(target=target, deadline_ns=deadline, limit=limit)

    # --- for metrics and statistics -------------------------------------------------------

    @property
    def window_us(self) -> float:
        """The window of the latest decision (from the batch's oldest request)."""
        return self._window_ns / 1000

    @property
    def target_batch_size(self) -> int:
        return self._target

    def snapshot(self) -> dict[str, Any]:
        arrivals = self.arrivals
        return {
            "window_us": round(self.window_us, 1),
            "target_batch_size": self._target,
            "batch_limit": self._limit,
            "arrival_rate_per_s": round(arrivals.arrivals_per_s(), 1),
            "busy_arrival_rate_per_s": round(arrivals.busy_rate_per_ns() * 1e9, 1),
            "peak_in_system": round(arrivals.peak, 1),
            "time_outside_us": round(min(arrivals.time_outside_ns(), 1e15) / 1000, 1),
            "budgets_us": self.budgets.table_us(),
            "cost_us": self.cost.table_us(),
        }
