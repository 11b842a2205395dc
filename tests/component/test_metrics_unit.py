"""Metrics and statistics pieces in-process: recorders, config, exposition, failure reasons,
and the provider protocols that the scheduler and the GE backend implement."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import math
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from polling import poll
from prometheus_client import CollectorRegistry, Counter
from promtext import parse
from serverproc import EXAMPLE_MODELS

from ge_serve.backends.base import Executor, LoadedModel
from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.direct import DirectScheduler
from ge_serve.scheduler.dispatch import ExecutorSlot, SlotPool
from ge_serve.scheduler.work import Array, WorkItem
from ge_serve.server.app import make_scheduler
from ge_serve.server.control.logsettings import LogControl
from ge_serve.server.errors import ErrorCode, FailureReason, ServerError, queue_full
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.reports import ModelStatistics
from ge_serve.server.inference.types import DataType, InferRequest, Tensor
from ge_serve.server.models.lifecycle import LifecycleSettings, ModelLifecycle, SchedulerFactory
from ge_serve.server.models.repository import ModelRepository
from ge_serve.server.observability.metrics import ServerMetrics
from ge_serve.server.observability.metricsconfig import MetricsConfig
from ge_serve.server.observability.prometheus_text import render_text
from ge_serve.server.observability.quantiles import NOT_OBSERVED, Buckets, LatencyWindow
from ge_serve.server.observability.resources import ResourceSampler
from ge_serve.server.observability.statistics import failure_reason

pytestmark = pytest.mark.timeout(60)

SECOND = 1_000_000_000

# --- recorders ---------------------------------------------------------------------------


def test_window_quantiles_match_numpy() -> None:
    window = LatencyWindow(max_age_s=60)
    rows = [(v, 2 * v) for v in range(1, 101)]
    for row in rows:
        window.observe(row, 5 * SECOND)
    got = window.quantiles([0.5, 0.99], 5 * SECOND)
    assert got is not None
    expected = np.quantile(np.array(rows, dtype=float), [0.5, 0.99], axis=0)
    np.testing.assert_allclose(got, expected)


def test_window_forgets_old_requests() -> None:
    window = LatencyWindow(max_age_s=10, slots=5)
    window.observe((100,), 0)
    window.observe((7,), 9 * SECOND)
    assert window.quantiles([0.5], 9 * SECOND) == [[53.5]]
    # 10 s after the first: its slot has aged out, the second is still in the window.
    assert window.quantiles([0.5], 10 * SECOND) == [[7.0]]
    assert window.quantiles([0.5], 30 * SECOND) is None
    window.observe((1,), 31 * SECOND)  # reusing a ring slot clears what it held
    assert window.quantiles([0.5], 31 * SECOND) == [[1.0]]


def test_window_leaves_out_what_a_request_did_not_observe() -> None:
    # A cache hit is queued but never computed: its compute column is NOT_OBSERVED.
    window = LatencyWindow(max_age_s=60)
    window.observe((10, 4, NOT_OBSERVED), SECOND)
    assert window.quantiles([0.5], SECOND) == [[10.0, 4.0, pytest.approx(math.nan, nan_ok=True)]]
    window.observe((30, 6, 8), SECOND)
    assert window.quantiles([0.5], SECOND) == [[20.0, 5.0, 8.0]]


def test_window_stays_bounded_and_uniform() -> None:
    window = LatencyWindow(max_age_s=60, slots=1, capacity=500)
    for value in range(100_000):
        window.observe((value,), SECOND)
    got = window.quantiles([0.1, 0.5, 0.9], SECOND)
    assert got is not None
    # A uniform sample of 0..99999 (fixed seed): quantiles within 5% of the true ones.
    for (quantile,), true in zip(got, (10_000, 50_000, 90_000), strict=True):
        assert abs(quantile - true) < 5_000
    # A slot without rows has none allocated.
    assert sum(len(slot.rows) for slot in window._ring if slot.rows is not None) == 500


def test_buckets_are_le_and_cumulative() -> None:
    buckets = Buckets([1, 2, 4])
    for value in (1, 1, 2, 3, 4, 9):
        buckets.observe(value)
    assert buckets.cumulative() == [2, 3, 5, 6]
    assert buckets.total == 20


# --- config and exposition ------------------------------------------------------------------


def test_metrics_config() -> None:
    assert MetricsConfig.parse([]) == MetricsConfig()
    assert MetricsConfig().summary_latencies is True
    config = MetricsConfig.parse(
        [("summary_latencies", "false"), ("summary_quantiles", "0.99:0.001,0.5:0.05")]
    )
    assert config.summary_latencies is False
    assert config.summary_quantiles == (0.5, 0.99)
    for pairs, message in (
        ([("nonsense", "1")], "unknown key 'nonsense'"),
        ([("counter_latencies", "maybe")], "expected true or false"),
        ([("summary_quantiles", "1.5:0.1")], "quantiles in"),
        ([("summary_max_age_secs", "0")], "seconds > 0"),
        ([("summary_max_age_secs", "inf")], "finite seconds"),
    ):
        with pytest.raises(ValueError, match=message):
            MetricsConfig.parse(pairs)


def test_exposition_keeps_triton_counter_names() -> None:
    from prometheus_client.metrics_core import Metric

    family = Metric("nv_inference_count", "Number of inferences", "counter")
    family.add_sample("nv_inference_count", {"model": 'a"b\\c', "version": "1"}, 3)
    text = render_text([family]).decode()
    assert text == (
        "# HELP nv_inference_count Number of inferences\n"
        "# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="a\\"b\\\\c",version="1"} 3.0\n'
    )
    # A prometheus_client Counter keeps its conventional _total name.
    registry = CollectorRegistry()
    Counter("things", "Things", registry=registry).inc(2)
    exposition = parse(render_text(registry.collect()).decode())
    assert exposition.types == {"things_total": "counter"}
    assert exposition.value("things_total") == 2


def test_failure_reasons() -> None:
    # Refused before a scheduler took the request: not counted (None), as in Triton.
    assert failure_reason(queue_full()) is None
    assert failure_reason(ServerError(ErrorCode.INVALID_ARG, "bad")) is None
    untagged = ServerError(ErrorCode.UNAVAILABLE, "Request timeout expired")
    assert failure_reason(untagged) is FailureReason.REJECTED
    assert failure_reason(ServerError(ErrorCode.CANCELLED, "gone")) is FailureReason.CANCELED
    shape = ServerError(ErrorCode.INVALID_ARG, "the model cannot run it", FailureReason.OTHER)
    assert failure_reason(shape) is FailureReason.OTHER
    assert failure_reason(ServerError(ErrorCode.UNAVAILABLE, "gone away")) is FailureReason.OTHER
    # The scheduler passes a failed execution on as an INTERNAL error.
    passed_on = ServerError(ErrorCode.INTERNAL, "InvalidArgument: indices out of bounds")
    assert failure_reason(passed_on) is FailureReason.BACKEND
    core_bug = ServerError(ErrorCode.INTERNAL, "KeyError: 'x'", FailureReason.OTHER)
    assert failure_reason(core_bug) is FailureReason.OTHER
    tagged = ServerError(ErrorCode.INTERNAL, "boom", FailureReason.BACKEND)
    assert failure_reason(tagged) is FailureReason.BACKEND


# --- logging extension ---------------------------------------------------------------------


def test_log_control_filters_by_setting() -> None:
    stream = io.StringIO()
    control = LogControl()
    root = logging.getLogger()
    old_level, old_handlers = root.level, list(root.handlers)
    try:
        control.install(stream)
        logger = logging.getLogger("ge_serve.test")
        logger.info("info one")
        logger.debug("debug one")
        control.update({"log_info": False, "log_verbose_level": 2})
        logger.info("info two")
        logger.debug("debug two")
        control.update({"log_warning": False, "log_error": False})
        logger.warning("warning one")
        logger.error("error one")
        control.update({"log_error": True})
        logger.error("error two")
    finally:
        if control._handler is not None:
            root.removeHandler(control._handler)
        root.setLevel(old_level)
        assert root.handlers == old_handlers
    lines = stream.getvalue()
    for present in ("info one", "debug two", "error two"):
        assert present in lines
    for absent in ("debug one", "info two", "warning one", "error one"):
        assert absent not in lines
    with pytest.raises(ServerError, match="unsigned integer"):
        control.update({"log_verbose_level": -1})
    with pytest.raises(ServerError, match="unknown log setting 'log_colour'"):
        control.update({"log_colour": True})


# --- the core: failure reasons for cancelled and rejected requests ---------------------------


class GatedExecutor:
    """Holds each execution until the test lets it run."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.slot = inner.slot
        self.entered = threading.Event()
        self.release = threading.Event()

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.entered.set()
        self.release.wait(10)
        return self.inner.execute(inputs)

    def close(self) -> None:
        self.inner.close()


