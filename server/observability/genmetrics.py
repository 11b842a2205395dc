"""The generation engine's metrics, with vLLM's names, beside Triton's.

Each generative model version's scheduler holds a `GenerationStats`
(scheduler/genstats.py), which its engine thread updates; a scrape reads it here, found
structurally on the scheduler (`GenerationReporter`), like queue depths. The names and
meanings are vLLM's (its `vllm:` prefix, and its `model_name` label, so dashboards written
for vLLM work unchanged; `version` is added, as a ge-serve model has versions):

- `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`,
  `vllm:time_per_output_token_seconds` (the same observations in Triton's vLLM backend's
  buckets, a prefix of the former's), `vllm:e2e_request_latency_seconds`,
  `vllm:request_queue_time_seconds`, `vllm:request_prompt_tokens`,
  `vllm:request_generation_tokens`, `vllm:request_params_n`, vLLM's per-phase
  `vllm:request_{inference,prefill,decode}_time_seconds`,
  `vllm:request_time_per_output_token_seconds`, `vllm:request_num_preemptions`,
  `vllm:request_max_num_generation_tokens`, `vllm:request_params_max_tokens` and
  `vllm:iteration_tokens_total` (histograms);
- `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
  `vllm:num_preemptions_total`, `vllm:request_success_total{finished_reason}` (counters;
  a client that left counts as `abort`), `vllm:prefix_cache_queries_total` and
  `vllm:prefix_cache_hits_total` (prompt tokens looked up in, and found in, the prefix
  cache at admission);
- `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
  (gauges; usage is a fraction, 1 = full, as in vLLM).

Every `vllm:` series also carries Triton's vLLM backend's `model` label (its name for the
same value), so dashboards written for either filter as they are used to. A model whose
config sets `REPORT_CUSTOM_METRICS` false (Triton's vLLM backend's switch; ge-serve's
default is on, as vLLM's) gets no `vllm:` series.

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

from ge_serve.backends.text_bool import parse_bool
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.genstats import TPOT_BUCKETS, GenerationStats, Histogram

from .prometheus_text import format_number
from .statistics import ModelStats

log = logging.getLogger(__name__)

# vLLM's `model_name` and Triton's vLLM backend's `model`, both the model's name.
LABELS = ["model_name", "model", "version"]
SWITCH = "REPORT_CUSTOM_METRICS"
# Each generative model version's label values (LABELS) and stats.
Found = list[tuple[list[str], GenerationStats]]


@runtime_checkable
class GenerationReporter(Protocol):
    @property
    def generation_stats(self) -> GenerationStats: ...


def reports_vllm_metrics(config: model_config_pb2.ModelConfig) -> bool:
    """Off only where the config sets REPORT_CUSTOM_METRICS to a false value (any case, as
    ge-serve reads booleans); unset leaves vLLM's metrics on. The llm backend refuses any
    other value at load (backends/llm/settings.py), so the fallback here never decides."""
    if SWITCH not in config.parameters:
        return True
    try:
        return parse_bool(config.parameters[SWITCH].string_value)
    except ValueError:
        return True


def generation_families(records: list[ModelStats]) -> Iterator[Metric]:
    found = []
    vllm = []
    for record in records:
        scheduler = record.model.scheduler
        if isinstance(scheduler, GenerationReporter):
            name = record.model.name
            entry = ([name, name, record.model.version_str], scheduler.generation_stats)
            found.append(entry)
            if reports_vllm_metrics(record.model.config):
                vllm.append(entry)
    if not found:
        return
    yield from _engine_families(found)
    if vllm:
        yield from _vllm_families(vllm)


def _engine_families(found: Found) -> Iterator[Metric]:
    counters = (
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
            # ge-serve's own families keep their labels (no `model`: not a vLLM family).
            labels = {"model_name": values[0], "version": values[2]}
            family.add_sample(name + "_total", labels, float(getattr(stats, attribute)))
        yield family


def _vllm_families(found: Found) -> Iterator[Metric]:
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
        (
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            "request_prompt",
        ),
        (
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            "request_generation",
        ),
        ("vllm:request_params_n", "Histogram of the n request parameter.", "params_n"),
        (
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            "request_inference",
        ),
        (
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            "request_prefill",
        ),
        (
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            "request_decode",
        ),
        (
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            "request_tpot",
        ),
        (
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            "request_preemptions",
        ),
        # vLLM observes here the tokens generated (the most of a request's n choices; the
        # engine's n is 1), whatever its help text says.
        (
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            "request_generation",
        ),
        (
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            "request_max_tokens",
        ),
        (
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            "step_tokens",
        ),
    )
    for name, doc, attribute in histograms:
        histogram = HistogramMetricFamily(name, doc, labels=LABELS)
        for values, stats in found:
            observed: Histogram = getattr(stats, attribute)
            histogram.add_metric(values, _buckets(observed, observed.bounds), observed.sum)
        yield histogram
    # Triton's vLLM backend's name (and buckets) for vLLM's inter-token latency: the same
    # observations, read off that histogram, whose bounds include these.
    tpot = HistogramMetricFamily(
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds.",
        labels=LABELS,
    )
    for values, stats in found:
        tpot.add_metric(values, _buckets(stats.inter_token, TPOT_BUCKETS), stats.inter_token.sum)
    yield tpot


def _buckets(observed: Histogram, bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    """`observed`'s cumulative counts at `bounds` (a subset of its own) and +Inf."""
    cumulative = observed.cumulative()
    at = [cumulative[observed.bounds.index(bound)] for bound in bounds] + [cumulative[-1]]
    les = [format_number(b) for b in bounds] + ["+Inf"]
    return list(zip(les, (float(c) for c in at), strict=True))
