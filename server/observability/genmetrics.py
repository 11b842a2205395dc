"""The generation engine's metrics, with vLLM's names, beside Triton's.

Each generative model version's scheduler holds a `GenerationStats`
(scheduler/genstats.py), which its engine thread updates; a scrape reads it here, found
structurally on the scheduler (`GenerationReporter`), like queue depths. The names and
meanings are vLLM's (its `vllm:` prefix, and its `model_name` label, so dashboards written
for vLLM work unchanged; `version` is added, as a ge-serve model has versions):

- `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`,
  `vllm:e2e_request_latency_seconds`, `vllm:request_queue_time_seconds` (histograms);
- `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
  `vllm:num_preemptions_total`, `vllm:request_success_total{finished_reason}` (counters;
  a client that left counts as `abort`), `vllm:prefix_cache_queries_total` and
  `vllm:prefix_cache_hits_total` (prompt tokens looked up in, and found in, the prefix
  cache at admission);
- `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
  (gauges; usage is a fraction, 1 = full, as in vLLM).

vLLM has no name for the engine's own cost, so these are ge-serve's:
`ge_serve_generation_steps_total`, `ge_serve_generation_step_seconds_total` (whole
iterations) and `ge_serve_generation_graph_seconds_total` (inside the step graph); their
difference is the engine's overhead per step.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from prometheus_client.metrics_core import HistogramMetricFamily, Metric

from ge_serve.scheduler.genstats import GenerationStats, Histogram

from .prometheus_text import format_number
from .statistics import ModelStats

log = logging.getLogger(__name__)

LABELS = ["model_name", "version"]


@runtime_checkable
class GenerationReporter(Protocol):
    @property
    def generation_stats(self) -> GenerationStats: ...


def generation_families(records: list[ModelStats]) -> Iterator[Metric]:
    found = []
    for record in records:
        scheduler = record.model.scheduler
        if isinstance(scheduler, GenerationReporter):
            found.append(
                ([record.model.name, record.model.version_str], scheduler.generation_stats)
            )
    if not found:
        return
    counters = (
        ("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens"),
        ("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens"),
        ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "preemptions"),
        (
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            "prefix_cache_queries",
        ),
        (
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            "prefix_cache_hits",
        ),
        ("ge_serve_generation_steps", "Engine iterations run.", "steps"),
        (
            "ge_serve_generation_step_seconds",
            "Seconds spent in engine iterations, in all.",
            "step_seconds",
        ),
        (
            "ge_serve_generation_graph_seconds",
            "Seconds of engine iterations spent inside the step graph.",
            "graph_seconds",
        ),
    )
    for name, doc, attribute in counters:
        family = Metric(name, doc, "counter")
        for values, stats in found:
            family.add_sample(name + "_total", dict(zip(LABELS, values, strict=True)),
                              float(getattr(stats, attribute)))  # fmt: skip
        yield family
    success = Metric("vllm:request_success", "Count of successfully processed requests.", "counter")
    for values, stats in found:
        labels = dict(zip(LABELS, values, strict=True))
        for reason, count in sorted(stats.finished.items()):
            success.add_sample(
                "vllm:request_success_total", {**labels, "finished_reason": reason}, float(count)
            )
    yield success
    gauges = (
        ("vllm:num_requests_running", "Number of requests in model execution batches.", "running"),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "waiting"),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_usage"),
    )
    for name, doc, attribute in gauges:
        family = Metric(name, doc, "gauge")
        for values, stats in found:
            family.add_sample(name, dict(zip(LABELS, values, strict=True)),
                              float(getattr(stats, attribute)))  # fmt: skip
        yield family
    histograms = (
        (
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            "ttft",
        ),
        (
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            "inter_token",
        ),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
        (
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            "queue",
        ),
    )
    for name, doc, attribute in histograms:
        histogram = HistogramMetricFamily(name, doc, labels=LABELS)
        for values, stats in found:
            observed: Histogram = getattr(stats, attribute)
            cumulative = observed.cumulative()
            les = [format_number(b) for b in observed.bounds] + ["+Inf"]
            buckets = list(zip(les, (float(c) for c in cumulative), strict=True))
            histogram.add_metric(values, buckets, observed.sum)
        yield histogram
