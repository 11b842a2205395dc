"""What the generation engine reports for metrics: counters, gauges and histograms.

The engine's thread updates one `GenerationStats` per model version; a scrape reads it
on the event loop (server/observability/genmetrics.py turns it into vLLM-named
families). Each field is a plain number or list written by one thread, so a reader sees
each value whole; a scrape taken mid-step may mix two steps' figures, which Prometheus tolerates.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# vLLM's buckets for the same histograms (seconds; its vllm/v1/metrics/buckets.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
# Triton's vLLM backend's buckets where they differ from vLLM's. Its time-per-output-token
# bounds are the first thirteen of ITL_BUCKETS, so that family is read off `inter_token`
# at a scrape (no second observation per token); its `n` bounds are vLLM's too.
TPOT_BUCKETS = ITL_BUCKETS[:13]
N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
# vLLM's per-request preemption bounds: the first holds requests preempted never or once.
PREEMPTION_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
# vLLM's tokens-per-step bounds (1, then its graph capture sizes' powers of two).
STEP_TOKEN_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
                      4096.0, 8192.0, 16384.0)  # fmt: skip
# vLLM's, but `repetition`, which nothing here detects; `error` is a sequence the engine
# failed.
FINISH_REASONS = ("stop", "length", "abort", "error")


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's (and Triton's vLLM backend's) token-count buckets: 1, 2, 5, 10, 20, 50, ...
    while at most `max_model_len`, as its build_1_2_5_buckets."""
    bounds: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(bounds)
            bounds.append(float(mantissa * scale))
        scale *= 10


@dataclass(frozen=True, slots=True)
class RequestTimes:
    """A finished request's moments (time.monotonic()): arrival, first admission, first
    token, last token."""

    arrival_s: float
    scheduled_s: float
    first_token_s: float
    finished_s: float


@dataclass(frozen=True, slots=True)
class RequestTokens:
    prompt: int
    generated: int
    # The most it could have generated (its max_tokens, n being 1).
    max_tokens: int
    # Times it was preempted.
    preemptions: int = 0


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
    # Per finished request (as e2e): its prompt and generated tokens, and its `n` (always 1:
    # /v1's n > 1 arrives as n requests; observed all the same, since dashboards divide by it).
    request_prompt: Histogram = field(default_factory=lambda: Histogram(token_buckets(2048)))
    request_generation: Histogram = field(default_factory=lambda: Histogram(token_buckets(2048)))
    params_n: Histogram = field(default_factory=lambda: Histogram(N_BUCKETS))
    # vLLM's phases of a finished request: admitted to its last token (inference), to its
    # first (prefill), first to last (decode); and the tokens it could have had.
    request_inference: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
    request_prefill: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
    request_decode: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
    # Its decode time per token after the first (0 with one token), and its preemptions.
    request_tpot: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    request_preemptions: Histogram = field(default_factory=lambda: Histogram(PREEMPTION_BUCKETS))
    request_max_tokens: Histogram = field(default_factory=lambda: Histogram(token_buckets(2048)))
    # Tokens each engine step computed: decode rows and prefill chunks together.
    step_tokens: Histogram = field(default_factory=lambda: Histogram(STEP_TOKEN_BUCKETS))

    @classmethod
    def for_engine(cls, kv_blocks_total: int, max_model_len: int) -> GenerationStats:
        return cls(
            kv_blocks_total=kv_blocks_total,
            request_prompt=Histogram(token_buckets(max_model_len)),
            request_generation=Histogram(token_buckets(max_model_len)),
            request_max_tokens=Histogram(token_buckets(max_model_len)),
        )

    def request_finished(self, reason: str, times: RequestTimes, tokens: RequestTokens) -> None:
        self.finished[reason] += 1
        self.e2e.observe(times.finished_s - times.arrival_s)
        self.request_inference.observe(times.finished_s - times.scheduled_s)
        self.request_prefill.observe(times.first_token_s - times.scheduled_s)
        decode = times.finished_s - times.first_token_s
        self.request_decode.observe(decode)
        # vLLM's mean time per output token: the prefill's token is not counted.
        self.request_tpot.observe(decode / (tokens.generated - 1) if tokens.generated > 1 else 0.0)
        self.request_preemptions.observe(tokens.preemptions)
        self.request_prompt.observe(tokens.prompt)
        self.request_generation.observe(tokens.generated)
        self.request_max_tokens.observe(tokens.max_tokens)
        self.params_n.observe(1)

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / max(self.kv_blocks_total, 1)
