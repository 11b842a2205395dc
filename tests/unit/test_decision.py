"""The decision behind the batcher, without a loop: Triton's rules and the pure choose()."""

from __future__ import annotations

from fake_executor import make_config

from ge_serve.scheduler.choice import Estimates, Plan, best_part, choose
from ge_serve.scheduler.decision import BatchView, Take, TritonRules, WaitUntil, preferred_prefix
from ge_serve.scheduler.policy import BatchPolicy

MS = 1_000_000
NOW = 1_000 * MS


def view(*sizes: int, oldest_ns: int = NOW, full: bool = False) -> BatchView:
    totals, total = [], 0
    for size in sizes:
        total += size
        totals.append(total)
    return BatchView(
        totals=totals,
        oldest_ns=oldest_ns,
        level=0,
        head_samples=total,
        idle_slots=0,
        idle_since_ns=NOW,
        full=full,
    )


def rules(**kwargs: object) -> TritonRules:
    return TritonRules(BatchPolicy.from_config(make_config(**kwargs)))  # type: ignore[arg-type]


def test_without_a_window_whatever_is_queued_goes() -> None:
    assert rules().decide(view(1, 1, 1), NOW) == Take(3)


def test_a_preferred_size_goes_at_once_and_the_rest_waits_for_the_window() -> None:
    r = rules(preferred=[2, 4], delay_us=1000)
    assert r.decide(view(1, 1, 1), NOW) == Take(2)  # 2 is preferred; 3 is not
    assert r.decide(view(1), NOW) == WaitUntil(NOW + 1000 * 1000)
    assert r.decide(view(1), NOW + MS) == Take(1)  # the window passed
    # Past the largest preferred size without reaching one: what fits before it.
    assert r.decide(view(3, 3), NOW) == Take(3)


def test_the_maximum_goes_at_once_whatever_the_window() -> None:
    r = rules(max_batch_size=4, delay_us=60_000_000)
    assert r.decide(view(2, 2, full=True), NOW) == Take(4)


def test_preferred_prefix_picks_the_largest_preferred_total() -> None:
    assert preferred_prefix([1, 2, 3, 4, 5], frozenset({2, 4}), 4) == 4
    assert preferred_prefix([3, 6], frozenset({4}), 4) == 3
    assert preferred_prefix([5], frozenset({4}), 4) == 0
    assert preferred_prefix([1, 2], frozenset(), 8) == 0


def estimates(potential: int, rate_per_ms: float, cost: float = 0.1) -> Estimates:
    """1 ms fixed cost plus `cost` ms per sample; a 5 ms budget."""
    return Estimates(
        potential=potential,
        rate=rate_per_ms / MS,
        outside_ns=float("inf"),
        budget_ns=5 * MS,
        bound_ns=0,
        late_by_ns=-1,
        cost_ns=lambda m: MS + m * cost * MS,
    )


def test_choose_waits_only_for_a_batch_that_fills_in_time_and_pays() -> None:
    plan = choose(NOW, 1, NOW, 8, estimates(potential=16, rate_per_ms=20))
    assert plan.target > 1 and NOW < plan.deadline_ns <= NOW + 5 * MS
    # Arrivals too slow to fill anything within the budget: send now.
    assert choose(NOW, 1, NOW, 8, estimates(potential=16, rate_per_ms=0.01)) == Plan(1, NOW, 8)
    # Linear cost: batching buys nothing.
    linear = estimates(potential=16, rate_per_ms=20)._replace(cost_ns=lambda m: m * MS)
    assert choose(NOW, 1, NOW, 8, linear).deadline_ns == NOW


def test_choose_holds_a_batch_until_the_device_is_about_to_free() -> None:
    # Other slots' executions hold the device until NOW + 10 ms: the batch forms then,
    # or as soon as it is full, even where waiting for arrivals would not pay.
    linear = estimates(potential=16, rate_per_ms=0.01)._replace(cost_ns=lambda m: m * MS)
    busy = linear._replace(form_by_ns=NOW + 10 * MS)
    assert choose(NOW, 1, NOW, 8, busy) == Plan(8, NOW + 10 * MS, 8, for_device=True)
    # Once that moment has come (or passed), what is queued goes.
    assert choose(NOW + 10 * MS, 3, NOW, 8, busy) == Plan(3, NOW + 10 * MS, 3)
    # Never past max_queue_delay_microseconds.
    bounded = busy._replace(bound_ns=4 * MS)
    assert choose(NOW, 1, NOW - MS, 8, bounded) == Plan(8, NOW + 3 * MS, 8, for_device=True)
    # The device free: the rules as before.
    assert choose(NOW, 1, NOW, 8, linear) == Plan(1, NOW, 8)


def test_triton_rules_do_not_look_at_the_device() -> None:
    assert rules().sees_device is False


def gears_16_32(m: int) -> float:
    """The simulated NPU's default profile on batch gears 16 and 32."""
    return (4.6 + 0.6 * (16 if m <= 16 else 32)) * MS


def test_as_the_device_frees_a_batch_does_not_pad_up_a_gear_it_barely_uses() -> None:
    # 20 queued would run as 32; 16 run far cheaper per sample, and the other 4 go next.
    assert best_part(20, gears_16_32) == 16
    # 30 of 32 use the larger gear well; on a line every sample goes.
    assert best_part(30, gears_16_32) == 30
    assert best_part(5, lambda m: MS + m * MS / 10) == 5
    busy = estimates(potential=16, rate_per_ms=20)._replace(
        cost_ns=gears_16_32, form_by_ns=NOW - MS
    )
    assert choose(NOW, 20, NOW - 5 * MS, 32, busy) == Plan(16, NOW, 16)
