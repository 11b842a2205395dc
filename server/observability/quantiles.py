"""Cheap per-request recorders for latency quantiles and histograms.

prometheus_client's Summary has no quantiles, so `LatencyWindow` keeps the recent requests
in a bounded sliding time window (preallocated int64 blocks) and computes quantiles only
when scraped. Both recorders
are fed and read on the event loop, so they take no locks.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

# A row's value for a column the request has none of (a cache hit's compute times): the
# column's quantiles leave it out. Durations are never negative.
NOT_OBSERVED = -1


class _Slot:
    """One time slot of the window: a preallocated block of int64 rows.

    Rows are written into the block in place, so observing allocates nothing that lives
    on: keeping every request's row as a Python tuple made the garbage collector's full
    collections walk tens of thousands of survivors, which cost more than the rows.
    """

    __slots__ = ("epoch", "filled", "rows", "seen")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        # Allocated on the first row, whose width sets the columns.
        self.rows: npt.NDArray[np.int64] | None = None
        self.filled = 0
        self.seen = 0


class LatencyWindow:
    """Rows of durations (one row per request) seen in the last `max_age_s` seconds.

    The window is a ring of `slots` time slots, like prometheus-cpp's age buckets: a slot
    older than the window is cleared when its turn comes again. Each slot keeps at most
    `capacity` rows; past that it keeps a uniform sample (reservoir sampling), so memory
    and scrape cost stay bounded at any request rate.
    """

    __slots__ = ("_capacity", "_current", "_random", "_ring", "_slot_ns")

    def __init__(self, max_age_s: float = 60.0, slots: int = 5, capacity: int = 2048) -> None:
        self._slot_ns = max(1, int(max_age_s * 1e9 / slots))
        self._ring = [_Slot(-1) for _ in range(slots)]
        self._current = self._ring[0]
        self._capacity = capacity
        self._random = random.Random(0x6E5E).random

    def observe(self, row: tuple[int, ...], now_ns: int) -> None:
        epoch = now_ns // self._slot_ns
        slot = self._current
        if slot.epoch != epoch:
            slot = self._ring[epoch % len(self._ring)]
            if slot.epoch != epoch:
                slot.epoch = epoch
                slot.filled = 0
                slot.seen = 0
            self._current = slot
        slot.seen += 1
        rows = slot.rows
        if rows is None or rows.shape[1] != len(row):
            rows = slot.rows = np.zeros((self._capacity, len(row)), dtype=np.int64)
            slot.filled = 0
        if slot.filled < self._capacity:
            rows[slot.filled] = row
            slot.filled += 1
        else:
            index = int(self._random() * slot.seen)
            if index < self._capacity:
                rows[index] = row

    def quantiles(self, qs: Sequence[float], now_ns: int) -> list[list[float]] | None:
        """quantiles[i][column] over the window, or None when it holds no requests; NaN
        for a column none of them has a value for (NOT_OBSERVED)."""
        oldest = now_ns // self._slot_ns - len(self._ring) + 1
        blocks = [
            s.rows[: s.filled]
            for s in self._ring
            if s.epoch >= oldest and s.filled and s.rows is not None
        ]
        if not blocks:
            return None
        rows = np.concatenate(blocks)
        observed = rows >= 0
        if observed.all():
            values = np.quantile(rows.astype(np.float64), list(qs), axis=0)
        else:
            values = np.full((len(qs), rows.shape[1]), np.nan)
            for column in range(rows.shape[1]):
                found = rows[observed[:, column], column].astype(np.float64)
                if found.size:
                    values[:, column] = np.quantile(found, list(qs))
        result: list[list[float]] = values.tolist()
        return result


class Buckets:
    """Histogram counts over fixed upper bounds (the last bucket is +Inf)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = list(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[int]:
        running = 0
        out: list[int] = []
        for count in self.counts:
            running += count
            out.append(running)
        return out
