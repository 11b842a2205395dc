"""The in-process API, `InferenceServer`, on the example models: no network at all."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest
from serverproc import EXAMPLE_MODELS

from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.backends.python.host.calls import CoreCall, CoreResponse
from ge_serve.server.app import make_scheduler
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.inference.bls import CoreBridge
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.reports import (
    ModelState,
    RepositoryEntry,
    StatisticDuration,
    TensorMetadata,
)
from ge_serve.server.inference.types import (
    DataType,
    InferRequest,
    RequestedOutput,
    SharedMemoryRef,
    Tensor,
)
from ge_serve.server.models.lifecycle import LifecycleSettings, ModelLifecycle
from ge_serve.server.models.repository import ModelRepository
from ge_serve.server.observability.metrics import ServerMetrics
from ge_serve.server.observability.traceconfig import TraceSettings
from ge_serve.server.observability.tracing import TraceControl


@pytest.fixture
async def server() -> AsyncIterator[InferenceServer]:
    lifecycle = ModelLifecycle(
        ModelRepository([EXAMPLE_MODELS]),
        {"onnxruntime": OnnxRuntimeBackend()},
        make_scheduler,
        LifecycleSettings(),
    )
    # Built first, as the composition root does: statistics count the versions loaded
    # after the server exists.
    server = InferenceServer(lifecycle)
    assert await lifecycle.load_many(["simple", "simple_string", "image_classifier"]) == {}
    try:
        yield server
    finally:
        await lifecycle.close()


def simple_request(batch: int = 1) -> InferRequest:
    a = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    b = np.full((batch, 16), 3, dtype=np.int32)
    return InferRequest(
        "simple",
        inputs=[
            Tensor("INPUT0", DataType.INT32, a.shape, a),
            Tensor("INPUT1", DataType.INT32, b.shape, b),
        ],
    )


async def test_infer(server: InferenceServer) -> None:
    request = simple_request(2)
    request.id = "in-process"
    response = await server.infer(request)
    assert (response.model_name, response.model_version, response.id) == (
        "simple", "1", "in-process",
    )  # fmt: skip
    outputs = {t.name: t for t in response.outputs}
    a = request.inputs[0].data
    np.testing.assert_array_equal(outputs["OUTPUT0"].data, a + 3)
    np.testing.assert_array_equal(outputs["OUTPUT1"].data, a - 3)
    assert outputs["OUTPUT0"].shape == (2, 16)
    assert outputs["OUTPUT0"].datatype is DataType.INT32


async def test_infer_bytes_and_classification(server: InferenceServer) -> None:
    strings = np.array([[str(i).encode() for i in range(16)]], dtype=object)
    request = InferRequest(
        "simple_string",
        inputs=[
            Tensor("INPUT0", DataType.BYTES, (1, 16), strings),
            Tensor("INPUT1", DataType.BYTES, (1, 16), strings),
        ],
        outputs=[RequestedOutput("OUTPUT0")],
    )
    (out,) = (await server.infer(request)).outputs
    assert out.data.tolist() == [[str(2 * i).encode() for i in range(16)]]

    image = np.zeros((1, 3, 64, 64), np.float32)
    request = InferRequest(
        "image_classifier",
        inputs=[Tensor("image", DataType.FP32, image.shape, image)],
        outputs=[RequestedOutput("probabilities", classification=2)],
    )
    (top,) = (await server.infer(request)).outputs
    assert top.datatype is DataType.BYTES and top.shape == (1, 2)
    labels = (EXAMPLE_MODELS / "image_classifier" / "labels.txt").read_text().splitlines()
    for entry in top.data[0]:
        _, index, label = entry.decode().split(":")
        assert labels[int(index)] == label


async def test_health_and_metadata(server: InferenceServer) -> None:
    assert server.live() and server.ready()
    assert server.model_ready("simple") and server.model_ready("simple", "1")
    assert not server.model_ready("simple", "2") and not server.model_ready("nope")
    metadata = server.metadata()
    assert metadata.name == "triton" and "binary_tensor_data" in metadata.extensions
    # Triton names the sequence batcher's extension; clients check for it.
    assert "sequence" in metadata.extensions
    model = server.model_metadata("simple_string")
    assert (model.name, model.versions, model.platform) == (
        "simple_string",
        (1,),
        "onnxruntime_onnx",
    )
    assert model.inputs[0] == TensorMetadata("INPUT0", DataType.BYTES, (-1, 16))
    config = server.model_config("image_classifier")
    assert config.output[0].label_filename == "labels.txt"
    # With the defaults Triton's core fills in (its NormalizeModelConfig).
    assert list(config.dynamic_batching.preferred_batch_size) == [config.max_batch_size]
    config = server.model_config("simple")
    assert config.version_policy.latest.num_versions == 1
    # Its config lists inputs and outputs: auto-complete adds no dynamic_batching.
    assert not config.HasField("dynamic_batching")
    assert config.optimization.input_pinned_memory.enable
    assert config.optimization.output_pinned_memory.enable


async def test_statistics_and_repository_index(server: InferenceServer) -> None:
    await server.infer(simple_request(2))
    (stats,) = server.statistics("simple", "1")
    assert (stats.name, stats.version, stats.inference_count, stats.execution_count) == (
        "simple", 1, 2, 1,
    )  # fmt: skip
    success = stats.inference_stats.success
    assert success.count == 1 and success.ns > 0
    assert stats.inference_stats.fail == StatisticDuration(0, 0)
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(2, 1)]
    assert [s.name for s in server.statistics()] == ["image_classifier", "simple", "simple_string"]
    names = ["image_classifier", "simple", "simple_string"]
    expected = [RepositoryEntry(name, 1, ModelState.READY) for name in names]
    assert await server.repository_index() == expected
    assert await server.repository_index(ready_only=True) == expected


async def test_statistics_of_a_model_not_available(server: InferenceServer) -> None:
    """Triton's answer (core tritonserver.cc, TRITONSERVER_ServerModelStatistics): the
    client asked for what is not there, INVALID_ARG (HTTP 400), for a model unknown or
    unloaded alike, and for a version that does not serve."""
    cases = [
        ("nosuch", "", "requested model 'nosuch' is not available"),
        ("nosuch", "1", "requested model 'nosuch' is not available"),
        ("simple", "7", "requested model version is not available for model 'simple'"),
    ]
    await server.lifecycle.unload("simple_string")
    cases.append(("simple_string", "", "requested model 'simple_string' is not available"))
    cases.append(("simple_string", "1", "requested model 'simple_string' is not available"))
    for name, version, message in cases:
        with pytest.raises(ServerError) as info:
            server.statistics(name, version)
        assert (info.value.code, info.value.message) == (ErrorCode.INVALID_ARG, message)
    # A version string no version can be read from is refused first, as Triton reads it.
    with pytest.raises(ServerError, match="failed to get model version") as info:
        server.statistics("nosuch", "x")
    assert info.value.code is ErrorCode.INVALID_ARG
    assert [s.version for s in server.statistics("simple", "1")] == [1]
    # No model named: every model's statistics, the version left aside, as in Triton.
    assert server.statistics("", "3") == server.statistics("", "")


async def test_errors(server: InferenceServer) -> None:
    with pytest.raises(ServerError) as info:
        await server.infer(InferRequest("nope"))
    assert info.value.code is ErrorCode.NOT_FOUND
    assert info.value.message == "Request for unknown model: 'nope' is not found"
    with pytest.raises(ServerError) as info:
        await server.infer(simple_request(9))
    assert info.value.code is ErrorCode.INVALID_ARG


async def test_stop_accepting(server: InferenceServer) -> None:
    server.stop_accepting()
    assert server.live() and not server.ready()
    with pytest.raises(ServerError) as info:
        await server.infer(simple_request())
    assert info.value.code is ErrorCode.UNAVAILABLE


class Marker:
    pass


async def test_a_reloaded_version_is_freed(server: InferenceServer) -> None:
    """Nothing that serves keeps a replaced version: not the statistics, not the metrics.
    Each reload would otherwise leave the old scheduler and executors in memory."""
    metrics = ServerMetrics(server.stats, devices=False)
    server.observers.append(metrics)
    lifecycle = server.lifecycle
    old = lifecycle.get("simple", "")
    # ModelVersion takes no weak reference; something its loaded model holds does.
    marker = Marker()
    old.loaded.extra["marker"] = marker
    freed = weakref.ref(marker)
    del marker
    await server.infer(simple_request())
    await lifecycle.load("simple")
    assert lifecycle.get("simple", "") is not old, "the load did not reload"
    del old
    await server.infer(simple_request())
    gc.collect()
    assert freed() is None, "the replaced version is still held"
    # The new version is counted from zero, as Triton counts a reloaded model.
    (stats,) = server.statistics("simple")
    assert stats.inference_count == 1


async def settles(condition: Callable[[], bool]) -> bool:
    """Whether `condition` holds within 2 s. The slot's thread lets go of its job just
    after handing the result back, so a check may run a moment before it has; a cycle is
    never freed with the collector off, so a bounded wait cannot hide one."""
    for _ in range(200):
        if condition():
            return True
        await asyncio.sleep(0.01)
    return condition()


@pytest.mark.parametrize("model", ["simple_string", "simple"])
async def test_a_request_that_fails_lets_go_of_its_tensors_with_its_answer(
    server: InferenceServer, model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed request's tensors go when its error is answered, not when the collector
    next runs: a client sending large requests that fail would otherwise pile them up.
    `simple_string` fails in execution (its graph cannot parse the strings: the request's
    data, an INVALID_ARG), `simple` in validation (a batch over its max_batch_size)."""
    if model == "simple_string":
        data = np.array([[b"not a number"] * 16], dtype=object)
        request = InferRequest(
            model,
            inputs=[
                Tensor("INPUT0", DataType.BYTES, data.shape, data),
                Tensor("INPUT1", DataType.BYTES, data.shape, data),
            ],
        )
    else:
        request = simple_request(9)
        data = request.inputs[0].data
    freed = weakref.ref(data)
    del data
    # pytest's log capture keeps each record, and with it the exception that a failed
    # execution logs; a server's handlers write the record and let it go.
    monkeypatch.setattr(logging.getLogger("ge_serve"), "propagate", False)
    gc.disable()
    try:
        with pytest.raises(ServerError) as info:
            await server.infer(request)
        code = info.value.code
        del info, request
        assert await settles(lambda: freed() is None), "the failed request's tensors are held"
    finally:
        gc.enable()
    assert code is ErrorCode.INVALID_ARG


