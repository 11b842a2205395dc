"""The adaptive batch controller: picks each batch's window and target size from measurements.

It runs on the event loop and is told about every arrival, departure and execution. When a
slot is idle and a batch is forming, `plan()` answers two questions: how large should this
batch get, and how long may it wait for that.

The model behind the answer:

* **Execution cost per batch size**, from measured executions, each priced by its slot
  time (from the hand-over to the slot until the results are back on the loop: on a busy
  host the slot thread's wake-up costs more than a small model's compute, and only fewer
  batches save it): an EWMA per (padded) size (a size's first execution is a warm-up,
  replaced by its second; a stall, over STALL_CAP times the estimate, is left out unless
  STALL_RUN come in a row), and a least-squares line `cost(b) = a + b*k` through them
  (through the sizes run more than once, when two have), which smooths noise and covers
  sizes not seen yet. A batch
  of `m` pays off over sending `n` now only when `m / cost(m)` beats `n / cost(n)` by a
  margin; on hardware where cost grows linearly with size, batching buys nothing and the
  controller never waits.
* **Arrivals that waiting can catch.** The rate that matters is the rate at which requests
  arrive *while others are in the system*, not the overall rate: with one closed-loop
  client, the next request never arrives while the current one waits, however high the
  overall rate is. So the controller counts only arrivals that find the system busy, over
  the time it is busy (exponentially decayed). It also caps what it waits for at the
  recent peak number of requests in the system minus those in it now: it never waits for
  more requests than there are clients to send them.
* **Clients that come back.** Under closed-loop load (each client sends its next request
  when the last one is answered) arrivals are not spread over time: a batch of k leaving
  means about k requests within one client turnaround, which an averaged rate cannot see.
  The controller also treats the clients it has seen and that are not in the system now
  (the peak minus those in it) as coming back spread evenly over twice the mean time
  clients spend outside (Little's law on the outside: the time-integral of "outside" over
  the arrivals that came back from it). The faster of the two estimates says how long a
  batch takes to fill. With phantom clients (the peak remembers more than there are) the
  mean time outside grows with them, and the estimate falls back to about the plain rate;
  the peak itself forgets a fifth per batch that leaves.
* **A latency budget per priority level**: how long a request may spend in the server,
  queueing plus its batch's execution. A batch waits only while its oldest request can
  still wait for the target size and then execute within its level's budget (and never
  past `max_queue_delay_microseconds`, when the config sets one). Higher priority gets a
  shorter budget.
* **A configured budget is a promise to that level**, kept two ways. (1) Batches of less
  urgent levels are capped at the largest size whose execution, followed by one urgent
  request's own, fits the urgent budget: an urgent request arriving at any moment waits
  behind at most one such batch. (2) A batch headed by a request of a level with a
  configured budget takes less urgent requests along only up to the size whose execution
  still fits the head's remaining budget (requests of the head's own level always go
  together: splitting them would only make the last of them later). Both plan with
  BUDGET_HEADROOM of the budget, leaving the rest for what happens outside the batcher
  (transport, decoding, the event loop), since clients measure the whole.
* **A derived budget yields to throughput when the server is saturated.** Once the oldest
  request is already past its level's derived budget, batch formation is pure throughput:
  under a closed loop, latency is the clients over throughput. A batch may then still wait
  for returning clients, for at most the budget from when its slot went idle, and only when
  that serves the queued and the returning clients sooner (by LATE_GAIN) than sending what
  is queued now and the returning ones as a second batch: waiting costs the wait, sending
  now costs a second batch's fixed part. This ends the stable splits a saturated single
  slot settles into (1 then 31, 15 then 17 on a CNN at 32 clients), which pay every batch's
  fixed cost twice per round of clients, run the small batch slower per sample, and
  answer one half while the other computes.
  That comparison counts a small batch sent now as hidden in the wait for the returning
  clients. On a device that shares the host's cores (onnxruntime, the simulated NPU) it is
  not: the small batch runs slower and the answers go out slower (1 then 31 on the CNN ran
  81-82 infer/s, batches of 32 ran 83.5-84.4). So a late batch also waits, within the same
  bound, when what is queued would run far less efficiently per sample (by MIN_GAIN) than
  a batch the returning clients fill in time: for the smallest one near the best.
  A configured budget is a promise and is never stretched this way.
  The cap on less urgent levels holds from the controller's first request on (as if the
  urgent level had just been seen), and for as long as the urgent level has been seen
  within URGENT_HORIZON_NS, or within URGENT_GAPS of its own mean gap between requests when
  that is longer: sparse urgent traffic keeps its promise, and an urgent level that has
  gone quiet for good stops costing the others throughput. The price is paid by the less
  urgent levels: smaller batches (on a CNN on CPU nearly free from batch 4 up; batch 1
  loses about 13 %). Derived budgets (none configured) never cap anything.

At low load this reduces to "send now" (no busy arrivals, no one else to wait for); at
high load the slots stay busy, requests pile up while they run, and batches grow to the
maximum on their own (or to the size with the best measured per-sample throughput, when
bigger ones measurably lose; one batch in EXPLORE_EVERY keeps measuring them); in
between, the controller waits only as long as arrivals are expected to fill a batch that is
worth it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from ge_serve.backends.base import gear_for

from .policy import BatchPolicy

# Time constant of the rate estimators.
RATE_TAU_NS = 500_000_000
# The peak (how many clients there are) decays by this factor per departure, not per unit
# of time: it must outlive a long batch with every client inside (a 32-batch of a CNN on
# 2 cores runs ~0.4 s; a 1 s time constant forgot a third of the clients per cycle), and
# must forget clients that are gone within a few requests (from 32 to 1 in ~15).
PEAK_DECAY = 0.8
# The estimators decay in steps of at least this long, not on every event: a step closes
# the time integrals and takes an exp, which at one client (a request every ~0.4 ms on
# `simple` over HTTP) cost a few microseconds per request with the caches cold. The error
# is at most DECAY_STEP_NS / RATE_TAU_NS (2 %), far below the estimates' own noise.
DECAY_STEP_NS = 10_000_000
# Weight of a new execution in its size's cost EWMA.
COST_ALPHA = 0.2
# An execution over this many times its size's estimate is a stall, left out of the
# estimate unless it is the STALL_RUN-th such in a row; then it counts as this many times
# the estimate (see CostModel.record).
STALL_CAP = 2.0
STALL_RUN = 3
# Waiting must buy at least this much per-sample throughput.
MIN_GAIN = 1.05
# A saturated slot waits for returning clients when that serves them all this much sooner.
LATE_GAIN = 1.01
# Among sizes worth waiting for, take the smallest within this fraction of the best.
NEAR_BEST = 0.97
# The window allows this many times the expected time to fill, plus a little loop slack.
FILL_MARGIN = 2.0
FILL_SLACK_NS = 50_000
# A size is trusted for the efficiency limit after this many executions.
MIN_RUNS = 3
# The line and the efficiency limit are refitted when a size is first seen or first
# trusted, and otherwise once per this many executions (the EWMAs move slowly; a refit
# timed in the server at ~20 us, so every 8 executions cost ~2.5 us per execution).
REFIT_EVERY = 32
# Larger batches are cut back to the most efficient size when they lose this much per sample.
EFFICIENCY_LOSS = 0.95
# One batch in this many ignores the efficiency limit, so that large sizes stay measured.
EXPLORE_EVERY = 16
# With no budget configured: this many unbatched executions (slot times), within the
# bounds below; before any execution is measured, the default. Room to wait about three
# executions: on `simple` over gRPC at 32 clients (a slot time of ~1.1 ms, ~2000 requests/s
# reaching the batcher), filling a batch of 8 takes ~3.5 ms; a budget of two executions
# let batches fill to ~4 (0.78x a static 3 ms window), four fills them to 7-7.5 (1.03x);
# at 8 clients, slot times and four ran 1.28x (HTTP) / 1.16x (gRPC) the throughput of
# compute times and two, at a lower p50.
DERIVED_BUDGET_EXECUTIONS = 4
DEFAULT_BUDGET_NS = 1_000_000
AUTO_BUDGET_MIN_NS = 200_000
AUTO_BUDGET_MAX_NS = 200_000_000
# The share of a configured budget that the caps and windows plan with; the rest is left
# for the time a request spends outside the batcher.
BUDGET_HEADROOM = 0.8
# A more urgent level with a configured budget caps less urgent batches while it has been
# seen within this horizon, or within this many of its mean gaps between requests.
URGENT_HORIZON_NS = 10_000_000_000
URGENT_GAPS = 4.0
# Weight of a new gap in a level's mean gap between requests.
GAP_ALPHA = 0.2


# What the batcher logs for the controller, to be replayed in order by `record()`: an
# arrival (when, samples, priority level), a batch leaving (when, samples leaving, batch
# size, execution ns), or the execution of a request that ran alone and unseen (batch
# size, execution ns; see DynamicBatcher._run_alone).
Arrival = tuple[int, int, int]
Departure = tuple[int, int, int, int]
Execution = tuple[int, int]
Event = Arrival | Departure | Execution


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


class CostModel:
    """Execution time per batch size: measured EWMAs and a line through them."""

    # Slots: the controller runs a few times per request, mostly with the caches cold
    # (between two requests the transport and the model run); an instance without a
    # __dict__ touches less memory per attribute.
    __slots__ = (
        "_costs", "_ewma", "_fit", "_gears", "_good", "_runs", "_stalls", "executions", "known",
        "version",
    )  # fmt: skip

    def __init__(self, gears: Sequence[int]) -> None:
        self._gears = tuple(gears)
        self._ewma: dict[int, float] = {}
        self._runs: dict[int, int] = {}
        # Executions in a row over STALL_CAP times their size's estimate, per size.
        self._stalls: dict[int, int] = {}
        self._fit: tuple[float, float] | None = None
        # efficient_limit's answer (None: no limit), recomputed per execution, not per plan.
        self._good: int | None = None
        # cost_ns answers until the model changes; `version` counts the changes.
        self._costs: dict[int, float] = {}
        self.version = 0
        self.executions = 0
        # Whether any execution has been measured.
        self.known = False

    def record(self, size: int, duration_ns: int) -> None:
        if self._gears:
            size = gear_for(size, self._gears)
        runs = self._runs.get(size, 0) + 1
        if runs == 1:
            value = float(duration_ns)
        elif runs == 2:
            # A size's first execution is a warm-up (the backend plans the new shape, the
            # merge buffer's pages fault in): its second replaces it, unless the second
            # stalled (see below) and ran even longer.
            value = min(self._ewma[size], float(duration_ns))
        else:
            # A measured slot time includes the slot thread's waits for a core and for the
            # GIL: on a busy host, now and then, many times the usual (a batch of 8 of
            # `simple` computed in 0.1 ms, with stalls of 0.4-1.4 ms). Counted, two in a
            # row moved a plain EWMA so far that batches of 8 looked worse per sample than
            # batches of 1, and the efficiency limit cut batches to 1. Counted even at
            # STALL_CAP times the estimate, stalls still tilt the sizes: a pause hits an
            # execution about in proportion to its length, so long batches take more of
            # them, and each then adds a whole estimate. The CNN on two slots at 32
            # clients, time-shared (bench/timeshare.py freezes it inside about one batch
            # in eight), ran adaptive's batches at a mean of 1.8 and 5.4 in two runs, and
            # 11.3 once stalls were left out. So an execution over STALL_CAP times its
            # estimate is a stall and is left out, unless the STALL_RUN - 1 before it (of
            # its size) were too: a real rise in cost lasts, and is followed from then on
            # by up to COST_ALPHA * (STALL_CAP - 1) per execution.
            old = value = self._ewma[size]
            if duration_ns <= STALL_CAP * old:
                self._stalls.pop(size, None)
                value = old + COST_ALPHA * (duration_ns - old)
            else:
                stalls = self._stalls[size] = self._stalls.get(size, 0) + 1
                if stalls >= STALL_RUN:
                    value = old + COST_ALPHA * (STALL_CAP - 1) * old
        self._ewma[size] = value
        self._runs[size] = runs
        self.executions += 1
        self.known = True
        if runs in (1, 2, MIN_RUNS) or self.executions % REFIT_EVERY == 0:
            self._fit = self._line()
            self._good = self._efficient_size()
            self._changed()
        elif self._fit is None:
            self._changed()  # cost_ns reads the EWMAs themselves until there is a line

    def _changed(self) -> None:
        self._costs.clear()
        self.version += 1

    def efficient_limit(self, max_size: int) -> int:
        """The largest size worth running: past the size with the best measured per-sample
        throughput, a size some measurement shows losing more than 5 % against it is not.
        A line cannot say this (it makes bigger always better); on CPUs past the cache
        sweet spot, bigger batches do get slower per sample."""
        good = self._good
        return max_size if good is None else min(max_size, good)

    def _efficient_size(self) -> int | None:
        trusted = {s: s / ns for s, ns in self._ewma.items() if self._runs[s] >= MIN_RUNS}
        if len(trusted) < 2:
            return None
        best = max(trusted.values())
        good = max(s for s, tp in trusted.items() if tp >= EFFICIENCY_LOSS * best)
        if not any(s > good for s in trusted):
            return None
        return good

    def cost_ns(self, size: int) -> float:
        """Expected execution time of a batch of `size` (after padding to a gear)."""
        cost = self._costs.get(size)
        if cost is None:
            cost = self._costs[size] = self._estimate_ns(size)
        return cost

    def _estimate_ns(self, size: int) -> float:
        size = gear_for(size, self._gears)
        if self._fit is not None:
            intercept, slope = self._fit
            return max(intercept + slope * size, 1.0)
        measured = self._ewma.get(size)
        if measured is not None:
            return measured
        if not self._ewma:
            return 1.0
        # One size seen: assume half of its cost is fixed, until a second size says more.
        seen, cost = next(iter(self._ewma.items()))
        return cost * (0.5 + 0.5 * size / seen)

    def table_us(self) -> dict[int, float]:
        return {size: round(ns / 1000, 1) for size, ns in sorted(self._ewma.items())}

    def _line(self) -> tuple[float, float] | None:
        """Least squares through the sizes' EWMAs; through only the sizes run more than
        once, when there are two: a size run once holds a warm-up, which on a CNN on CPU
        ran 10-25 % slow and, at the largest size, tilted the whole line."""
        xs = [size for size, runs in self._runs.items() if runs > 1]
        if len(xs) < 2:
            xs = list(self._ewma)
        if len(xs) < 2:
            return None
        ys = [self._ewma[x] for x in xs]
        mean_x = sum(xs) / len(xs)
        mean_y = sum(ys) / len(ys)
        var = sum((x - mean_x) ** 2 for x in xs)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
        slope = max(slope, 0.0)
        intercept = max(mean_y - slope * mean_x, 0.0)
        return intercept, slope


class Presence:
    """The samples in the system and their decayed peak (how many clients there are),
    kept float for float as the controller's replay keeps them (`_in_system`, `_peak`),
    but updated by the batcher as each arrival and departure happens, and whether any
    execution has been measured.

    With it the batcher answers "is there anything to wait for?" for a request that finds
    nothing queued and a slot idle without replaying the controller's log first: at one
    client, replaying every request's departure and arrival before it could start cost
    the loop ~13 us per request (timed in-process, caches cold), on a path of ~390 us
    (`simple` over HTTP). The log is replayed later, behind the answers."""

    __slots__ = ("held", "measured", "peak")

    def __init__(self) -> None:
        self.held = 0
        self.peak = 0.0
        self.measured = False

    def arrive(self, size: int) -> None:
        held = self.held + size
        self.held = held
        if held > self.peak:
            self.peak = float(held)

    def leave(self, size: int, measured: bool) -> None:
        """`size` samples left; `measured`: their execution is logged for the cost model."""
        held = self.held
        self.peak = max(self.peak * PEAK_DECAY, float(held))
        self.held = held - min(size, held)
        if measured:
            self.measured = True

    def nothing_to_wait_for(self, idle_slots: int, arriving: int = 0) -> bool:
        """The controller's answer: no costs measured yet, another slot idle, or no
        client outside to come back (see AdaptiveController._nothing_to_wait_for); with
        `arriving` samples counted in the system as well (a request not yet counted)."""
        return not self.measured or idle_slots > 0 or int(self.peak) <= self.held + arriving


class AdaptiveController:
    """Chooses batch windows and target sizes for one model's batcher. Loop-only."""

    __slots__ = (  # see CostModel
        "_adaptive", "_bound_ns", "_budgets", "_budgets_version", "_busy_arrivals",
        "_busy_ns", "_busy_since_ns", "_decayed_ns", "_gap_ns", "_idle_arrivals",
        "_in_system", "_last_ns", "_levels", "_limit", "_max_size", "_occupancy",
        "_outside_ns", "_peak", "_peak_area", "_peak_ns", "_policy", "_returns",
        "_seen_ns", "_start_ns", "_target", "_watched", "_window_ns", "cost",
    )  # fmt: skip

    def __init__(self, policy: BatchPolicy, gears: Sequence[int] = ()) -> None:
        assert policy.adaptive is not None
        self._policy = policy
        self._adaptive = policy.adaptive
        self._max_size = policy.max_size
        self._bound_ns = policy.max_queue_delay_us * 1000
        self._levels = sorted(policy.levels)
        self.cost = CostModel(gears)
        # The estimators, decayed in steps (see _decay). Each arrival and departure only
        # adds to sums; the time integrals are closed at plan time (see _integrals):
        #   in the system:  ∫ in_system dt = _occupancy + in_system * now
        #   the peak:       ∫ peak dt      = _peak_area + peak * (now - _peak_ns)
        #   busy:           ∫ [in_system > 0] dt = _busy_ns + (now - _busy_since_ns if busy)
        # and the time clients spend outside is the peak's integral less the system's.
        self._last_ns = 0
        self._decayed_ns = 0
        self._start_ns = 0
        self._in_system = 0
        self._busy_arrivals = 0.0
        self._idle_arrivals = 0.0  # arrivals that found the system empty
        self._returns = 0.0
        self._peak = 0.0
        self._occupancy = 0
        self._peak_area = 0.0
        self._peak_ns = 0
        self._busy_ns = 0.0
        self._busy_since_ns = 0
        self._outside_ns = 0.0  # decayed, up to _decayed_ns
        self._seen_ns: dict[int, int] = {}
        self._gap_ns: dict[int, float] = {}
        # Only levels with a configured budget need their sightings (urgent_active).
        self._watched = frozenset(lv for lv in self._levels if self._budget_configured(lv))
        self._target = 1
        self._limit = self._max_size
        self._window_ns = 0
        self._budgets: dict[int, float] = {}
        self._budgets_version = -1

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
                index = self._arrivals(events, index)
                continue
            if len(event) == 2:
                self.cost.record(*event)
                index += 1
                continue
            now_ns, leaving, size, duration_ns = event
            self.record_departure(now_ns, leaving)
            self.cost.record(size, duration_ns)
            index += 1

    def _arrivals(self, events: Sequence[Event], start: int) -> int:
        """record_arrival for each arrival in the run from `start`, with the state it
        updates held in locals; returns where the run ends. Exactly record_arrival's
        arithmetic, in the same order (a test compares the two bit for bit)."""
        watched = self._watched
        step_at = self._decayed_ns + DECAY_STEP_NS
        last = self._last_ns
        held = self._in_system
        busy, idle, returns = self._busy_arrivals, self._idle_arrivals, self._returns
        occupancy = self._occupancy
        peak, peak_area, peak_ns = self._peak, self._peak_area, self._peak_ns
        index, count = start, len(events)
        while index < count:
            event = events[index]
            if len(event) != 3:
                break
            now_ns, size, level = event
            if now_ns >= step_at:
                # A decay step is due (or this is the first event): the plain call.
                self._last_ns, self._in_system, self._occupancy = last, held, occupancy
                self._busy_arrivals, self._idle_arrivals, self._returns = busy, idle, returns
                self._peak, self._peak_area, self._peak_ns = peak, peak_area, peak_ns
                self.record_arrival(now_ns, size, level)
                step_at = self._decayed_ns + DECAY_STEP_NS
                last = self._last_ns
                held = self._in_system
                busy, idle, returns = self._busy_arrivals, self._idle_arrivals, self._returns
                occupancy = self._occupancy
                peak, peak_area, peak_ns = self._peak, self._peak_area, self._peak_ns
                index += 1
                continue
            if now_ns > last:
                last = now_ns
            else:
                now_ns = last
            if held:
                busy += size
            else:
                idle += size
                self._busy_since_ns = now_ns
            occupancy -= size * now_ns
            held += size
            if held > peak:
                peak_area += peak * (now_ns - peak_ns)
                peak_ns = now_ns
                peak = float(held)
            else:
                returns += size
            if level in watched:
                self._seen(now_ns, level)
            index += 1
        self._last_ns, self._in_system, self._occupancy = last, held, occupancy
        self._busy_arrivals, self._idle_arrivals, self._returns = busy, idle, returns
        self._peak, self._peak_area, self._peak_ns = peak, peak_area, peak_ns
        return index

    def record_arrival(self, now_ns: int, size: int, level: int) -> None:
        # Per request: keep it to additions (the integrals are closed at plan time).
        now_ns = self._tick(now_ns)
        held = self._in_system
        if held:
            self._busy_arrivals += size
        else:
            self._idle_arrivals += size
            self._busy_since_ns = now_ns
        self._occupancy -= size * now_ns
        held += size
        self._in_system = held
        if held > self._peak:
            self._set_peak(now_ns, float(held))  # a client not seen before
        else:
            self._returns += size  # one of the clients the peak counts, back from outside
        if level in self._watched:
            self._seen(now_ns, level)

    def _seen(self, now_ns: int, level: int) -> None:
        last = self._seen_ns.get(level)
        if last is not None and now_ns > last:
            gap = self._gap_ns.get(level)
            self._gap_ns[level] = (
                now_ns - last if gap is None else gap + GAP_ALPHA * (now_ns - last - gap)
            )
        self._seen_ns[level] = now_ns

    def record_departure(self, now_ns: int, size: int) -> None:
        """`size` samples left (a whole batch leaves in one call)."""
        now_ns = self._tick(now_ns)
        held = self._in_system
        self._set_peak(now_ns, max(self._peak * PEAK_DECAY, float(held)))
        size = min(size, held)
        self._occupancy += size * now_ns
        held -= size
        self._in_system = held
        if not held and size:
            self._busy_ns += now_ns - self._busy_since_ns

    def record_execution(self, size: int, duration_ns: int) -> None:
        self.cost.record(size, duration_ns)

    def _tick(self, now_ns: int) -> int:
        """Decay the estimators when a step is due, and return the time to account an
        event at: `now_ns`, or the latest event's time should `now_ns` be earlier."""
        if now_ns - self._decayed_ns >= DECAY_STEP_NS:
            self._decay(now_ns)
        if now_ns > self._last_ns:
            self._last_ns = now_ns
            return now_ns
        return self._last_ns

    def _set_peak(self, now_ns: int, peak: float) -> None:
        self._peak_area += self._peak * (now_ns - self._peak_ns)
        self._peak_ns = now_ns
        self._peak = peak

    def _integrals(self, now_ns: int) -> tuple[float, float]:
        """(time busy, client-time outside) up to `now_ns`, decayed."""
        busy = self._busy_ns
        if self._in_system:
            busy += now_ns - self._busy_since_ns
        peak_area = self._peak_area + self._peak * (now_ns - self._peak_ns)
        occupancy = self._occupancy + self._in_system * now_ns
        return busy, self._outside_ns + max(peak_area - occupancy, 0.0)

    def _decay(self, now_ns: int) -> None:
        """Close the integrals at `now_ns` and decay every estimator by the time since the
        last step (steps are at least DECAY_STEP_NS apart, so that not every event pays
        for an exp; the error is at most DECAY_STEP_NS / RATE_TAU_NS, 2 %)."""
        if self._decayed_ns == 0:
            self._decayed_ns = self._start_ns = self._last_ns = now_ns
            self._peak_ns = self._busy_since_ns = now_ns
            return
        now_ns = max(now_ns, self._last_ns)
        busy, outside = self._integrals(now_ns)
        decay = math.exp(-(now_ns - self._decayed_ns) / RATE_TAU_NS)
        self._decayed_ns = self._last_ns = now_ns
        self._busy_ns = busy * decay
        self._busy_since_ns = now_ns
        self._outside_ns = outside * decay
        self._peak_area = 0.0
        self._peak_ns = now_ns
        self._occupancy = -self._in_system * now_ns
        self._busy_arrivals *= decay
        self._idle_arrivals *= decay
        self._returns *= decay

    # --- estimates -----------------------------------------------------------------------

    def busy_rate_per_ns(self) -> float:
        """Arrivals per ns while the system holds other requests (up to the latest event)."""
        return self._estimates()[0]

    def time_outside_ns(self) -> float:
        """The mean time a client spends outside the system between two requests (its
        turnaround: transport, the client's own work): the time-integral of the clients
        outside (the peak less those in the system) over the arrivals that came back from
        outside (arrivals that raise the peak are clients not seen before). Infinite
        before any came back."""
        return self._estimates()[1]

    def _estimates(self) -> tuple[float, float]:
        """(busy_rate_per_ns, time_outside_ns), from one closing of the integrals."""
        busy, outside = self._integrals(self._last_ns)
        rate = self._busy_arrivals / busy if busy > 0 else 0.0
        turnaround = outside / self._returns if self._returns > 0 else math.inf
        return rate, turnaround

    @staticmethod
    def _fill_ns(more: int, potential: int, rate: float, outside_ns: float) -> float:
        """Expected time until `more` requests arrive, with `potential` clients outside
        for `outside_ns` on average: the faster of the busy-arrival rate and the clients'
        return (evenly spread over twice their mean time outside)."""
        by_rate = more / rate if rate > 0.0 else math.inf
        if more > potential:
            return by_rate
        return min(by_rate, 2.0 * outside_ns * more / potential)

    def budget_ns(self, level: int) -> int:
        """The level's latency budget: its own, else the model's scaled by level (level 1
        of L gets 1/L of it), else one derived from the unbatched execution time."""
        configured = self._adaptive.budgets_us.get(level)
        if configured:
            return configured * 1000
        base = self._adaptive.base_budget_us * 1000
        if not base:
            if self.cost.known:
                base = int(DERIVED_BUDGET_EXECUTIONS * self.cost.cost_ns(1))
                base = min(max(base, AUTO_BUDGET_MIN_NS), AUTO_BUDGET_MAX_NS)
            else:
                base = DEFAULT_BUDGET_NS
        count = self._policy.priority_levels
        if count > 1 and level >= 1:
            return max(base * level // count, 1)
        return base

    def _budget_configured(self, level: int) -> bool:
        return level in self._adaptive.budgets_us or self._adaptive.base_budget_us > 0

    def _planning_budget_ns(self, level: int) -> float:
        """What the controller plans with: a configured budget less the headroom left for
        the time outside the batcher; a derived one whole. Cached until the costs change
        (a derived budget follows the unbatched cost)."""
        if self._budgets_version != self.cost.version:
            self._budgets.clear()
            self._budgets_version = self.cost.version
        budget = self._budgets.get(level)
        if budget is None:
            budget = self._budgets[level] = self._compute_planning_budget_ns(level)
        return budget

    def _compute_planning_budget_ns(self, level: int) -> float:
        budget = self.budget_ns(level)
        return budget * BUDGET_HEADROOM if level in self._watched else float(budget)

    def urgent_active(self, level: int, now_ns: int) -> bool:
        """Whether `level` has a configured budget and has been seen recently (counting
        the controller's first request as a sighting of every level)."""
        if level not in self._watched:
            return False
        seen = self._seen_ns.get(level, self._start_ns)
        horizon = max(URGENT_HORIZON_NS, URGENT_GAPS * self._gap_ns.get(level, 0.0))
        return now_ns - seen <= horizon

    def _largest_fitting(self, room_ns: float, cap: int) -> int:
        """The largest size up to `cap` whose execution takes at most `room_ns` (at least 1)."""
        while cap > 1 and self.cost.cost_ns(cap) > room_ns:
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
            if not self.cost.known:
                return 1
            room = self._planning_budget_ns(other) - self.cost.cost_ns(1)
            cap = self._largest_fitting(room, cap)
        return cap

    def head_cap(self, level: int, now_ns: int, oldest_ns: int, head_samples: int) -> int:
        """The largest batch one headed by a `level` request may form: less urgent requests
        ride along only while the batch's execution fits the head's remaining budget; the
        `head_samples` of the head's own level always may go together."""
        if level not in self._watched or not self.cost.known:
            return self._max_size
        room = self._planning_budget_ns(level) - (now_ns - oldest_ns)
        return max(self._largest_fitting(room, self._max_size), min(head_samples, self._max_size))

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
        size measured less efficient. Saturated, this is every batch, and planning each
        cost the loop ~5 us (timed in the server on `simple`). Records the decision for
        metrics as plan() does."""
        if self._watched or self.cost.efficient_limit(self._max_size) < self._max_size:
            return False
        self._target = self._limit = self._max_size
        self._window_ns = 0
        return True

    def plan_holds(self, level: int) -> bool:
        """Whether a plan for a batch headed by a `level` request stays the plan while
        more requests arrive, until its target is queued or its deadline passes: unless
        the level has a configured budget, whose cap on the batch shrinks as the head
        waits. Re-planning on every arrival cost the loop more than the batching saved:
        on `simple` over gRPC at 32 clients, ~5 plans and replays per batch of 8, ~280 us
        of loop CPU per batch (timed in the server)."""
        return level not in self._watched

    def _nothing_to_wait_for(self, idle_slots: int) -> bool:
        """No costs measured yet, another slot idle, or no client outside to come back.
        Presence.nothing_to_wait_for answers the same from the batcher's side."""
        return not self.cost.known or idle_slots > 0 or int(self._peak) <= self._in_system

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
        self._tick(now_ns)
        head = queued if head_samples is None else head_samples
        limit = self.size_cap(level, now_ns)
        if level in self._watched:
            limit = min(limit, self.head_cap(level, now_ns, oldest_ns, head))
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
        potential = int(self._peak) - self._in_system
        rate, outside = self._estimates()
        cost_ns = self.cost.cost_ns
        budget = self._planning_budget_ns(level)
        end_ns = oldest_ns + int(budget)
        bound_ns = oldest_ns + self._bound_ns if self._bound_ns else end_ns
        # A derived budget lets a late batch wait for throughput (see the module's text),
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
        all_back = self._fill_ns(potential, potential, rate, outside)
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
            fill = self._fill_ns(m - n, potential, rate, outside)
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
        fill_ns = self._fill_ns(target - n, potential, rate, outside)
        deadline = min(start_by, now_ns + int(FILL_MARGIN * fill_ns) + FILL_SLACK_NS)
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
        return {
            "window_us": round(self.window_us, 1),
            "target_batch_size": self._target,
            "batch_limit": self._limit,
            "arrival_rate_per_s": round(
                (self._busy_arrivals + self._idle_arrivals) * 1e9 / RATE_TAU_NS, 1
            ),
            "busy_arrival_rate_per_s": round(self.busy_rate_per_ns() * 1e9, 1),
            "peak_in_system": round(self._peak, 1),
            "time_outside_us": round(min(self.time_outside_ns(), 1e15) / 1000, 1),
            "budgets_us": {level: self.budget_ns(level) // 1000 for level in self._levels},
            "cost_us": self.cost.table_us(),
        }
