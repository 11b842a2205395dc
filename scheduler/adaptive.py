"""The adaptive batch controller: picks each batch's window and target size from measurements.

The batcher owns the mechanism (queues, slots, the forming loop); the controller owns one
decision, behind the `Decider` interface (decision.py) through `AdaptiveDecider`. The
batcher reports events (an arrival, a batch leaving, requests dropped); the decider logs
them and replays the log to the controller in order, before it is asked anything and
otherwise every LOG_LIMIT events. When a slot is idle and a batch could go, `plan()` says
how large the batch should get and how long it may wait for that, as a `Plan(target,
deadline_ns, limit)`.

The controller is made of pure parts:

* estimators, which only learn from events: what a batch of each size costs, priced by
  slot time (`CostModel`, costmodel.py, one per shape bucket, so padded work is priced
  as the work it is); how soon a batch fills (`ArrivalModel`, arrivals.py); how long a
  request may take (`Budgets`, budgets.py: a latency budget per priority level bounds
  every wait, and a configured budget also caps batches);
* a decision function, `choose()` (choice.py), which turns their estimates into a plan
  and keeps no state.

At low load this reduces to "send now"; at high load the slots stay busy, requests pile up
while they run, and batches grow to the maximum (or to the most efficient measured size).
With several slots on a device that runs one execution at a time, a slot's batch forms
when the device is about to free from the other slots' executions, priced by the cost
model (`form_by_ns`), not when the slot frees.
docs/adaptive-batching.md explains the design, its reasons and every constant.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from .arrivals import ArrivalModel
from .budgets import Budgets, budgeted_levels
from .choice import Estimates, Plan, best_part, choose, form_by_ns
from .costmodel import CostModel
from .decision import Answer, Arrived, BatchView, Event, Left, Ran, Take, WaitUntil
from .dispatch import Executing
from .policy import BatchPolicy

# One batch in this many ignores the efficiency limit, so that large sizes stay measured.
EXPLORE_EVERY = 16
# The log is replayed at the latest when it holds this many events, in a later loop turn
# (behind the answers just given): saturated, batches go out full without asking the
# controller, and a replay every few batches costs the loop less than a call per event.
LOG_LIMIT = 64
# Of the requests that ran alone and unseen (`Ran`), the cost model learns the execution
# of one in this many, the first included: at low load that is every request, and
# learning each one's cost would be a sizeable share of the loop's work per request; the
# EWMA of a lone execution then follows a few dozen requests.
ALONE_COST_EVERY = 8

__all__ = [
    "ALONE_COST_EVERY", "EXPLORE_EVERY", "LOG_LIMIT", "AdaptiveController", "AdaptiveDecider",
    "Plan",
]  # fmt: skip


class AdaptiveController:
    """Chooses batch windows and target sizes for one model's batcher. Loop-only."""

    __slots__ = (  # see CostModel
        "_bound_ns", "_costs", "_gears", "_limit", "_max_size", "_target", "_watched",
        "_window_ns", "arrivals", "budgets", "cost",
    )  # fmt: skip

    def __init__(self, policy: BatchPolicy, gears: Sequence[int] = ()) -> None:
        assert policy.adaptive is not None
        self._max_size = policy.max_size
        self._bound_ns = policy.max_queue_delay_us * 1000
        self._gears = tuple(gears)
        # Bucket 0's cost model (every batch of a model without shape buckets).
        self.cost = CostModel(gears)
        self._costs: dict[int, CostModel] = {0: self.cost}
        self.arrivals = ArrivalModel(budgeted_levels(policy))
        self.budgets = Budgets(policy, self.cost, self.arrivals)
        # The levels with a configured budget (the same frozenset the parts hold).
        self._watched = self.budgets.watched
        self._target = 1
        self._limit = self._max_size
        self._window_ns = 0

    # --- measurements --------------------------------------------------------------------

    def record(self, events: Sequence[Event]) -> None:
        """Learn from events, in the order they happened."""
        arrivals = self.arrivals
        for event in events:
            kind = type(event)
            if kind is Arrived:
                arrivals.record_arrival(*event)  # type: ignore[arg-type]
            elif kind is Left:
                now_ns, leaving, size, duration_ns, bucket = event  # type: ignore[misc]
                arrivals.record_departure(now_ns, leaving)
                self.cost_for(bucket).record(size, duration_ns)
            elif kind is Ran:
                size, duration_ns, bucket = event  # type: ignore[misc]
                self.cost_for(bucket).record(size, duration_ns)
            else:
                arrivals.record_departure(*event)  # type: ignore[arg-type]

    def cost_for(self, bucket: int) -> CostModel:
        """The cost model of batches padded to shape bucket `bucket` (0 without buckets)."""
        cost = self._costs.get(bucket)
        if cost is None:
            cost = self._costs[bucket] = CostModel(self._gears)
        return cost

    def budget_ns(self, level: int) -> int:
        """The level's latency budget (see Budgets.budget_ns)."""
        return self.budgets.budget_ns(level)

    # --- the decision --------------------------------------------------------------------

    def sends_full(self, bucket: int = 0) -> bool:
        """For a full batch (as many samples of one shape queued as a batch holds): whether
        plan() would send it whole at once, answered without planning. It would unless
        something caps batches below the maximum: a level with a configured budget, or a
        size measured less efficient. Saturated, this is every batch, and a full plan for
        each would be the larger part of the loop's work per batch. Records the decision
        for metrics as plan() does."""
        limit = self.cost_for(bucket).efficient_limit(self._max_size)
        if self._watched or limit < self._max_size:
            return False
        self._target = self._limit = self._max_size
        self._window_ns = 0
        return True

    def sends_alone(
        self,
        queued: int,
        idle_slots: int,
        bucket: int = 0,
        arriving: int = 0,
        device_busy: bool = False,
        joinable: int = -1,
    ) -> bool:
        """For a request that found nothing queued and a slot idle: whether there is
        nothing to wait for (no costs measured yet, another slot idle while no other
        slot's execution holds the slot's device (`device_busy`), or no client outside
        to come back, or none of them of the request's key when `joinable` >= 0 says how
        many are), so that plan() would send it at once; `arriving` samples not yet
        recorded count as in the server. Answered without planning: at low load this is
        every request. Records the decision for metrics as plan() does."""
        arrivals = self.arrivals
        outside = int(arrivals.peak) - arrivals.in_system - arriving
        if 0 <= joinable < outside:
            outside = joinable
        if self.cost_for(bucket).known and (device_busy or not idle_slots) and outside > 0:
            return False
        self._target = queued
        self._window_ns = 0
        return True

    def plan_holds(self, level: int) -> bool:
        """Whether a plan for a batch headed by a `level` request stays the plan while
        more requests arrive, until its target is queued or its deadline passes: unless
        the level has a configured budget, whose cap on the batch shrinks as the head
        waits. Re-planning on every arrival costs the loop more than the fuller batches
        save on a small model."""
        return level not in self._watched

    def plan(
        self,
        now_ns: int,
        queued: int,
        oldest_ns: int,
        level: int,
        idle_slots: int,
        head_samples: int | None = None,
        idle_since_ns: int | None = None,
        *,
        bucket: int = 0,
        on_device: Sequence[Executing] = (),
        joinable: int = -1,
    ) -> Plan:
        """Plan the batch forming on an idle slot: `queued` samples are ready (the oldest
        enqueued at `oldest_ns`, the most urgent at `level`, `head_samples` of them at that
        level: all when None); `idle_slots` other slots idle; the slot has been idle since
        `idle_since_ns` (now when None); the batch is padded to shape bucket `bucket`;
        `on_device` are the other slots' batches executing on the slot's device, which
        runs one execution at a time (a batch sent now waits for them); `joinable`
        samples of the batch's key may still arrive (its clients outside; -1: unknown,
        any client outside may join).

        Only requests of the batch's key can join it, so with `joinable` known the
        clients waited for are those, never more than the arrival model counts, and
        their share of the busy-arrival rate. With none of them outside the batch goes
        at once, the device busy or not: waiting cannot grow it, and a batch handed over
        now waits on the device only behind the executions there, as it would have.
        """
        arrivals = self.arrivals
        arrivals.tick(now_ns)
        cost = self.cost_for(bucket)
        budgets = self.budgets
        budgets.use(cost)
        head = queued if head_samples is None else head_samples
        limit = budgets.size_cap(level, now_ns)
        if level in self._watched:
            limit = min(limit, budgets.head_cap(level, now_ns, oldest_ns, head))
        if cost.executions % EXPLORE_EVERY != EXPLORE_EVERY - 1:
            limit = cost.efficient_limit(limit)
        potential = int(arrivals.peak) - arrivals.in_system
        share = 1.0
        if 0 <= joinable < potential:
            share = joinable / potential
            potential = joinable
        form_by = self.form_by_ns(on_device) if on_device else 0
        if (
            queued >= limit
            or not cost.known
            or (not form_by and (idle_slots > 0 or potential <= 0))
        ):
            # Nothing to wait for: no costs measured yet, a full batch, or, with no other
            # slot's execution on the device, another slot idle or no client outside to
            # come back. (With the device busy, the batch waits for it: choose().)
            plan = Plan(min(queued, limit), now_ns, limit)
        elif potential <= 0 and joinable >= 0:
            # The device is busy and no client who could join is outside: waiting cannot
            # grow the batch, so it goes now, as much of it as runs cheapest per sample
            # (the rest goes next, right after it on the device: choice.best_part).
            part = best_part(min(queued, limit), cost.cost_ns)
            plan = Plan(part, now_ns, part)
        else:
            budget = budgets.planning_ns(level)
            late_by = -1
            if level not in self._watched:
                # A derived budget lets a late batch wait for throughput, for at most
                # the budget from when the slot went idle (docs, "Saturated").
                since = now_ns if idle_since_ns is None else idle_since_ns
                late_by = since + int(budget)
                if self._bound_ns:
                    late_by = min(late_by, oldest_ns + self._bound_ns)
            rate, outside = arrivals.estimates()
            estimates = Estimates(
                potential, rate * share, outside, budget, self._bound_ns, late_by,
                cost.cost_ns, form_by,
            )  # fmt: skip
            plan = choose(now_ns, queued, oldest_ns, limit, estimates)
        self._target = plan.target
        self._limit = plan.limit
        self._window_ns = max(plan.deadline_ns - oldest_ns, 0)
        return plan

    def form_by_ns(self, on_device: Sequence[Executing]) -> int:
        """When a batch that would wait for the executions `on_device` should form (see
        choice.form_by_ns), each priced by its bucket's cost model."""
        return form_by_ns(
            (run.launched_ns, self.cost_for(run.bucket).cost_ns(run.size)) for run in on_device
        )

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
            **(
                {"cost_us_by_bucket": {b: c.table_us() for b, c in sorted(self._costs.items())}}
                if len(self._costs) > 1
                else {}
            ),
        }


