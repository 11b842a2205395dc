"""The metric families a scrape of /metrics reports, built from what the server holds.

Triton's counters (success, failure by reason, inference and execution counts, the five
latency counters) come from the statistics records the core keeps anyway; the summaries
and histograms from each model version's `ModelSeries`, which ServerMetrics records on
the hot path; the queue depths and the adaptive controller's latest decision from the
schedulers, read structurally (the scheduler imports nothing from here); CPU and device
figures from the resource sampler.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from prometheus_client.metrics_core import HistogramMetricFamily, Metric

from ge_serve.backends.ge.accuracy import metric_rows

from ..errors import FailureReason
from ..inference.model import ModelVersion
from .prometheus_text import format_number
from .quantiles import Buckets, LatencyWindow
from .resources import ResourceSampler
from .statistics import ModelStats

log = logging.getLogger(__name__)

# Request duration buckets, µs: 100 µs to 10 s.
LATENCY_BUCKETS_US = (
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000,
    100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LATENCIES = ("request", "queue", "compute_input", "compute_infer", "compute_output")
# Triton's default first-response buckets, ms (core metric_model_reporter.h).
FIRST_RESPONSE_BUCKETS_MS = (100, 500, 2000, 5000)


# --- what schedulers may expose (structural: the scheduler imports nothing from here) ----


@runtime_checkable
class QueueDepthProvider(Protocol):
    def queue_depths(self) -> Mapping[int, int]:
        """Requests queued (not yet executing) per priority level."""
        ...


class BatchController(Protocol):
    @property
    def window_us(self) -> float:
        """The batch window of the controller's latest decision."""
        ...

    @property
    def target_batch_size(self) -> int: ...


@runtime_checkable
class ControlledScheduler(Protocol):
    @property
    def controller(self) -> BatchController | None:
        """The adaptive controller, or None when the model does not use one."""
        ...


# --- what the hot path records per model version ---------------------------------------


@dataclass(slots=True)
class ModelSeries:
    """What the hot path records for one model version, beyond its statistics."""

    window: LatencyWindow | None
    latency: Buckets | None
    batch: Buckets | None
    # Request to first response, whole ms (histogram_latencies, as Triton's).
    first: Buckets | None = None
    # Cache hit and miss µs, a row each, the other column NOT_OBSERVED (summaries on and
    # the model's cache enabled, as Triton's).
    cache: LatencyWindow | None = None


# --- the families ------------------------------------------------------------------------


def triton_families(records: list[ModelStats], counter_latencies: bool) -> Iterator[Metric]:
    """Triton's counters and gauges per model version; the latency counters when
    `counter_latencies`."""
    success = _family(
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        "counter",
    )
    failure = _family(
        "nv_inference_request_failure",
        "Number of failed inference requests, all batch sizes",
        "counter",
    )
    count = _family(
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        "counter",
    )
    execs = _family(
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        "counter",
    )
    pending = _family(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        "gauge",
    )
    load = _family("nv_model_load_duration_secs", "Model load time in seconds", "gauge")
    memory = _family(
        "ge_serve_model_memory_bytes", "Device memory held by a loaded model version", "gauge"
    )
    durations = [
        _family(
            "nv_inference_request_duration_us",
            "Cumulative inference request duration in microseconds (includes cached requests)",
            "counter",
        ),
        _family(
            "nv_inference_queue_duration_us",
            "Cumulative inference queuing duration in microseconds (includes cached requests)",
            "counter",
        ),
        _family(
            "nv_inference_compute_input_duration_us",
            "Cumulative compute input duration in microseconds (does not include cached requests)",
            "counter",
        ),
        _family(
            "nv_inference_compute_infer_duration_us",
            "Cumulative compute inference duration in microseconds (does not include "
            "cached requests)",
            "counter",
        ),
        _family(
            "nv_inference_compute_output_duration_us",
            "Cumulative inference compute output duration in microseconds (does not "
            "include cached requests)",
            "counter",
        ),
    ]
    for record in records:
        labels = _labels(record)
        success.add_sample(success.name, labels, record.success_count)
        for reason in FailureReason:
            failure.add_sample(
                failure.name, {**labels, "reason": reason.value}, record.failures[reason]
            )
        count.add_sample(count.name, labels, record.inference_count)
        execs.add_sample(execs.name, labels, record.execution_count)
        pending.add_sample(pending.name, labels, _pending(record.model))
        load.add_sample(load.name, labels, record.load_seconds)
        memory.add_sample(memory.name, labels, record.model.loaded.memory_bytes)
        for family, ns in zip(durations, _latency_sums(record), strict=True):
            family.add_sample(family.name, labels, ns / 1e3)
    yield from (success, failure, count, execs)
    if counter_latencies:
        yield from durations
    yield from (pending, load, memory)
    yield from accuracy_families(records)


