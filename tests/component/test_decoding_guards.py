"""Bad input through the in-process API, and the decoding guard of each front end, with a
real core serving examples/models/simple in this process."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import httpx
import numpy as np
import pytest
from serverproc import EXAMPLE_MODELS
from simple_requests import OVERFLOW, A, B, assert_sum, expect_http, valid_body, valid_message

from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc
from ge_serve.server.app import make_scheduler
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.grpc import codec as grpc_codec
from ge_serve.server.grpc.servicer import GrpcServicer, method_handlers, service_handler
from ge_serve.server.http import codec as http_codec
from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.types import DataType, InferRequest, Tensor
from ge_serve.server.models.lifecycle import LifecycleSettings, ModelLifecycle
from ge_serve.server.models.repository import ModelRepository

pytestmark = [pytest.mark.timeout(120)]

HUGE_SHAPES = [(0, 2**62), (2**31, 2**31, 0), (2**62, 0, 1)]


@pytest.fixture
async def core() -> AsyncIterator[InferenceServer]:
    lifecycle = ModelLifecycle(
        ModelRepository([EXAMPLE_MODELS]),
        {"onnxruntime": OnnxRuntimeBackend()},
        make_scheduler,
        LifecycleSettings(unload_timeout_s=5.0),
    )
    assert await lifecycle.load_many(["simple"]) == {}
    try:
        yield InferenceServer(lifecycle)
    finally:
        await lifecycle.close()


def core_request(shape: tuple[int, ...] = (1, 16)) -> InferRequest:
    a = np.array(A, dtype=np.int32).reshape(1, 16)
    b = np.array(B, dtype=np.int32).reshape(1, 16)
    first = Tensor("INPUT0", DataType.INT32, shape, a if shape == (1, 16) else np.empty(0))
    return InferRequest("simple", inputs=[first, Tensor("INPUT1", DataType.INT32, (1, 16), b)])


async def assert_core_serves(core: InferenceServer) -> None:
    response = await core.infer(core_request())
    total = {t.name: t.data for t in response.outputs}["OUTPUT0"]
    np.testing.assert_array_equal(total, np.array([A]) + np.array([B]))


@pytest.mark.parametrize("shape", HUGE_SHAPES)
async def test_huge_shape_in_process(core: InferenceServer, shape: tuple[int, ...]) -> None:
    with pytest.raises(ServerError) as caught:
        await core.infer(core_request(shape))
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert OVERFLOW in caught.value.message
    await assert_core_serves(core)


# --- the decoding guard of each front end ----------------------------------------------------


def decoder_bug(*args: Any, **kwargs: Any) -> Any:
    raise KeyError("a gap in the decoder")


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info is not None]


async def test_decoding_guard_http(
    core: InferenceServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    app = HttpFrontEnd(core, HttpSettings(max_input_size=1 << 20, restricted_api=())).build()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://ge-serve") as client:
        with monkeypatch.context() as patch:
            patch.setattr(http_codec, "decode_infer_request", decoder_bug)
            response = await client.post("/v2/models/simple/infer", json=valid_body())
        message = expect_http(response, 400, "failed to decode the inference request", "KeyError")
        assert "a gap in the decoder" in message
        assert len(tracebacks(caplog)) == 1
        assert "inference request" in tracebacks(caplog)[0].getMessage()

        # After decoding, an unexpected exception is the server's fault: a 500, logged once.
        caplog.clear()
        with monkeypatch.context() as patch:
            patch.setattr(http_codec, "encode_infer_response", decoder_bug)
            response = await client.post("/v2/models/simple/infer", json=valid_body())
        expect_http(response, 500, "KeyError")
        assert len(tracebacks(caplog)) == 1

        response = await client.post("/v2/models/simple/infer", json=valid_body())
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [a + b for a, b in zip(A, B, strict=True)]


async def test_decoding_guard_grpc(
    core: InferenceServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((service_handler(method_handlers(GrpcServicer(core))),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            with monkeypatch.context() as patch:
                patch.setattr(grpc_codec, "decode_infer_request", decoder_bug)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.ModelInfer(valid_message())
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                details = str(caught.value.details())
                assert "failed to decode the inference request: KeyError" in details
                assert len(tracebacks(caplog)) == 1

                caplog.clear()
                answers = [a async for a in stub.ModelStreamInfer(iter([valid_message("s")]))]
                assert "failed to decode the inference request" in answers[0].error_message
                assert answers[0].infer_response.id == "s"
                assert len(tracebacks(caplog)) == 1

            caplog.clear()
            with monkeypatch.context() as patch:
                patch.setattr(grpc_codec, "encode_infer_response", decoder_bug)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.ModelInfer(valid_message())
                assert caught.value.code() == grpc.StatusCode.INTERNAL
                assert len(tracebacks(caplog)) == 1

            assert_sum(await stub.ModelInfer(valid_message()))
    finally:
        await server.stop(None)
