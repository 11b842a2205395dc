"""The adaptive controller's execution cost model: how long a batch of each size runs.

Each batch is priced by its slot time, from the hand-over to the slot until its results
are back on the loop: on a busy host the slot thread's wake-up costs more than a small
model's compute, and only fewer, fuller batches save it. Per (padded) size the model keeps
an EWMA of those times, and through them a least-squares line `cost(b) = a + b*k`, which
smooths noise and prices sizes not run yet. A size's first execution is a warm-up, replaced
by its second; a stall (an execution far over its estimate) is left out unless it lasts.
Past the size with the best measured per-sample throughput, a size measured clearly slower
per sample is not worth running (`efficient_limit`): a line cannot say that.

See docs/adaptive-batching.md for the design as a whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from ge_serve.backends.base import gear_for

# Weight of a new execution in its size's cost EWMA.
COST_ALPHA = 0.2
# An execution over this many times its size's estimate is a stall, left out of the
# estimate unless it is the STALL_RUN-th such in a row; then it counts as this many times
# the estimate (see CostModel.record).
STALL_CAP = 2.0
STALL_RUN = 3
# A size is trusted for the efficiency limit after this many executions.
MIN_RUNS = 3
# The line and the efficiency limit are refitted when a size is first seen or first
# trusted, and otherwise once per this many executions: the EWMAs move slowly, and a refit
# costs the loop far more than the rest of recording an execution.
REFIT_EVERY = 32
# Larger batches are cut back to the most efficient size when they lose this much per sample.
EFFICIENCY_LOSS = 0.95


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
            # GIL: on a busy host, now and then, many times the usual, for a small model
            # several times its compute. Counted, two in a row can move a plain EWMA so
            # far that large batches look worse per sample than batches of 1, and the
            # efficiency limit then cuts batches to 1. Counted even at STALL_CAP times
            # the estimate, stalls still tilt the sizes: a pause hits an execution about
            # in proportion to its length, so long batches take more of them, and each
            # then adds a whole estimate; under time-sharing that kept batches far below
            # the sizes the load could fill (bench/RESULTS.md, the CNN against raw
            # onnxruntime). So an execution over STALL_CAP times its estimate is a stall
            # and is left out, unless the STALL_RUN - 1 before it (of its size) were too:
            # a real rise in cost lasts, and is followed from then on by up to
            # COST_ALPHA * (STALL_CAP - 1) per execution.
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
        once, when there are two: a size run once holds a warm-up, which can run well
        slower than the executions after it and, at the largest size, tilt the whole
        line."""
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