def accuracy_families(records: list[ModelStats]) -> Iterator[Metric]:
    """The GE backend's load-time conversion accuracy check, per model output."""
    largest = [
        _family(
            "ge_serve_conversion_max_abs_error",
            "Largest absolute error of a GE model's output against onnxruntime, at load",
            "gauge",
        ),
        _family(
            "ge_serve_conversion_max_rel_error",
            "Largest relative error of a GE model's output against onnxruntime, at load",
            "gauge",
        ),
    ]
    for record in records:
        for output, max_abs, max_rel in metric_rows(record.model.loaded.extra):
            labels = {**_labels(record), "output": output}
            for family, value in zip(largest, (max_abs, max_rel), strict=True):
                family.add_sample(family.name, labels, value)
    yield from (family for family in largest if family.samples)


def cache_families(records: list[ModelStats]) -> Iterator[Metric]:
    """Triton's per-model response cache counters, for the models that enable the cache."""
    names = (
        ("nv_cache_num_hits_per_model", "Number of cache hits per model"),
        ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds"),
        ("nv_cache_num_misses_per_model", "Number of cache misses per model"),
        (
            "nv_cache_miss_duration_per_model",
            "Total cache miss (insert+lookup) duration per model, in microseconds",
        ),
    )
    cached = [r for r in records if r.model.config.response_cache.enable]
    if not cached:
        return
    families = [_family(name, text, "counter") for name, text in names]
    for record in cached:
        labels = _labels(record)
        values = (
            record.cache_hit_count,
            record.cache_hit_ns / 1e3,
            record.cache_miss_count,
            record.cache_miss_ns / 1e3,
        )
        for family, value in zip(families, values, strict=True):
            family.add_sample(family.name, labels, value)
    yield from families


def summary_families(
    records: list[ModelStats], recorded: Mapping[int, ModelSeries], quantiles: Sequence[float]
) -> Iterator[Metric]:
    """Triton's latency summaries, the quantiles from each version's latency window."""
    what = {
        "request": "inference request duration",
        "queue": "inference queuing duration",
        "compute_input": "compute input duration",
        "compute_infer": "compute inference duration",
        "compute_output": "compute output duration",
    }
    families = [
        _family(
            f"nv_inference_{name}_summary_us",
            f"Summary of {what[name]} in microseconds",
            "summary",
        )
        for name in LATENCIES
    ]
    qs = quantiles
    now = time.monotonic_ns()
    for record in records:
        labels = _labels(record)
        series = recorded.get(id(record.model))
        window = series.window if series is not None else None
        values = window.quantiles(qs, now) if window is not None else None
        sums = _latency_sums(record)
        # Observed per request as Triton observes them (core infer_stats.cc): request and
        # queue for every success, cache hits included; compute only for those computed.
        computed = record.success_count - record.cache_hit_count
        counts = (record.success_count, record.success_count, computed, computed, computed)
        _summary_samples(families, labels, counts, sums, qs, values)
    yield from families