class RefusingScheduler:
    """Refuses everything the way a full queue does."""

    def __init__(self, error: ServerError) -> None:
        self.error = error

    async def submit(self, item: WorkItem) -> dict[str, Array]:
        raise self.error

    @property
    def pending(self) -> int:
        return 0

    async def close(self, drain_timeout_s: float) -> None:
        return None


@dataclass(frozen=True)
class Controller:
    window_us: float
    target_batch_size: int


class ObservableScheduler(DirectScheduler):
    """A scheduler that also exposes what the metrics read from schedulers."""

    controller = Controller(250.0, 8)

    def queue_depths(self) -> Mapping[int, int]:
        return {1: 0, 2: 3}


@contextlib.asynccontextmanager
async def serving(
    factory: SchedulerFactory, sampler: ResourceSampler | None = None
) -> AsyncIterator[tuple[InferenceServer, ServerMetrics]]:
    """`simple` loaded in-process, with metrics observing the core as the server wires them."""
    lifecycle = ModelLifecycle(
        ModelRepository([EXAMPLE_MODELS]),
        {"onnxruntime": OnnxRuntimeBackend()},
        factory,
        LifecycleSettings(unload_timeout_s=5),
    )
    core = InferenceServer(lifecycle)
    metrics = ServerMetrics(core.stats, sampler=sampler)
    core.observers.append(metrics)
    await lifecycle.load("simple")
    try:
        yield core, metrics
    finally:
        await lifecycle.close()


