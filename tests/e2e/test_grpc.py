"""gRPC end to end: tritonclient.grpc (sync, aio, streaming), a plain channel with our
generated stubs (typed contents, bad inputs, stream errors), health and reflection."""

from __future__ import annotations

import queue
import struct
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from protocols import as_ints
from serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

STREAM_REQUESTS = 100
RPC_TIMEOUT = 30.0


@pytest.fixture
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_url) as chan:
        yield chan


@pytest.fixture
def stub(channel: grpc.Channel) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(channel)


def simple_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = [
        grpcclient.InferInput("INPUT0", list(a.shape), "INT32"),
        grpcclient.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def raw_simple_request(request_id: str = "", model: str = "simple") -> pb.ModelInferRequest:
    a = np.arange(16, dtype=np.int32)
    message = pb.ModelInferRequest(model_name=model, id=request_id)
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(a.tobytes())
    return message


def raw_output(response: pb.ModelInferResponse, name: str) -> np.ndarray:
    for index, output in enumerate(response.outputs):
        if output.name == name:
            assert output.datatype == "INT32"
            raw = response.raw_output_contents[index]
            return np.frombuffer(raw, dtype=np.int32).reshape(tuple(output.shape))
    raise AssertionError(f"no output {name}")


def assert_healthy(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=RPC_TIMEOUT).live
    assert stub.ServerReady(pb.ServerReadyRequest(), timeout=RPC_TIMEOUT).ready


# --- tritonclient.grpc ------------------------------------------------------------------------


def test_tritonclient_sync_with_gzip(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.int32)
    for compression in (None, "gzip", "deflate"):
        result = client.infer("simple", simple_inputs(a, b), compression_algorithm=compression)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    client.close()


def test_tritonclient_stream_many_in_flight(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        b = np.arange(16, dtype=np.int32).reshape(1, 16)
        # Every request is sent before any answer is read: all are in flight together.
        for i in range(STREAM_REQUESTS):
            a = np.full((1, 16), i, dtype=np.int32)
            client.async_stream_infer("simple", simple_inputs(a, b), request_id=f"req-{i}")
        seen: dict[str, Any] = {}
        for _ in range(STREAM_REQUESTS):
            result, error = results.get(timeout=RPC_TIMEOUT)
            assert error is None, error
            response = result.get_response()
            seen[response.id] = result
            assert response.parameters["triton_final_response"].bool_param is True
    finally:
        client.stop_stream()
        client.close()
    assert sorted(seen) == sorted(f"req-{i}" for i in range(STREAM_REQUESTS))
    for i in range(STREAM_REQUESTS):
        result = seen[f"req-{i}"]
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), i + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), i - b)
    assert results.empty()


