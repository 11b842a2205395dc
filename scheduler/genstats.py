"""What the generation engine reports for metrics: counters, gauges and histograms.

The engine's thread updates one `GenerationStats` per model version; a scrape reads it
on the event loop (server/observability/genmetrics.py turns it into vLLM-named
families). Each field is a plain number or list written by one thread, so a reader sees
each value whole; a scrape taken mid-step may mix two steps' figures, which Prometheus tolerates.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# vLLM's buckets for the same histograms (seconds).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort")


class Histogram:
    """Counts per bucket (the last is +Inf) and the sum of what was observed."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[int]:
        total = 0
        out = []
        for count in list(self.counts):
            total += count
            out.append(total)
        return out


@dataclass(slots=True)
class GenerationStats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    # Prompt tokens looked up in the prefix cache at admission, and found there.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    running: int = 0
    waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 1
    # Engine iterations, and seconds spent in them in all and inside the step graph.
    steps: int = 0
    step_seconds: float = 0.0
    graph_seconds: float = 0.0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    inter_token: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / max(self.kv_blocks_total, 1)
