"""The adaptive controller's arrival model: who is in the system, and who will come back.

Two estimates say how long a batch takes to fill. The rate that waiting can catch is the
rate of arrivals that find the system busy, over the time it is busy: with one closed-loop
client the next request never arrives while the current one waits, however high the
overall rate. And under closed-loop load a batch of k leaving means about k requests
within one client turnaround, which an averaged rate cannot see: the clients seen and not
in the system now (the decayed peak in the system less those in it) come back spread over
twice their mean time outside (Little's law on the outside). The faster of the two counts.

`ArrivalModel` learns from the events the batcher reports (replayed in order by the
controller); it is the only count of who is in the system.

See docs/adaptive-batching.md for the design as a whole.
"""

from __future__ import annotations

import math

# Time constant of the rate estimators.
RATE_TAU_NS = 500_000_000
# The peak (how many clients there are) decays by this factor per departure, not per unit
# of time: it must outlive a long batch with every client inside (a time constant of a
# second or so forgets a good share of the clients while a large batch of a CNN runs on a
# few cores), and must forget clients that are gone within a few requests (0.8 takes a
# peak of 32 down to 1 in about 15 departures).
PEAK_DECAY = 0.8
# The estimators decay in steps of at least this long, not on every event: a step closes
# the time integrals and takes an exp, which at one client (requests well under a
# millisecond apart on a small model) costs the loop a noticeable share of each request
# with the caches cold. The error is at most DECAY_STEP_NS / RATE_TAU_NS (2 %), far below
# the estimates' own noise.
DECAY_STEP_NS = 10_000_000
# Weight of a new gap in a level's mean gap between requests.
GAP_ALPHA = 0.2


class ArrivalModel:
    """Arrivals, departures and the clients outside, as the controller's replay sees them:
    the samples `in_system`, their decayed `peak`, the busy-arrival rate and the time
    clients spend outside; and when each level in `watched` was last seen, with its mean
    gap between requests. Loop-only."""

    __slots__ = (  # see CostModel
        "_busy_arrivals", "_busy_ns", "_busy_since_ns", "_decayed_ns", "_gap_ns",
        "_idle_arrivals", "_last_ns", "_occupancy", "_outside_ns", "_peak_area", "_peak_ns",
        "_returns", "_seen_ns", "_start_ns", "in_system", "peak", "watched",
    )  # fmt: skip

    def __init__(self, watched: frozenset[int]) -> None:
        # The estimators, decayed in steps (see _decay). Each arrival and departure only
        # adds to sums; the time integrals are closed at plan time (see _integrals):
        #   in the system:  ∫ in_system dt = _occupancy + in_system * now
        #   the peak:       ∫ peak dt      = _peak_area + peak * (now - _peak_ns)
        #   busy:           ∫ [in_system > 0] dt = _busy_ns + (now - _busy_since_ns if busy)
        # and the time clients spend outside is the peak's integral less the system's.
        self._last_ns = 0
        self._decayed_ns = 0
        self._start_ns = 0
        self.in_system = 0
        self._busy_arrivals = 0.0
        self._idle_arrivals = 0.0  # arrivals that found the system empty
        self._returns = 0.0
        self.peak = 0.0
        self._occupancy = 0
        self._peak_area = 0.0
        self._peak_ns = 0
        self._busy_ns = 0.0
        self._busy_since_ns = 0
        self._outside_ns = 0.0  # decayed, up to _decayed_ns
        self._seen_ns: dict[int, int] = {}
        self._gap_ns: dict[int, float] = {}
        # Only levels with a configured budget need their sightings (Budgets.urgent_active).
        self.watched = watched

    def record_arrival(self, now_ns: int, size: int, level: int) -> None:
        # Per request: keep it to additions (the integrals are closed at plan time).
        now_ns = self.tick(now_ns)
        held = self.in_system
        if held:
            self._busy_arrivals += size
        else:
            self._idle_arrivals += size
            self._busy_since_ns = now_ns
        self._occupancy -= size * now_ns
        held += size
        self.in_system = held
        if held > self.peak:
            self._set_peak(now_ns, float(held))  # a client not seen before
        else:
            self._returns += size  # one of the clients the peak counts, back from outside
        if level in self.watched:
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
        now_ns = self.tick(now_ns)
        held = self.in_system
        self._set_peak(now_ns, max(self.peak * PEAK_DECAY, float(held)))
        size = min(size, held)
        self._occupancy += size * now_ns
        held -= size
        self.in_system = held
        if not held and size:
            self._busy_ns += now_ns - self._busy_since_ns

    def tick(self, now_ns: int) -> int:
        """Decay the estimators when a step is due, and return the time to account an
        event at: `now_ns`, or the latest event's time should `now_ns` be earlier."""
        if now_ns - self._decayed_ns >= DECAY_STEP_NS:
            self._decay(now_ns)
        if now_ns > self._last_ns:
            self._last_ns = now_ns
            return now_ns
        return self._last_ns

    def _set_peak(self, now_ns: int, peak: float) -> None:
        self._peak_area += self.peak * (now_ns - self._peak_ns)
        self._peak_ns = now_ns
        self.peak = peak

    def _integrals(self, now_ns: int) -> tuple[float, float]:
        """(time busy, client-time outside) up to `now_ns`, decayed."""
        busy = self._busy_ns
        if self.in_system:
            busy += now_ns - self._busy_since_ns
        peak_area = self._peak_area + self.peak * (now_ns - self._peak_ns)
        occupancy = self._occupancy + self.in_system * now_ns
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
        self._occupancy = -self.in_system * now_ns
        self._busy_arrivals *= decay
        self._idle_arrivals *= decay
        self._returns *= decay

    # --- estimates -----------------------------------------------------------------------

    def busy_rate_per_ns(self) -> float:
        """Arrivals per ns while the system holds other requests (up to the latest event)."""
        return self.estimates()[0]

    def time_outside_ns(self) -> float:
        """The mean time a client spends outside the system between two requests (its
        turnaround: transport, the client's own work): the time-integral of the clients
        outside (the peak less those in the system) over the arrivals that came back from
        outside (arrivals that raise the peak are clients not seen before). Infinite
        before any came back."""
        return self.estimates()[1]

    def estimates(self) -> tuple[float, float]:
        """(busy_rate_per_ns, time_outside_ns), from one closing of the integrals."""
        busy, outside = self._integrals(self._last_ns)
        rate = self._busy_arrivals / busy if busy > 0 else 0.0
        turnaround = outside / self._returns if self._returns > 0 else math.inf
        return rate, turnaround

    def arrivals_per_s(self) -> float:
        """All arrivals per second, busy or not (decayed)."""
        return (self._busy_arrivals + self._idle_arrivals) * 1e9 / RATE_TAU_NS

    def last_seen_ns(self, level: int) -> int:
        """When a `watched` level last arrived; before it ever did, when the first event
        came (the model's first request counts as a sighting of every level)."""
        return self._seen_ns.get(level, self._start_ns)

    def mean_gap_ns(self, level: int) -> float:
        """A `watched` level's mean gap between requests (0 before it has one)."""
        return self._gap_ns.get(level, 0.0)
