"""Latency budgets per priority level, and the caps on batch size that keep them.

A level's budget is how long its requests may spend in the server, queueing plus their
batch's execution: its own when configured, else the model's scaled by level (higher
priority, shorter budget), else a few unbatched executions. A configured budget is a
promise to that level, kept two ways: less urgent batches are capped so that an urgent
request arriving at any moment waits behind at most one of them (`size_cap`), and a batch
headed by the level takes less urgent requests along only while it still fits the head's
remaining budget (`head_cap`). Both plan with BUDGET_HEADROOM of the budget, leaving the
rest for the time outside the batcher. A derived budget never caps anything.

See docs/adaptive-batching.md for the design as a whole.
"""

from __future__ import annotations

from .arrivals import ArrivalModel
from .costmodel import CostModel
from .policy import BatchPolicy

# With no budget configured: this many unbatched executions (slot times), within the
# bounds below; before any execution is measured, the default. The room to wait about
# three executions: under load a small model needs a few executions' time for a batch
# worth sending to fill; with room for only two, batches fill to about half their target
# and run below a static window. Slot times rather than compute times, for the reason in
# CostModel: they are what a batch costs the slot.
DERIVED_BUDGET_EXECUTIONS = 4
DEFAULT_BUDGET_NS = 1_000_000
AUTO_BUDGET_MIN_NS = 200_000
AUTO_BUDGET_MAX_NS = 200_000_000
# The share of a configured budget that the caps and windows plan with; the rest is left
# for the time a request spends outside the batcher.
BUDGET_HEADROOM = 0.8
# A more urgent level with a configured budget caps less urgent batches while it has been
# seen within this horizon, or within this many of its mean gaps between requests: sparse
# urgent traffic keeps its promise, and a level gone quiet for good stops costing the
# others throughput.
URGENT_HORIZON_NS = 10_000_000_000
URGENT_GAPS = 4.0


def budgeted_levels(policy: BatchPolicy) -> frozenset[int]:
    """The levels with a configured budget: the ones whose promise caps batches."""
    adaptive = policy.adaptive
    assert adaptive is not None
    return frozenset(
        lv for lv in _listed(policy) if lv in adaptive.budgets_us or adaptive.base_budget_us > 0
    )


def _listed(policy: BatchPolicy) -> list[int]:
    """The levels the controller enumerates: the policy's listed ones, and every one with
    a budget of its own."""
    assert policy.adaptive is not None
    return sorted({*policy.listed_levels, *policy.adaptive.budgets_us})


class Budgets:
    """The latency budget of each level, and the batch caps they set, for one controller.
    `arrivals` says when the watched levels were last seen; `cost` prices the batches."""

    __slots__ = (  # see CostModel
        "_adaptive", "_arrivals", "_budgets", "_budgets_version", "_cost", "_levels",
        "_max_size", "_policy", "watched",
    )  # fmt: skip

    def __init__(self, policy: BatchPolicy, cost: CostModel, arrivals: ArrivalModel) -> None:
        assert policy.adaptive is not None
        self._policy = policy
        self._adaptive = policy.adaptive
        self._max_size = policy.max_size
        self._levels = _listed(policy)
        self._cost = cost
        self._arrivals = arrivals
        # The levels whose sightings `arrivals` keeps: those with a configured budget.
        self.watched = arrivals.watched
        # Planning budgets per level, until the costs change (see planning_ns).
        self._budgets: dict[int, float] = {}
        self._budgets_version = -1

    def use(self, cost: CostModel) -> None:
        """Price batches with `cost` from now on: the cost model of the bucket planned."""
        if cost is not self._cost:
            self._cost = cost
            self._budgets_version = -1

    def budget_ns(self, level: int) -> int:
        """The level's latency budget: its own, else the model's scaled by level (level 1
        of L gets 1/L of it), else one derived from the unbatched execution time."""
        configured = self._adaptive.budgets_us.get(level)
        if configured:
            return configured * 1000
        base = self._adaptive.base_budget_us * 1000
        if not base:
            if self._cost.known:
                base = int(DERIVED_BUDGET_EXECUTIONS * self._cost.cost_ns(1))
                base = min(max(base, AUTO_BUDGET_MIN_NS), AUTO_BUDGET_MAX_NS)
            else:
                base = DEFAULT_BUDGET_NS
        count = self._policy.priority_levels
        if count > 1 and level >= 1:
            return max(base * level // count, 1)
        return base

    def planning_ns(self, level: int) -> float:
        """What the controller plans with: a configured budget less the headroom left for
        the time outside the batcher; a derived one whole. Cached until the costs change
        (a derived budget follows the unbatched cost)."""
        if self._budgets_version != self._cost.version:
            self._budgets.clear()
            self._budgets_version = self._cost.version
        budget = self._budgets.get(level)
        if budget is None:
            budget = self._budgets[level] = self._computeplanning_ns(level)
        return budget

    def _computeplanning_ns(self, level: int) -> float:
        budget = self.budget_ns(level)
        return budget * BUDGET_HEADROOM if level in self.watched else float(budget)

    def urgent_active(self, level: int, now_ns: int) -> bool:
        """Whether `level` has a configured budget and has been seen recently (counting
        the controller's first request as a sighting of every level)."""
        if level not in self.watched:
            return False
        seen = self._arrivals.last_seen_ns(level)
        horizon = max(URGENT_HORIZON_NS, URGENT_GAPS * self._arrivals.mean_gap_ns(level))
        return now_ns - seen <= horizon

    def _largest_fitting(self, room_ns: float, cap: int) -> int:
        """The largest size up to `cap` whose execution takes at most `room_ns` (at least 1)."""
        while cap > 1 and self._cost.cost_ns(cap) > room_ns:
            cap -= 1
        return cap

    def size_cap(self, level: int, now_ns: int) -> int:
        """The largest batch a `level` batch may form while a more urgent level with a
        configured budget is active: one whose execution, followed by an urgent request's
        own, fits that budget (less the headroom). 1 until executions are measured."""
        cap = self._max_size
        if len(self._levels) < 2 or level == 0:
            return cap
        for other in self._levels:
            if other >= level:
                break
            if not self.urgent_active(other, now_ns):
                continue
            if not self._cost.known:
                return 1
            room = self.planning_ns(other) - self._cost.cost_ns(1)
            cap = self._largest_fitting(room, cap)
        return cap

    def head_cap(self, level: int, now_ns: int, oldest_ns: int, head_samples: int) -> int:
        """The largest batch one headed by a `level` request may form: less urgent requests
        ride along only while the batch's execution fits the head's remaining budget; the
        `head_samples` of the head's own level always may go together."""
        if level not in self.watched or not self._cost.known:
            return self._max_size
        room = self.planning_ns(level) - (now_ns - oldest_ns)
        return max(self._largest_fitting(room, self._max_size), min(head_samples, self._max_size))

    def table_us(self) -> dict[int, int]:
        """Every level's budget, µs."""
        return {level: self.budget_ns(level) // 1000 for level in self._levels}