def _summary_samples(
    families: Sequence[Metric],
    labels: dict[str, str],
    counts: Sequence[int],
    sums_ns: Sequence[float],
    quantiles: Sequence[float],
    values: Sequence[Sequence[float]] | None,  # ns
) -> None:
    """One model's count, sum and quantiles (µs) of each family, a column of `values`."""
    for column, family in enumerate(families):
        family.add_sample(family.name + "_count", labels, counts[column])
        family.add_sample(family.name + "_sum", labels, sums_ns[column] / 1e3)
        for row, q in enumerate(quantiles):
            value = values[row][column] / 1e3 if values is not None else math.nan
            family.add_sample(family.name, {**labels, "quantile": str(q)}, value)


def cache_summary_families(
    records: list[ModelStats], recorded: Mapping[int, ModelSeries], quantiles: Sequence[float]
) -> Iterator[Metric]:
    """Triton's cache hit and miss summaries (µs) of the models that enable the cache."""
    cached = [r for r in records if r.model.config.response_cache.enable]
    if not cached:
        return
    families = [
        _family(
            f"nv_cache_{name}_summary_per_model",
            f"Summary of cache {name} counts/durations per model, in microseconds.",
            "summary",
        )
        for name in ("hit", "miss")
    ]
    now = time.monotonic_ns()
    for record in cached:
        labels = _labels(record)
        series = recorded.get(id(record.model))
        window = series.cache if series is not None else None
        values = window.quantiles(quantiles, now) if window is not None else None
        counts = (record.cache_hit_count, record.cache_miss_count)
        sums = (record.cache_hit_ns, record.cache_miss_ns)
        _summary_samples(families, labels, counts, sums, quantiles, values)
    yield from families


def histogram_families(
    records: list[ModelStats], recorded: Mapping[int, ModelSeries]
) -> Iterator[Metric]:
    """Request duration and batch size histograms per model version, and Triton's
    request-to-first-response histogram."""
    # A family's samples share their label names: `namespace` on all, when any has one.
    spaced = any(record.model.namespace for record in records)
    names = ["namespace", "model", "version"] if spaced else ["model", "version"]
    latency = HistogramMetricFamily(
        "ge_serve_request_duration_us",
        "Successful request duration in microseconds (aggregates across replicas)",
        labels=names,
    )
    batch = HistogramMetricFamily(
        "ge_serve_batch_size",
        "Batch size of each model execution (requests merged, before gear padding)",
        labels=names,
    )
    first = HistogramMetricFamily(
        "nv_inference_first_response_histogram_ms",
        "Duration from request to first response in milliseconds",
        labels=names,
    )
    for record in records:
        series = recorded.get(id(record.model))
        if series is None:
            continue
        model = record.model
        values = [model.name, model.version_str]
        if spaced:
            values.insert(0, model.namespace)
        if series.latency is not None:
            latency.add_metric(
                values,
                _buckets(LATENCY_BUCKETS_US, series.latency.cumulative()),
                series.latency.total / 1e3,
            )
        if series.batch is not None:
            batch.add_metric(
                values, _buckets(BATCH_BUCKETS, series.batch.cumulative()), series.batch.total
            )
        if series.first is not None:
            buckets = _buckets(FIRST_RESPONSE_BUCKETS_MS, series.first.cumulative())
            first.add_metric(values, buckets, series.first.total)
    yield from (latency, batch, first)


def scheduler_families(records: list[ModelStats]) -> Iterator[Metric]:
    """Queue depths and the adaptive controller's latest window and target."""
    depth = _family(
        "ge_serve_queue_depth", "Requests queued per priority level, not yet executing", "gauge"
    )
    window = _family(
        "ge_serve_batch_window_us",
        "Batch window of the adaptive controller's latest decision, in microseconds",
        "gauge",
    )
    target = _family(
        "ge_serve_target_batch_size",
        "Target batch size of the adaptive controller's latest decision",
        "gauge",
    )
    for record in records:
        scheduler = record.model.scheduler
        labels = _labels(record)
        try:
            if isinstance(scheduler, QueueDepthProvider):
                for level, queued in sorted(scheduler.queue_depths().items()):
                    depth.add_sample(depth.name, {**labels, "priority": str(level)}, queued)
            controller = (
                scheduler.controller if isinstance(scheduler, ControlledScheduler) else None
            )
            if controller is not None:
                window.add_sample(window.name, labels, float(controller.window_us))
                target.add_sample(target.name, labels, float(controller.target_batch_size))
        except Exception:
            log.exception("reading scheduler metrics of '%s' failed", record.model.name)
    yield from (depth, window, target)