class AdaptiveDecider:
    """The adaptive controller behind the Decider interface (decision.py).

    Events are logged and replayed to the controller in order before it is asked
    anything, and otherwise once LOG_LIMIT are pending, in a later loop turn: one by one
    between requests, these updates touched the controller's state with the caches
    cold; replayed together, they run back to back. A plan holds while its target is not
    queued and its deadline has not passed (for a head whose level has no configured
    budget): an arrival then changes nothing, and the controller is not asked again."""

    immediate = True
    sees_device = True
    __slots__ = ("_events", "_held", "_replay_queued", "controller", "unseen")

    def __init__(self, controller: AdaptiveController) -> None:
        self.controller = controller
        # How many requests have run alone and unseen (Ran events).
        self.unseen = 0
        self._events: list[Event] = []
        self._replay_queued = False
        # The plan held for the batch headed by a request (that request, the plan).
        self._held: tuple[object, Plan] | None = None

    def observe(self, event: Event) -> None:
        if type(event) is Ran:
            unseen = self.unseen
            self.unseen = unseen + 1
            if unseen % ALONE_COST_EVERY:
                return
        events = self._events
        events.append(event)
        if len(events) >= LOG_LIMIT and not self._replay_queued:
            self._replay_queued = True
            asyncio.get_running_loop().call_soon(self.catch_up)

    def catch_up(self) -> None:
        """Replay what is logged to the controller, in order."""
        self._replay_queued = False
        events = self._events
        if events:
            self.controller.record(events)
            events.clear()

    def decide(self, view: BatchView, now_ns: int) -> Answer:
        controller = self.controller
        total = view.totals[-1]
        full = view.full
        if full and controller.sends_full(view.bucket):
            return Take(total)  # saturated: no plan to make, nothing to cap
        head = view.head
        on_device = view.on_device
        if head is None:
            # A request that found nothing queued and a slot idle, asked at once.
            self.catch_up()
            busy = bool(on_device)
            joinable = view.joinable
            if controller.sends_alone(
                total, view.idle_slots, view.bucket, view.unseen, busy, joinable
            ):
                return Take(total)
            if view.unseen:
                return WaitUntil(now_ns)  # not alone: tell me of it, then ask again
        held = self._held
        if held is not None and head is not None and held[0] is head:
            plan = held[1]
            if not full and not plan.due(total, now_ns):
                return WaitUntil(plan.deadline_ns, plan.target)
        # A new head, or the held plan's target reached or its deadline passed: plan
        # again (on reaching its target, with more queued than planned, the controller
        # may find a larger batch worth the rest of the wait).
        self.catch_up()
        plan = controller.plan(
            now_ns,
            total,
            view.oldest_ns,
            view.level,
            view.idle_slots,
            head_samples=view.head_samples,
            idle_since_ns=view.idle_since_ns,
            bucket=view.bucket,
            on_device=on_device,
            joinable=view.joinable,
        )
        # A plan that waits for the device is not held: the batcher asks again when an
        # execution on the device ends, and the answer then changes.
        holds = head is not None and controller.plan_holds(view.level) and not plan.for_device
        self._held = (head, plan) if holds else None
        if full or plan.due(total, now_ns):
            # The target is what to wait for; the limit caps what goes.
            return Take(plan.limit)
        return WaitUntil(plan.deadline_ns, plan.target if holds or plan.for_device else 0)