async def test_a_bls_request_that_fails_lets_go_of_its_tensors_with_its_answer(
    server: InferenceServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for a client's request, through the bridge a Python model's BLS calls take."""
    data = np.array([[b"not a number"] * 16], dtype=object)
    call = CoreCall(
        "simple_string", "", "bls", [("INPUT0", "BYTES", data), ("INPUT1", "BYTES", data)], []
    )
    freed = weakref.ref(data)
    del data
    answers: list[CoreResponse | None] = []
    monkeypatch.setattr(logging.getLogger("ge_serve"), "propagate", False)
    gc.disable()
    try:
        bridge = CoreBridge(server, asyncio.get_running_loop())
        bridge.infer(call, lambda response, final: answers.append(response))
        del call
        assert await settles(lambda: bool(answers)), "the BLS request was not answered"
        assert await settles(lambda: freed() is None), "the BLS request's tensors are held"
    finally:
        gc.enable()
    (answer,) = answers
    assert answer is not None and answer.error is not None
    assert answer.error.code == "INVALID_ARG"  # strings the model's graph cannot parse


class KeptTraces:
    def __init__(self) -> None:
        self.open = 0
        self.done: list[object] = []

    def started(self, trace: object) -> None:
        self.open += 1

    def finished(self, trace: object) -> None:
        self.open -= 1
        self.done.append(trace)

    def close(self) -> None:
        pass


async def test_a_traced_request_refused_before_it_runs_still_ends_its_trace() -> None:
    lifecycle = ModelLifecycle(
        ModelRepository([EXAMPLE_MODELS]),
        {"onnxruntime": OnnxRuntimeBackend()},
        make_scheduler,
        LifecycleSettings(),
    )
    sink = KeptTraces()
    settings = TraceSettings(level=("TIMESTAMPS",), rate=1, file="unused.json")
    server = InferenceServer(lifecycle, tracing=TraceControl(settings, sink))
    assert await lifecycle.load_many(["simple"]) == {}
    try:
        request = simple_request()
        request.inputs[0].shm = SharedMemoryRef("nowhere", 64)
        with pytest.raises(ServerError, match="Unable to find shared memory region: 'nowhere'"):
            await server.infer(request)
        # Written (handed to the sink), not kept open until shutdown.
        assert len(sink.done) == 1 and sink.open <= 0
    finally:
        await lifecycle.close()