def _request() -> InferRequest:
    data = np.ones((1, 16), dtype=np.int32)
    return InferRequest(
        "simple",
        inputs=[
            Tensor("INPUT0", DataType.INT32, (1, 16), data),
            Tensor("INPUT1", DataType.INT32, (1, 16), data),
        ],
    )


def _stats(core: InferenceServer) -> ModelStatistics:
    (stats,) = core.statistics("simple")
    return stats


async def test_cancelled_request_counts_as_canceled() -> None:
    gates: list[GatedExecutor] = []

    def factory(config: model_config_pb2.ModelConfig, loaded: LoadedModel) -> DirectScheduler:
        gates.extend(GatedExecutor(e) for e in loaded.executors)
        return DirectScheduler(SlotPool([ExecutorSlot(g) for g in gates]), batching=True)

    async with serving(factory) as (core, metrics):
        task = asyncio.create_task(core.infer(_request()))
        await asyncio.to_thread(gates[0].entered.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gates[0].release.set()
        await core.infer(_request())
        stats = _stats(core)
        assert stats.inference_stats.fail.count == 1
        assert stats.inference_stats.success.count == 1
        exposition = parse(metrics.render().decode())
        at = {"model": "simple", "version": "1"}
        assert exposition.value("nv_inference_request_failure", **at, reason="CANCELED") == 1
        assert exposition.value("nv_inference_request_success", **at) == 1
        assert exposition.value("nv_model_load_duration_secs", **at) > 0


async def test_pending_counts_only_requests_waiting_for_a_slot() -> None:
    """Triton's pending count ends when a request starts executing (core infer_request.cc,
    SetState EXECUTING): with one slot, one executing and two waiting read 2."""
    gates: list[GatedExecutor] = []

    def factory(config: model_config_pb2.ModelConfig, loaded: LoadedModel) -> DirectScheduler:
        gates.append(GatedExecutor(loaded.executors[0]))
        return DirectScheduler(SlotPool([ExecutorSlot(gates[0])]), batching=True)

    async with serving(factory) as (core, metrics):
        at = {"model": "simple", "version": "1"}
        tasks = [asyncio.create_task(core.infer(_request())) for _ in range(3)]
        try:
            await asyncio.to_thread(gates[0].entered.wait, 10)
            for _ in range(10):
                await asyncio.sleep(0)  # the other two reach the slot's queue
            exposition = parse(metrics.render().decode())
            assert exposition.value("nv_inference_pending_request_count", **at) == 2
        finally:
            gates[0].release.set()
            await asyncio.gather(*tasks)
        exposition = parse(metrics.render().decode())
        assert exposition.value("nv_inference_pending_request_count", **at) == 0


async def test_timed_out_request_counts_as_rejected() -> None:
    error = ServerError(ErrorCode.UNAVAILABLE, "Request timeout expired")  # untagged
    async with serving(lambda config, loaded: RefusingScheduler(error)) as (core, metrics):
        with pytest.raises(ServerError, match=error.message):
            await core.infer(_request())
        exposition = parse(metrics.render().decode())
        at = {"model": "simple", "version": "1"}
        assert exposition.value("nv_inference_request_failure", **at, reason="REJECTED") == 1
        assert exposition.value("nv_inference_request_failure", **at, reason="OTHER") == 0
        assert _stats(core).execution_count == 0


def _bad_requests() -> list[InferRequest]:
    """Requests `simple` (max_batch_size 8, two INT32 [16] inputs) refuses as sent."""
    wrong_shape, too_big, unknown, wrong_type = (_request() for _ in range(4))
    narrow = np.ones((1, 5), dtype=np.int32)
    wrong_shape.inputs[0] = Tensor("INPUT0", DataType.INT32, (1, 5), narrow)
    nine = np.ones((9, 16), dtype=np.int32)
    too_big.inputs = [Tensor(name, DataType.INT32, (9, 16), nine) for name in ("INPUT0", "INPUT1")]
    unknown.inputs[1] = Tensor("NOPE", DataType.INT32, (1, 16), np.ones((1, 16), np.int32))
    floats = np.ones((1, 16), dtype=np.float32)
    wrong_type.inputs[0] = Tensor("INPUT0", DataType.FP32, (1, 16), floats)
    return [wrong_shape, too_big, unknown, wrong_type]


@pytest.mark.parametrize("refusal", ["checks", "full queue"])
async def test_refused_requests_are_not_counted_as_failures(refusal: str) -> None:
    """Triton counts a failure only for a request its scheduler took: one refused by its
    checks (PrepareForInference) or by a full queue gets its error and nothing counted."""
    checks = refusal == "checks"
    requests = _bad_requests() if checks else [_request()]
    code = ErrorCode.INVALID_ARG if checks else ErrorCode.UNAVAILABLE
    full = RefusingScheduler(queue_full())
    async with serving(make_scheduler if checks else lambda c, m: full) as (core, metrics):
        for request in requests:
            with pytest.raises(ServerError) as refused:
                await core.infer(request)
            assert refused.value.code is code
        stats = _stats(core)
        assert stats.inference_stats.fail.count == 0
        assert stats.inference_stats.success.count == 0
        exposition = parse(metrics.render().decode())
        at = {"model": "simple", "version": "1"}
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
            assert exposition.value("nv_inference_request_failure", **at, reason=reason) == 0


# --- providers: scheduler queues and controller, devices -------------------------------------


async def test_scheduler_providers_are_read_at_scrape_time() -> None:
    def factory(config: model_config_pb2.ModelConfig, loaded: LoadedModel) -> DirectScheduler:
        pool = SlotPool([ExecutorSlot(e) for e in loaded.executors])
        return ObservableScheduler(pool, batching=True)

    async with serving(factory) as (_, metrics):
        exposition = parse(metrics.render().decode())
        at = {"model": "simple", "version": "1"}
        assert exposition.value("ge_serve_queue_depth", **at, priority="2") == 3
        assert exposition.value("ge_serve_queue_depth", **at, priority="1") == 0
        # Pending = queued, summed over the levels, when the scheduler says what is queued.
        assert exposition.value("nv_inference_pending_request_count", **at) == 3
        assert exposition.value("ge_serve_batch_window_us", **at) == 250
        assert exposition.value("ge_serve_target_batch_size", **at) == 8


@dataclass(frozen=True)
class SimDeviceStats:
    device: str
    utilization: float
    memory_used_bytes: int
    memory_total_bytes: int
    pool_bytes: int


class FakeDevices:
    def __init__(self) -> None:
        self.calls = 0

    def device_metrics(self) -> Sequence[SimDeviceStats]:
        self.calls += 1
        return [
            SimDeviceStats("sim0", 0.25, 3 << 20, 16 << 30, 1 << 20),
            SimDeviceStats("sim1", -1.0, 0, 16 << 30, 0),  # utilization unknown
        ]


class BrokenDevices:
    def device_metrics(self) -> Sequence[SimDeviceStats]:
        raise RuntimeError("driver went away")


async def test_device_metrics_from_providers() -> None:
    devices = FakeDevices()
    sampler = ResourceSampler(0.01, cpu=False, providers=[BrokenDevices(), devices])
    refusing: SchedulerFactory = lambda config, loaded: RefusingScheduler(queue_full())  # noqa: E731
    async with serving(refusing, sampler) as (_, metrics):
        sampler.start()
        try:
            await asyncio.to_thread(poll, lambda: devices.calls >= 2, 10, "two device samples")
        finally:
            await asyncio.to_thread(sampler.stop)
        exposition = parse(metrics.render().decode())
        assert exposition.value("ge_serve_device_utilization", device="sim0") == 0.25
        assert exposition.value("ge_serve_device_memory_used_bytes", device="sim0") == 3 << 20
        assert exposition.value("ge_serve_device_memory_total_bytes", device="sim1") == 16 << 30
        assert not exposition.find("ge_serve_device_utilization", device="sim1")
        assert exposition.value("ge_serve_device_pool_bytes", device="sim0") == 1 << 20
        assert not exposition.find("nv_cpu_utilization")  # cpu=False