def resource_families(sampler: ResourceSampler | None, devices: bool) -> Iterator[Metric]:
    """CPU figures, and per device (when `devices`) its use and memory."""
    if sampler is None:
        return
    snapshot = sampler.snapshot
    if sampler.cpu:
        for name, doc, value in (
            (
                "nv_cpu_utilization",
                "CPU utilization rate [0.0 - 1.0]",
                snapshot.cpu_utilization,
            ),
            (
                "nv_cpu_memory_total_bytes",
                "CPU total memory (RAM), in bytes",
                snapshot.cpu_memory_total_bytes,
            ),
            (
                "nv_cpu_memory_used_bytes",
                "CPU used memory (RAM), in bytes",
                snapshot.cpu_memory_used_bytes,
            ),
        ):
            family = _family(name, doc, "gauge")
            if value is not None:
                family.add_sample(name, {}, value)
            yield family
    if not devices:
        return
    families = [
        (
            _family(
                "ge_serve_device_utilization",
                "Device busy fraction [0.0 - 1.0] over the last sampling interval",
                "gauge",
            ),
            "utilization",
        ),
        (
            _family("ge_serve_device_memory_used_bytes", "Device memory used, in bytes", "gauge"),
            "memory_used_bytes",
        ),
        (
            _family("ge_serve_device_memory_total_bytes", "Device memory total, in bytes", "gauge"),
            "memory_total_bytes",
        ),
        (
            _family(
                "ge_serve_device_pool_bytes",
                "Device bytes held by buffer pools, in bytes",
                "gauge",
            ),
            "pool_bytes",
        ),
    ]
    simulated = _family(
        "ge_serve_device_simulated_timing",
        "1 where the device's execution time is modelled (--sim-cost), by profile: its "
        "busy time and the execution durations are simulated, its results are real",
        "gauge",
    )
    executions = _family(
        "ge_serve_device_executions",
        "Graph executions on the device (a batch split across instance_exec_blocks graphs "
        "counts once per graph)",
        "counter",
    )
    for device in snapshot.devices:
        if device.executions >= 0:
            executions.add_sample(
                f"{executions.name}_total", {"device": device.device}, float(device.executions)
            )
        for family, attribute in families:
            value = float(getattr(device, attribute))
            if value >= 0:  # a device may not know its utilization (reported as < 0)
                family.add_sample(family.name, {"device": device.device}, value)
        if device.simulated_timing:
            labels = {"device": device.device, "profile": device.simulated_timing}
            simulated.add_sample(simulated.name, labels, 1.0)
    yield from (family for family, _ in families)
    if executions.samples:
        yield executions
    if simulated.samples:
        yield simulated


def _family(name: str, doc: str, kind: str) -> Metric:
    return Metric(name, doc, kind)


def _labels(record: ModelStats) -> dict[str, str]:
    model = record.model
    if model.namespace:  # same-named models of two repositories must not share a series
        return {"namespace": model.namespace, "model": model.name, "version": model.version_str}
    return {"model": model.name, "version": model.version_str}


def _latency_sums(record: ModelStats) -> tuple[int, int, int, int, int]:
    return (
        record.success_ns,
        record.queue_ns,
        record.input_ns,
        record.infer_ns,
        record.output_ns,
    )


def _pending(model: ModelVersion) -> int:
    scheduler = model.scheduler
    if isinstance(scheduler, QueueDepthProvider):
        return sum(scheduler.queue_depths().values())
    # Without queue depths, what the scheduler counts as pending (Scheduler.pending).
    return scheduler.pending


def _buckets(bounds: Sequence[float], cumulative: list[int]) -> list[tuple[str, float]]:
    les = [format_number(bound) for bound in bounds] + ["+Inf"]
    return list(zip(les, (float(c) for c in cumulative), strict=True))
