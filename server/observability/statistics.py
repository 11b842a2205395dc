"""Triton's statistics extension: cumulative per-model-version counts and durations.

Always on: perf_analyzer reads these for its server-side breakdown. Everything here runs on
the event loop (requests finish there), so plain integers need no locks. The metrics
endpoint reads the same records, so statistics and metrics can never disagree.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ge_serve.scheduler.work import Timings, WorkItem

from ..errors import ErrorCode, FailureReason, ServerError, bad_version_string
from ..inference.error_texts import stats_model_unavailable, stats_version_unavailable
from ..inference.model import ModelVersion
from ..inference.reports import BatchStatistics, InferStatistics, ModelStatistics, StatisticDuration
from ..models.lifecycle import ModelLifecycle
from ..models.repository import parse_version

# Triton's own wording; a scheduler that builds the error itself may not tag it.
_REJECTED_MESSAGES = ("Request timeout expired",)
_QUEUE_FULL = "Exceeds maximum queue size"


def failure_reason(error: ServerError) -> FailureReason | None:
    """The reason a failed request is counted under; None for one its scheduler refused
    before taking it, which, as in Triton, is not the model's failure to count.

    Triton counts a failure only for a request its scheduler holds (each RespondIfError
    and ReportStatistics of core src/infer_request.cc): one refused by the checks of
    PrepareForInference, or by a full queue (PriorityQueue::Enqueue), gets its error back
    from TRITONSERVER_ServerInferAsync with nothing counted. Here those are the client's
    request refused as sent (an untagged INVALID_ARG: validation.py, a scheduler's
    submit) and a full queue. REJECTED is a request that timed out in the queue.
    """
    if error.reason is not None:
        return error.reason
    if error.code is ErrorCode.INVALID_ARG or error.message.startswith(_QUEUE_FULL):
        return None
    if error.code is ErrorCode.CANCELLED:
        return FailureReason.CANCELED
    if error.message.startswith(_REJECTED_MESSAGES):
        return FailureReason.REJECTED
    if error.code is ErrorCode.INTERNAL:
        # What the scheduler passes on from a failed execution; the core tags its own
        # internal errors explicitly.
        return FailureReason.BACKEND
    return FailureReason.OTHER


@dataclass(slots=True)
class BatchStats:
    """Executions of one batch size and their cumulative compute durations."""

    count: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0


@dataclass(slots=True)
class ModelStats:
    """Everything counted for one loaded model version since it loaded."""

    model: ModelVersion
    load_seconds: float = 0.0
    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    # Summed over successful requests; each request of a batch counts the batch's time.
    # A cache hit adds its queue time (until its lookup began), and no compute time.
    queue_ns: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    # Response cache: hits (lookup time) and misses (lookup and insert time).
    cache_hit_count: int = 0
    cache_hit_ns: int = 0
    cache_miss_count: int = 0
    cache_miss_ns: int = 0
    failures: dict[FailureReason, int] = field(
        default_factory=lambda: dict.fromkeys(FailureReason, 0)
    )
    batches: dict[int, BatchStats] = field(default_factory=dict)

    def add_execution(self, timings: Timings) -> None:
        self.execution_count += 1
        self.last_inference_ms = time.time_ns() // 1_000_000
        batch = self.batches.get(timings.batch_size)
        if batch is None:
            batch = self.batches[timings.batch_size] = BatchStats()
        batch.count += 1
        batch.input_ns += timings.compute_input_ns
        batch.infer_ns += timings.compute_infer_ns
        batch.output_ns += timings.compute_output_ns

    def snapshot(self) -> ModelStatistics:
        """The counts so far, as the statistics extension reports them."""
        successes = self.success_count
        # As Triton's (core tritonserver.cc, TRITONSERVER_ServerModelStatistics): every
        # success was queued, cache hits included; only the others were computed.
        executed = successes - self.cache_hit_count
        return ModelStatistics(
            name=self.model.name,
            version=self.model.version,
            last_inference=self.last_inference_ms,
            inference_count=self.inference_count,
            execution_count=self.execution_count,
            inference_stats=InferStatistics(
                success=StatisticDuration(successes, self.success_ns),
                fail=StatisticDuration(self.fail_count, self.fail_ns),
                queue=StatisticDuration(successes, self.queue_ns),
                compute_input=StatisticDuration(executed, self.input_ns),
                compute_infer=StatisticDuration(executed, self.infer_ns),
                compute_output=StatisticDuration(executed, self.output_ns),
                cache_hit=StatisticDuration(self.cache_hit_count, self.cache_hit_ns),
                cache_miss=StatisticDuration(self.cache_miss_count, self.cache_miss_ns),
            ),
            batch_stats=tuple(
                BatchStatistics(
                    batch_size=size,
                    compute_input=StatisticDuration(batch.count, batch.input_ns),
                    compute_infer=StatisticDuration(batch.count, batch.infer_ns),
                    compute_output=StatisticDuration(batch.count, batch.output_ns),
                )
                for size, batch in sorted(self.batches.items())
            ),
        )


class StatisticsCollector:
    """The statistics of every loaded model version; an `InferObserver` of the core."""

    def __init__(self, lifecycle: ModelLifecycle) -> None:
        self._lifecycle = lifecycle
        # Keyed by id(): ModelVersion is unhashable. The record holds the model, so an id
        # cannot be reused while its record exists.
        self._records: dict[int, ModelStats] = {}
        # Told about each new record (metrics attach their own per-model recorders).
        self.on_record_added: list[Callable[[ModelStats], None]] = []
        # Told when a record is dropped, so per-record state elsewhere goes with it.
        self.on_record_removed: list[Callable[[ModelStats], None]] = []
        lifecycle.on_loaded.append(self.model_loaded)
        lifecycle.on_retired.append(self.model_retired)

    def model_loaded(self, model: ModelVersion, seconds: float) -> None:
        record = ModelStats(model, load_seconds=seconds)
        self._records[id(model)] = record
        for callback in self.on_record_added:
            callback(record)

    def model_retired(self, model: ModelVersion) -> None:
        """Drop a version's record once it has stopped serving. The record holds the
        version, and with it the scheduler and the executors: kept, every reload would
        leave the replaced version in memory."""
        self._drop(id(model))

    def _drop(self, key: int) -> None:
        record = self._records.pop(key, None)
        if record is not None:
            for callback in self.on_record_removed:
                callback(record)

    def request_done(
        self,
        model: ModelVersion,
        item: WorkItem | None,
        error: ServerError | None,
        started_ns: int,
        finished_ns: int,
    ) -> None:
        stats = self._records.get(id(model))
        if stats is None or item is None:
            # No work item: refused by the checks before any scheduler (validation.py),
            # as Triton's PrepareForInference refuses it, uncounted (`failure_reason`).
            return
        timings = item.timings
        if timings.first_in_batch:
            stats.add_execution(timings)
        if error is None:
            stats.success_count += 1
            stats.success_ns += finished_ns - started_ns
            stats.inference_count += item.batch_size
            stats.queue_ns += timings.queue_ns
            stats.input_ns += timings.compute_input_ns
            stats.infer_ns += timings.compute_infer_ns
            stats.output_ns += timings.compute_output_ns
            return
        reason = failure_reason(error)
        if reason is None:
            return
        stats.fail_count += 1
        stats.fail_ns += finished_ns - started_ns
        stats.failures[reason] += 1

    def cache_hit(
        self, model: ModelVersion, queue_ns: int, lookup_ns: int, started_ns: int, finished_ns: int
    ) -> None:
        """A request answered from the response cache: a success and its queue time, but
        no inference (core infer_stats.cc, UpdateSuccessCacheHit)."""
        stats = self._records.get(id(model))
        if stats is not None:
            stats.success_count += 1
            stats.success_ns += finished_ns - started_ns
            stats.queue_ns += queue_ns
            stats.cache_hit_count += 1
            stats.cache_hit_ns += lookup_ns
            stats.last_inference_ms = time.time_ns() // 1_000_000

    def cache_miss(self, model: ModelVersion, ns: int) -> None:
        stats = self._records.get(id(model))
        if stats is not None:
            stats.cache_miss_count += 1
            stats.cache_miss_ns += ns

    def records(self) -> list[ModelStats]:
        """The records of the versions that serve now, by name then version.

        Records of versions that no longer serve are dropped here, as Triton drops an
        unloaded model's statistics.
        """
        live = {id(model): model for model in self._lifecycle.ready_models()}
        for key in [key for key in self._records if key not in live]:
            self._drop(key)
        found = [self._records[key] for key in live if key in self._records]
        return sorted(found, key=lambda r: (r.model.name, r.model.version))

    def statistics(self, name: str = "", version: str = "") -> tuple[ModelStatistics, ...]:
        """Every model's, one model's ready versions', or one version's statistics."""
        records = self.records()
        if name:
            # Triton's order and answers (core tritonserver.cc,
            # TRITONSERVER_ServerModelStatistics): the version string is read first, then
            # a model with no ready version, known or not, and a version that is not ready
            # are both the client's mistake (INVALID_ARG), not NOT_FOUND.
            number = None
            if version:
                unreadable = bad_version_string(version)
                if unreadable is not None:
                    raise unreadable
                number = parse_version(version)
            self._lifecycle.resolve(name)  # raises where several namespaces hold the name
            records = [r for r in records if r.model.name == name]
            if not records:
                raise stats_model_unavailable(name)
            if version:
                records = [r for r in records if r.model.version == number]
                if not records:
                    raise stats_version_unavailable(name)
        elif version:
            # Every model's statistics, whatever the version, as Triton answers (its gRPC
            # handler still reads the version string first).
            unreadable = bad_version_string(version)
            if unreadable is not None:
                raise unreadable
        return tuple(record.snapshot() for record in records)
