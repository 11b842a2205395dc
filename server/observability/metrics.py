"""Prometheus metrics with Triton's names and labels, on a registry the server owns.

Triton's counters (success, failure by reason, inference and execution counts, the five
latency counters) are read at scrape time from the statistics records the core keeps
anyway, so they cost nothing per request and always agree with the statistics extension.
What the hot path pays for metrics is only what statistics do not already hold: the
latency window behind the summaries, and the histograms. With `--allow-metrics=false`
none of this exists.

`ServerMetrics` records on the hot path and collects at scrape time; the families it
reports are built in scrape.py, and written out as text in prometheus_text.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from ge_serve.scheduler.work import WorkItem

from ..errors import ServerError
from ..inference.model import ModelVersion
from .genmetrics import generation_families
from .metricsconfig import MetricsConfig
from .prometheus_text import render_text
from .quantiles import NOT_OBSERVED, Buckets, LatencyWindow
from .resources import ResourceSampler
from .scrape import (
    BATCH_BUCKETS,
    FIRST_RESPONSE_BUCKETS_MS,
    LATENCY_BUCKETS_US,
    ModelSeries,
    cache_families,
    cache_summary_families,
    histogram_families,
    resource_families,
    scheduler_families,
    summary_families,
    triton_families,
)
from .statistics import ModelStats, StatisticsCollector

log = logging.getLogger(__name__)


class ServerMetrics:
    """The metrics of one server: an `InferObserver`, and the collector behind /metrics."""

    def __init__(
        self,
        stats: StatisticsCollector,
        config: MetricsConfig | None = None,
        sampler: ResourceSampler | None = None,
        devices: bool = True,
    ) -> None:
        self.config = config or MetricsConfig()
        self.stats = stats
        self.sampler = sampler
        self.devices = devices
        self._series: dict[int, ModelSeries] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        stats.on_record_added.append(self._model_added)
        stats.on_record_removed.append(self._model_removed)

    # --- hot path (on the loop) ----------------------------------------------------------

    def _model_added(self, record: ModelStats) -> None:
        config = self.config
        window = cache = None
        if config.summary_latencies:
            window = LatencyWindow(config.summary_max_age_s)
            if record.model.config.response_cache.enable:
                cache = LatencyWindow(config.summary_max_age_s)
        latency = batch = first = None
        if config.histogram_latencies:
            latency = Buckets([b * 1000 for b in LATENCY_BUCKETS_US])  # observed in ns
            batch = Buckets(BATCH_BUCKETS)
            first = Buckets(FIRST_RESPONSE_BUCKETS_MS)
        self._series[id(record.model)] = ModelSeries(window, latency, batch, first, cache)

    def _model_removed(self, record: ModelStats) -> None:
        self._series.pop(id(record.model), None)

    def request_done(
        self,
        model: ModelVersion,
        item: WorkItem | None,
        error: ServerError | None,
        started_ns: int,
        finished_ns: int,
    ) -> None:
        series = self._series.get(id(model))
        if series is None or item is None:
            return
        timings = item.timings
        if timings.first_in_batch and series.batch is not None:
            series.batch.observe(timings.batch_size)
        duration = finished_ns - started_ns
        # A model that answers once answers as the request ends, an error too (Triton
        # observes any response it sends); a decoupled one's is told at its first.
        if series.first is not None and not model.decoupled:
            series.first.observe(duration // 1_000_000)
        if error is not None:
            return
        if series.window is not None:
            series.window.observe(
                (
                    duration,
                    timings.queue_ns,
                    timings.compute_input_ns,
                    timings.compute_infer_ns,
                    timings.compute_output_ns,
                ),
                finished_ns,
            )
        if series.latency is not None:
            series.latency.observe(duration)

    def cache_hit(
        self, model: ModelVersion, queue_ns: int, lookup_ns: int, started_ns: int, finished_ns: int
    ) -> None:
        """A hit was queued but never computed: its compute columns stay unobserved (the
        window's NOT_OBSERVED), as Triton's UpdateSuccessCacheHit observes no compute
        summary (core infer_stats.cc)."""
        series = self._series.get(id(model))
        if series is None:
            return
        duration = finished_ns - started_ns
        skipped = NOT_OBSERVED
        if series.window is not None:
            series.window.observe((duration, queue_ns, skipped, skipped, skipped), finished_ns)
        if series.cache is not None:
            series.cache.observe((lookup_ns, skipped), finished_ns)
        if series.latency is not None:
            series.latency.observe(duration)
        if series.first is not None:
            series.first.observe(duration // 1_000_000)

    def cache_miss(self, model: ModelVersion, ns: int) -> None:
        """A miss's lookup and insert (Triton's cache_miss summary)."""
        series = self._series.get(id(model))
        if series is not None and series.cache is not None:
            series.cache.observe((NOT_OBSERVED, ns), time.monotonic_ns())

    def first_response(self, model: ModelVersion, started_ns: int) -> None:
        """A decoupled request's first response (or error, or bare final flag) goes out
        now; told only while histograms are on."""
        series = self._series.get(id(model))
        if series is not None and series.first is not None:
            series.first.observe((time.monotonic_ns() - started_ns) // 1_000_000)

    # --- scrape ----------------------------------------------------------------------------

    def render(self) -> bytes:
        started = time.perf_counter()
        body = render_text(self.registry.collect())
        log.debug(
            "metrics rendered: %d bytes in %.2f ms",
            len(body),
            (time.perf_counter() - started) * 1e3,
        )
        return body

    def collect(self) -> Iterator[Metric]:
        records = self.stats.records()
        live = {id(r.model) for r in records}
        for key in [key for key in self._series if key not in live]:
            del self._series[key]
        config = self.config
        yield from triton_families(records, config.counter_latencies)
        yield from cache_families(records)
        if config.summary_latencies:
            yield from summary_families(records, self._series, config.summary_quantiles)
            yield from cache_summary_families(records, self._series, config.summary_quantiles)
        if config.histogram_latencies:
            yield from histogram_families(records, self._series)
        yield from scheduler_families(records)
        yield from generation_families(records)
        yield from resource_families(self.sampler, self.devices)
