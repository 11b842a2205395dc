"""The adaptive controller's decision, as a pure function of its estimates.

`choose()` gets what the estimators say (what each batch size costs, how soon requests
arrive, how many clients are outside, the head's budget) and answers with a `Plan`:
send what is queued now, or wait for a larger batch until a deadline. It reads no
clock and keeps no state, so every rule can be tested with numbers alone. The
controller (adaptive.py) gathers the estimates and records the answer for metrics.

The rules, and why they are what they are, are in docs/adaptive-batching.md ("The
decision", "Several slots on one device" and "Saturated").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import NamedTuple

# Waiting must buy at least this much per-sample throughput.
MIN_GAIN = 1.05
# A saturated slot waits for returning clients when that serves them all this much sooner.
LATE_GAIN = 1.01
# Among sizes worth waiting for, take the smallest within this fraction of the best.
NEAR_BEST = 0.97
# The window allows this many times the expected time to fill, plus a little loop slack.
FILL_MARGIN = 2.0
FILL_SLACK_NS = 50_000
# A batch that would wait for other slots' executions on its device is formed this share
# of the last one's expected time before that one's expected end (at least FILL_SLACK_NS):
# the hand-over to the slot and the copies in overlap its end, so an estimate a little
# short or long leaves the device no idle gap; forming early loses only the requests
# that arrive within that share.
DEVICE_LEAD = 0.1


class Plan(NamedTuple):
    """What the batcher should do now: send when `target` <= what is queued, or when
    `deadline_ns` passes; otherwise wait for more requests. A batch never holds more than
    `limit` samples. (A tuple: one is made per batch, and tuples are cheap to make.)
    `for_device`: the plan waits for the device (other slots' executions on it), not for
    arrivals: when one of those ends, the question is open again."""

    target: int
    deadline_ns: int
    limit: int
    for_device: bool = False

    def due(self, queued: int, now_ns: int) -> bool:
        """Whether `queued` samples go now: the target is reached or the deadline passed."""
        return queued >= self.target or now_ns >= self.deadline_ns


class Estimates(NamedTuple):
    """What the estimators say at decision time.

    `potential`: clients outside who may come back; `rate`: arrivals per ns while the
    server is busy; `outside_ns`: a client's mean time outside; `budget_ns`: the head's
    planning budget; `bound_ns`: the longest wait `max_queue_delay_microseconds` allows
    from the oldest request (0: none); `late_by_ns`: the latest a saturated batch may
    start under a derived budget (-1: it may not); `cost_ns`: a batch size's cost;
    `form_by_ns`: when the device is about to free from the other slots' executions on
    it (`form_by_ns()`; 0: none is in flight there)."""

    potential: int
    rate: float
    outside_ns: float
    budget_ns: float
    bound_ns: int
    late_by_ns: int
    cost_ns: Callable[[int], float]
    form_by_ns: int = 0


def form_by_ns(ahead: Iterable[tuple[int, float]]) -> int:
    """When a batch that would wait for `ahead` should form: `ahead` are the executions
    in flight on its device, as (handed over at, expected cost) in the order they were
    handed over. The device runs them one after another, each from when it was handed
    over or when the one before ends, whichever is later; the batch forms DEVICE_LEAD
    of the last one before their expected end. 0 when nothing is ahead."""
    free = 0.0
    last = -1.0
    for launched_ns, cost_ns in ahead:
        free = max(float(launched_ns), free) + cost_ns
        last = cost_ns
    if last < 0.0:
        return 0
    return int(free - max(DEVICE_LEAD * last, FILL_SLACK_NS))


def fill_ns(more: int, potential: int, rate: float, outside_ns: float) -> float:
    """Expected time until `more` requests arrive, with `potential` clients outside for
    `outside_ns` on average: the faster of the busy-arrival rate and the clients' return
    (evenly spread over twice their mean time outside)."""
    by_rate = more / rate if rate > 0.0 else math.inf
    if more > potential:
        return by_rate
    return min(by_rate, 2.0 * outside_ns * more / potential)


def best_part(n: int, cost_ns: Callable[[int], float]) -> int:
    """How many of `n` queued samples a batch formed as the device frees should take: all
    of them, unless fewer run clearly cheaper per sample (by MIN_GAIN), as where `n`
    pads up to a far larger gear than the one just below it. The rest go in the next
    batch, on the device right after. Without this, two slots keep whatever split of
    the clients their batches fell into, even one that pads both batches up a gear."""
    whole = n / cost_ns(n)
    best, best_tp = n, whole
    for m in range(n - 1, 0, -1):
        tp = m / cost_ns(m)
        if tp > best_tp:
            best, best_tp = m, tp
    return best if best_tp >= MIN_GAIN * whole else n


def choose(now_ns: int, n: int, oldest_ns: int, limit: int, est: Estimates) -> Plan:
    """Plan the batch of `n` queued samples (the oldest enqueued at `oldest_ns`), never
    more than `limit`: the smallest larger batch near the best per-sample throughput
    that fills in time, or, saturated, the quickest way to serve everyone; else now.
    The caller asks only when there is something to wait for: `n < limit`, and
    `est.potential > 0` or the device busy (`est.form_by_ns`).

    While other slots' executions hold the device (`est.form_by_ns`), a batch sent now
    would only wait for them, and what arrives meanwhile can join it at no cost: it
    forms when the device is about to free (never past `max_queue_delay_microseconds`),
    or as soon as it is full, or as soon as the `est.potential` clients outside have
    joined it. The other slot frees right after, so no wait past that point is planned:
    an idle slot means send now. What goes then is `best_part()`.
    """
    send_now = Plan(min(n, limit), now_ns, limit)
    form_by = est.form_by_ns
    if form_by:
        if est.bound_ns:
            form_by = min(form_by, oldest_ns + est.bound_ns)
        if now_ns < form_by:
            target = min(limit, n + est.potential) if est.potential > 0 else limit
            return Plan(target, form_by, limit, True)
        part = best_part(min(n, limit), est.cost_ns)
        return Plan(part, now_ns, part)
    potential, rate, outside, cost_ns = est.potential, est.rate, est.outside_ns, est.cost_ns
    end_ns = oldest_ns + int(est.budget_ns)
    bound_ns = oldest_ns + est.bound_ns if est.bound_ns else end_ns
    late_by = est.late_by_ns
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