def test_tritonclient_stream_empty_final_response_on_a_plain_model(server: ServerProcess) -> None:
    """A model that is not decoupled answers once, final; no extra empty response."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    a = np.ones((1, 16), dtype=np.int32)
    client.async_stream_infer(
        "simple", simple_inputs(a, a), request_id="one", enable_empty_final_response=True
    )
    client.async_stream_infer("simple", simple_inputs(a, a), request_id="two")
    first = results.get(timeout=RPC_TIMEOUT)
    second = results.get(timeout=RPC_TIMEOUT)
    client.stop_stream()
    client.close()
    assert [r.get_response().id for r, _ in (first, second)] == ["one", "two"]
    assert first[0].get_response().parameters["triton_final_response"].bool_param
    np.testing.assert_array_equal(first[0].as_numpy("OUTPUT0"), a + a)


async def test_tritonclient_aio_infer_and_stream(server: ServerProcess) -> None:
    client = grpcclient_aio.InferenceServerClient(server.grpc_url)
    b = np.arange(16, dtype=np.int32).reshape(1, 16)
    try:
        assert await client.is_server_ready()
        result = await client.infer("simple", simple_inputs(b, b))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), b + b)

        async def requests() -> Any:
            for i in range(STREAM_REQUESTS):
                a = np.full((1, 16), i, dtype=np.int32)
                yield {"model_name": "simple", "inputs": simple_inputs(a, b), "request_id": str(i)}

        seen = set()
        async for result, error in client.stream_infer(requests()):
            assert error is None, error
            i = int(result.get_response().id)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), i + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), i - b)
            seen.add(i)
            if len(seen) == STREAM_REQUESTS:
                break
        assert seen == set(range(STREAM_REQUESTS))
    finally:
        await client.close()


def test_tritonclient_trace_settings(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    settings = client.get_trace_settings(as_json=True)["settings"]
    assert settings["trace_level"]["value"] == ["OFF"]
    # No trace file: turning tracing on would keep every trace in memory, never written.
    with pytest.raises(InferenceServerException) as info:
        client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "invalid trace setting :trace file name is not given" in info.value.message()
    settings = client.get_trace_settings(as_json=True)["settings"]
    assert settings["trace_level"]["value"] == ["OFF"], "a refused update changes nothing"
    with pytest.raises(InferenceServerException) as info:
        client.update_trace_settings(settings={"trace_rate": ["7", "9"]})
    assert info.value.message() == "expect only 1 value for 'trace_rate'"
    assert client.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["1000"]
    assert client.is_server_live()
    client.close()


def test_repository_index(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    index = client.get_model_repository_index()
    rows = {(m.name, m.version, m.state) for m in index.models}
    assert ("simple", "1", "READY") in rows
    assert {m.name for m in index.models} == {"simple", "simple_string", "image_classifier"}
    client.close()


# --- a plain channel with our stubs -----------------------------------------------------------


def test_typed_contents_simple(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    a = np.arange(32, dtype=np.int32)
    b = np.full(32, 5, dtype=np.int32)
    message = pb.ModelInferRequest(model_name="simple", id="typed")
    for name, values in (("INPUT0", a), ("INPUT1", b)):
        tensor = message.inputs.add(name=name, datatype="INT32", shape=[2, 16])
        tensor.contents.int_contents.extend(values.tolist())
    response = stub.ModelInfer(message, timeout=RPC_TIMEOUT)
    assert response.id == "typed" and response.model_name == "simple"
    assert response.model_version == "1"
    np.testing.assert_array_equal(raw_output(response, "OUTPUT0"), (a + b).reshape(2, 16))
    np.testing.assert_array_equal(raw_output(response, "OUTPUT1"), (a - b).reshape(2, 16))


def test_typed_contents_bytes(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    message = pb.ModelInferRequest(model_name="simple_string")
    for name, values in (("INPUT0", range(16)), ("INPUT1", [2] * 16)):
        tensor = message.inputs.add(name=name, datatype="BYTES", shape=[1, 16])
        tensor.contents.bytes_contents.extend(str(v).encode() for v in values)
    message.outputs.add(name="OUTPUT0")
    response = stub.ModelInfer(message, timeout=RPC_TIMEOUT)
    assert [o.name for o in response.outputs] == ["OUTPUT0"]
    assert response.outputs[0].datatype == "BYTES"
    raw = response.raw_output_contents[0]
    values, offset = [], 0
    while offset < len(raw):
        (length,) = struct.unpack_from("<I", raw, offset)
        values.append(raw[offset + 4 : offset + 4 + length])
        offset += 4 + length
    assert as_ints(np.array(values, dtype=object)) == [v + 2 for v in range(16)]


def _raw_count_mismatch() -> pb.ModelInferRequest:
    message = raw_simple_request()
    del message.raw_input_contents[1]
    return message


def _byte_size_mismatch() -> pb.ModelInferRequest:
    message = raw_simple_request()
    message.raw_input_contents[0] = b"\x00" * 60
    return message


def _typed_and_raw() -> pb.ModelInferRequest:
    message = raw_simple_request()
    message.inputs[0].contents.int_contents.extend([0] * 16)
    return message


def _unknown_datatype() -> pb.ModelInferRequest:
    message = raw_simple_request()
    message.inputs[0].datatype = "FLOAT7"
    return message


def _malformed_bytes_length() -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="simple_string")
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="BYTES", shape=[1, 16])
        # The first element claims 1000 bytes; the buffer holds 3.
        message.raw_input_contents.append(struct.pack("<I", 1000) + b"abc")
    return message


def _typed_count_mismatch() -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        tensor = message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend([1] * 15)
    return message


def _typed_fp16() -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="simple")
    tensor = message.inputs.add(name="INPUT0", datatype="FP16", shape=[1, 16])
    tensor.contents.fp32_contents.extend([1.0] * 16)
    return message


def _wrong_model_datatype() -> pb.ModelInferRequest:
    message = raw_simple_request()
    message.inputs[0].datatype = "FP32"
    return message


BAD_INPUTS = {
    "raw-count": (
        _raw_count_mismatch,
        grpc.StatusCode.INVALID_ARGUMENT,
        "unable to find data for input tensor 'INPUT1' for model 'simple' in request.",
    ),
    "byte-size": (
        _byte_size_mismatch,
        grpc.StatusCode.INVALID_ARGUMENT,
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model "
        "'simple'. Expected 64, got 60",
    ),
    "typed-and-raw": (
        _typed_and_raw,
        grpc.StatusCode.INVALID_ARGUMENT,
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for "
        "model 'simple'",
    ),
    "unknown-datatype": (
        _unknown_datatype,
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid datatype 'FLOAT7'",
    ),
    "bytes-length": (
        _malformed_bytes_length,
        grpc.StatusCode.INVALID_ARGUMENT,
        "[request id: <id_unknown>] input 'INPUT0': BYTES element 0 has length 1000, which "
        "overruns the buffer",
    ),
    "unknown-model": (
        lambda: raw_simple_request(model="no_such_model"),
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'no_such_model' is not found",
    ),
    "typed-count": (
        _typed_count_mismatch,
        grpc.StatusCode.INVALID_ARGUMENT,
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model "
        "'simple'. Expected 64, got 60",
    ),
    "typed-fp16": (
        _typed_fp16,
        grpc.StatusCode.INVALID_ARGUMENT,
        "FP16 data can only be sent in raw_input_contents",
    ),
    "model-datatype": (
        _wrong_model_datatype,
        grpc.StatusCode.INVALID_ARGUMENT,
        "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input(stub: pb_grpc.GRPCInferenceServiceStub, case: str) -> None:
    build, code, text = BAD_INPUTS[case]
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(build(), timeout=RPC_TIMEOUT)
    error: Any = info.value
    assert error.code() == code, error.details()
    assert text in error.details(), error.details()
    assert_healthy(stub)


def test_message_larger_than_grpc_default_limit_is_read(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    """6 MiB is over gRPC's default 4 MiB limit: the server must read it and answer about
    the content (a shape mismatch), not refuse it as RESOURCE_EXHAUSTED."""
    message = raw_simple_request()
    message.raw_input_contents[0] = bytes(6 * 1024 * 1024)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(message, timeout=RPC_TIMEOUT)
    error: Any = info.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "Expected 64, got 6291456" in error.details()


def test_stream_error_keeps_the_stream_open(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    requests = [
        raw_simple_request("first"),
        raw_simple_request("missing", model="no_such_model"),
        _byte_size_mismatch(),
        raw_simple_request("last"),
    ]
    requests[2].id = "short"
    responses = list(stub.ModelStreamInfer(iter(requests), timeout=RPC_TIMEOUT))
    assert [r.infer_response.id for r in responses] == ["first", "missing", "short", "last"]
    assert [bool(r.error_message) for r in responses] == [False, True, True, False]
    assert "Request for unknown model: 'no_such_model'" in responses[1].error_message
    assert "Expected 64, got 60" in responses[2].error_message
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    np.testing.assert_array_equal(raw_output(responses[3].infer_response, "OUTPUT0"), a + a)


def test_stream_triton_grpc_error_closes_the_stream(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    def requests() -> Iterator[pb.ModelInferRequest]:
        yield raw_simple_request("first")
        yield raw_simple_request("missing", model="no_such_model")
        yield raw_simple_request("after")

    call = stub.ModelStreamInfer(
        requests(), metadata=(("triton_grpc_error", "true"),), timeout=RPC_TIMEOUT
    )
    received = []
    with pytest.raises(grpc.RpcError) as info:
        for response in call:
            received.append(response)
    error: Any = info.value
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "Request for unknown model: 'no_such_model' is not found" in error.details()
    assert [r.infer_response.id for r in received] == ["first"]
    assert not any(r.error_message for r in received)
    assert_healthy(stub)


# --- health and reflection --------------------------------------------------------------------


def test_health_service(channel: grpc.Channel) -> None:
    """Triton's Check never reads the service name: a probe set up with any name sees
    the server's state (the stock servicer answers NOT_FOUND for names it lacks)."""
    health = health_pb2_grpc.HealthStub(channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    for service in ("", "inference.GRPCInferenceService", "nope"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT)
        assert answer.status == serving


def test_reflection_lists_the_service(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    services = database.get_services()
    assert "inference.GRPCInferenceService" in services
    assert "grpc.health.v1.Health" in services
    found = database.FindFileContainingSymbol("inference.GRPCInferenceService")
    service = next(s for s in found.service if s.name == "GRPCInferenceService")
    methods = {m.name for m in service.method}
    assert {"ModelInfer", "ModelStreamInfer", "ModelConfig", "ServerLive"} <= methods


# --- statistics and logging through the core --------------------------------------------------


def test_statistics_over_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        before = client.get_inference_statistics("simple").model_stats[0]
        a = np.ones((2, 16), dtype=np.int32)
        client.infer("simple", simple_inputs(a, a))
        (stats,) = client.get_inference_statistics("simple", "1").model_stats
        assert (stats.name, stats.version) == ("simple", "1")
        assert stats.inference_count == before.inference_count + 2
        assert stats.execution_count == before.execution_count + 1
        assert stats.inference_stats.success.count == before.inference_stats.success.count + 1
        assert stats.inference_stats.compute_infer.ns > before.inference_stats.compute_infer.ns
        everything = client.get_inference_statistics()
        assert {s.name for s in everything.model_stats} >= {"simple", "simple_string"}
        with pytest.raises(InferenceServerException) as info:
            client.get_inference_statistics("no_such_model")
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert info.value.message() == "requested model 'no_such_model' is not available"
    finally:
        client.close()


def test_log_settings_over_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    level = client.get_log_settings(as_json=True)["settings"]["log_verbose_level"]
    try:
        updated = client.update_log_settings({"log_verbose_level": 3}, as_json=True)
        assert updated["settings"]["log_verbose_level"] == {"uint32_param": 3}
        assert "bool_param" in updated["settings"]["log_info"]
        assert client.get_log_settings(as_json=True)["settings"]["log_verbose_level"] == {
            "uint32_param": 3
        }
        with pytest.raises(InferenceServerException) as info:
            client.update_log_settings({"log_format": "fancy"})
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    finally:
        client.update_log_settings({"log_verbose_level": level.get("uint32_param", 0)})
        client.close()
