"""Triton conformance, round 3 (issue 37): the wording and edge cases of Triton's own qa
tests, asserted exactly, over HTTP and gRPC where both apply.

Ported from qa/L0_http (http_test.py, http_request_many_chunks.py,
http_input_size_limit_test.py, test.sh's curl checks), qa/L0_grpc/python_grpc_aio_test.py,
qa/L0_shared_memory and the client repository's grpc_explicit_int8_content_client.py.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import requests
import tritonclient.grpc.aio as grpc_aio
from modelgen import identity_model, write_model
from onnx import TensorProto, helper
from serverproc import EXAMPLE_MODELS, ServerProcess, running_server
from tritonclient.utils import InferenceServerException

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

INT64_MAX = 2**63 - 1
MAX_CHUNKS = 65536
RESERVED = "triton_python_backend_shm_region_"
Tensors = pb.ModelInferRequest.InferInputTensor


def int8_add_sub() -> Any:
    """Triton's `simple_int8`: INPUT0, INPUT1 INT8 [-1, 16] -> OUTPUT0 = sum, OUTPUT1 =
    difference."""
    cast = TensorProto.INT32
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["a"], to=cast),
        helper.make_node("Cast", ["INPUT1"], ["b"], to=cast),
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Sub", ["a", "b"], ["diff"]),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.INT8),
        helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=TensorProto.INT8),
    ]
    inputs, outputs = (
        [helper.make_tensor_value_info(n, TensorProto.INT8, ["batch", 16]) for n in names]
        for names in (("INPUT0", "INPUT1"), ("OUTPUT0", "OUTPUT1"))
    )
    graph = helper.make_graph(nodes, "simple_int8", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("r3")
    write_model(repo, "one_float", identity_model(TensorProto.FLOAT, dims=("batch", 8)))
    write_model(repo, "simple_int8", int8_add_sub())
    # The default --http-max-input-size (64 MiB), as the qa tests run.
    with running_server([EXAMPLE_MODELS, repo], ["--allow-client-shm=true"]) as proc:
        yield proc


@pytest.fixture(scope="module")
def http(srv: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.base_url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def stub(srv: ServerProcess) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(srv.grpc_url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def http_error(response: httpx.Response | requests.Response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    message: str = response.json()["error"]
    return message


def grpc_error(call: Any, request: Any, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call(request)
    error: Any = caught.value
    assert error.code() == code, error.details()
    return str(error.details())


# --- shapes and sizes ------------------------------------------------------------------------


def test_byte_size_overflow(http: httpx.Client, stub: Any) -> None:
    # qa/L0_http test_buffer_size_overflow: 4 * (2**60 + 2) elements fit an int64; at
    # 4 bytes each, their byte size does not.
    shape = [2**2, 2**60 + 2]
    expected = (
        "byte size overflow for input 'INPUT': element count (4611686018427387912) * data "
        f"type size (4) exceeds maximum allowed size ({INT64_MAX})"
    )
    body = {"inputs": [{"name": "INPUT", "shape": shape, "datatype": "FP32", "data": [1.0]}]}
    assert http_error(http.post("/v2/models/one_float/infer", json=body)) == expected
    request = pb.ModelInferRequest(
        model_name="one_float",
        inputs=[Tensors(name="INPUT", datatype="FP32", shape=shape)],
        raw_input_contents=[b"\0\0\0\0"],
    )
    assert grpc_error(stub.ModelInfer, request, grpc.StatusCode.INVALID_ARGUMENT) == expected
    # The element count itself overflowing keeps its own message.
    body["inputs"][0]["shape"] = [2**4, 2**60 + 2]
    assert "causes total element count to exceed maximum size of" in http_error(
        http.post("/v2/models/one_float/infer", json=body)
    )


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_body_over_the_limit(http: httpx.Client, encoding: str) -> None:
    # qa/L0_http/http_input_size_limit_test.py test_default_limit_compressed.
    limit = 64 * 1024 * 1024
    document = b'{"inputs": []' + b" " * (limit + 1024 * 1024) + b"}"
    compress = gzip.compress if encoding == "gzip" else zlib.compress
    response = http.post(
        "/v2/models/one_float/infer",
        content=compress(document),
        headers={"Content-Encoding": encoding, "Content-Type": "application/json"},
    )
    assert http_error(response) == (
        f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. Use "
        "--http-max-input-size to increase the limit."
    )


# --- chunked bodies --------------------------------------------------------------------------


def send_chunks(srv: ServerProcess, count: int) -> tuple[str, str]:
    """qa/L0_http/http_request_many_chunks.py: a raw-binary infer request to `simple` whose
    body comes in `count` one-byte chunks, each sent on its own; the status line and the
    error."""
    host, port = srv.http_url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(
            b"POST /v2/models/simple/infer HTTP/1.1\r\nInference-Header-Content-Length: 0\r\n"
            b"Host: localhost\r\nContent-Type: application/octet-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        try:
            for _ in range(count):
                sock.send(b"1\r\nA\r\n")
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close once it has decided
        answer = b""
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0].decode(), json.loads(body)["error"]


def test_chunked_body_at_the_chunk_limit_is_read(srv: ServerProcess) -> None:
    status, error = send_chunks(srv, MAX_CHUNKS)
    assert status.startswith("HTTP/1.1 400 ")
    assert error == (
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be "
        "deduced but got 2 inputs in 'simple' model configuration"
    )


def test_chunked_body_past_the_chunk_limit_is_refused(srv: ServerProcess) -> None:
    status, error = send_chunks(srv, MAX_CHUNKS + 1)
    assert status.startswith("HTTP/1.1 400 ")
    assert error == (
        "Chunked request body exceeds maximum of 65536 non-empty chunks. Send fewer or "
        "larger HTTP chunks."
    )


def manual_chunks(data: bytes) -> bytes:
    return f"{len(data):X}\r\n".encode() + data + b"\r\n0\r\n\r\n"


def test_a_body_chunked_by_hand_is_read(srv: ServerProcess) -> None:
    # qa/L0_http test_content_encoding_chunked_manually: requests sends the caller's
    # Transfer-Encoding: chunked and its own Content-Length; the chunked framing wins.
    values = np.arange(8, dtype=np.float32)
    response = requests.post(
        f"{srv.base_url}/v2/models/one_float/infer",
        data=manual_chunks(values.tobytes()),
        headers={"Inference-Header-Content-Length": "0", "Transfer-Encoding": "chunked"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    length = int(response.headers["Inference-Header-Content-Length"])
    assert response.content[length:] == values.tobytes()
    assert response.headers["Connection"] == "close"  # RFC 9112 6.3
    # And a compressed body chunked by hand: the Content-Encoding applies to the chunks'
    # data as a whole.
    body = {"inputs": [{"name": "INPUT", "shape": [1, 8], "datatype": "FP32", "data": [1] * 8}]}
    response = requests.post(
        f"{srv.base_url}/v2/models/one_float/infer",
        data=manual_chunks(gzip.compress(json.dumps(body).encode())),
        headers={"Content-Encoding": "gzip", "Transfer-Encoding": "chunked"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [1.0] * 8


# --- the repository index --------------------------------------------------------------------


def test_repository_index_ready_must_be_a_boolean(http: httpx.Client) -> None:
    expected = "Invalid value for 'ready': expected a boolean"
    # qa/L0_http test_repository_index_deeply_nested_json.
    depth = 250000
    nested = '{"ready":' + "[" * depth + "true" + "]" * depth + "}"
    assert http_error(http.post("/v2/repository/index", content=nested)) == expected
    for value in ('"yes"', "1", "null", "[true]", '{"x": true}'):
        response = http.post("/v2/repository/index", content='{"ready": ' + value + "}")
        assert http_error(response) == expected, value
    deep_elsewhere = '{"other":' + "[" * 200 + "]" * 200 + ', "ready": true}'
    assert "nesting depth" in http_error(http.post("/v2/repository/index", content=deep_elsewhere))
    assert http.post("/v2/repository/index", content='{"ready": true}').status_code == 200


# --- outputs ---------------------------------------------------------------------------------


def test_binary_data_output_with_a_json_output(http: httpx.Client) -> None:
    # qa/L0_http/test.sh: binary_data_output=true, binary_data=false on OUTPUT0 and not
    # given on OUTPUT1: both outputs named, so both come back as JSON.
    data = list(range(1, 17))
    body = {
        "parameters": {"binary_data_output": True},
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": data},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": data},
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}, {"name": "OUTPUT1"}],
    }
    response = http.post("/v2/models/simple/infer", content=json.dumps(body))
    assert response.status_code == 200, response.text
    text = response.text.replace(" ", "")
    assert text.count("[2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,32]") == 1
    assert text.count("[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]") == 1
    # No outputs named: binary_data_output makes them all binary.
    del body["outputs"]
    response = http.post("/v2/models/simple/infer", content=json.dumps(body))
    assert response.status_code == 200
    assert "inference-header-content-length" in response.headers
    assert b"[2,4,6" not in response.content and b"[0,0,0" not in response.content


# --- shared memory ---------------------------------------------------------------------------


def test_registering_a_missing_system_region(http: httpx.Client, stub: Any) -> None:
    key = f"/ge_missing_{uuid.uuid4().hex[:8]}"
    expected = f"Unable to open shared memory region: '{key}'"
    request = pb.SystemSharedMemoryRegisterRequest(name="test_shm", key=key, byte_size=0)
    assert grpc_error(stub.SystemSharedMemoryRegister, request, grpc.StatusCode.INTERNAL) == (
        expected
    )
    response = http.post(
        "/v2/systemsharedmemory/region/test_shm/register",
        json={"key": key, "offset": 0, "byte_size": 0},
    )
    # Triton answers 500 over HTTP; bad input is never a 500 here (docs/reference.md).
    assert http_error(response, 400) == expected


def test_grpc_aio_client_shared_memory_cases(srv: ServerProcess) -> None:
    # qa/L0_grpc/python_grpc_aio_test.py, with its regular expressions.
    async def run() -> None:
        client = grpc_aio.InferenceServerClient(srv.grpc_url)
        try:
            with pytest.raises(InferenceServerException) as caught:
                await client.register_system_shared_memory("test_shm", "/test_shm", 0)
            assert re.search(
                r"\[StatusCode\.INTERNAL\] Unable to open shared memory region: '/test_shm'",
                str(caught.value),
            ), str(caught.value)
            with pytest.raises(InferenceServerException) as caught:
                await client.register_cuda_shared_memory("", b"", 0, 0)
            assert re.search(
                "failed to register shared memory region.*invalid args", str(caught.value)
            ), str(caught.value)
        finally:
            await client.close()

    asyncio.run(run())


def test_cuda_registration_refusal(http: httpx.Client, stub: Any) -> None:
    expected = "failed to register shared memory region: invalid args"
    request = pb.CudaSharedMemoryRegisterRequest(name="c", raw_handle=bytes(64), byte_size=64)
    assert (
        grpc_error(stub.CudaSharedMemoryRegister, request, grpc.StatusCode.INVALID_ARGUMENT)
        == expected
    )
    handle = {"b64": "A" * 86 + "=="}  # 64 bytes
    response = http.post(
        "/v2/cudasharedmemory/region/c/register",
        json={"raw_handle": handle, "device_id": 0, "byte_size": 64},
    )
    assert http_error(response) == expected
    response = http.post("/v2/cudasharedmemory/region/c/register", json={"byte_size": 64})
    assert http_error(response) == "Shared memory register request has no 'raw_handle' field"
    response = http.post(
        "/v2/cudasharedmemory/region/c/register",
        json={"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 64},
    )
    assert http_error(response) == "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"


@pytest.mark.parametrize("key", [f"{RESERVED}_k", f"/{RESERVED}_k", f"///{RESERVED}_k"])
def test_reserved_shared_memory_keys(http: httpx.Client, stub: Any, key: str) -> None:
    # qa/L0_shared_memory test_register_reserved_names.
    expected = (
        f"cannot register shared memory region 'my_test_shm_name' with key '{key}' as the key "
        f"contains the reserved prefix '{RESERVED}'"
    )
    response = http.post(
        "/v2/systemsharedmemory/region/my_test_shm_name/register",
        json={"key": key, "offset": 0, "byte_size": 10000},
    )
    assert http_error(response) == expected
    request = pb.SystemSharedMemoryRegisterRequest(
        name="my_test_shm_name", key=key, byte_size=10000
    )
    assert (
        grpc_error(stub.SystemSharedMemoryRegister, request, grpc.StatusCode.INVALID_ARGUMENT)
        == expected
    )


# --- the grpc_explicit_int8_content_client.py example ----------------------------------------


def test_explicit_int8_contents(http: httpx.Client, stub: Any) -> None:
    """What the example does: INT8 inputs in `int_contents`, outputs read from
    `raw_output_contents` as int8, then a version string that is no number."""
    first, second = list(range(16)), [1] * 16
    request = pb.ModelInferRequest(model_name="simple_int8")
    for name, values in (("INPUT0", first), ("INPUT1", second)):
        tensor = request.inputs.add(name=name, datatype="INT8", shape=[1, 16])
        tensor.contents.int_contents[:] = values
    request.outputs.add(name="OUTPUT0")
    request.outputs.add(name="OUTPUT1")
    response = stub.ModelInfer(request)
    results = [np.frombuffer(raw, dtype=np.int8) for raw in response.raw_output_contents]
    assert [r.tolist() for r in results] == [
        [a + b for a, b in zip(first, second, strict=True)],
        [a - b for a, b in zip(first, second, strict=True)],
    ]
    request.model_version = "wrong_specification"
    expected = (
        "failed to get model version from specified version string 'wrong_specification' "
        "(details: stol), version should be an integral value > 0"
    )
    assert grpc_error(stub.ModelInfer, request, grpc.StatusCode.INVALID_ARGUMENT) == expected
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT8", "data": first}]}
    response_http = http.post(
        "/v2/models/simple_int8/versions/wrong_specification/infer", json=body
    )
    assert http_error(response_http) == expected
    request.model_version = "-1"
    assert grpc_error(stub.ModelInfer, request, grpc.StatusCode.INVALID_ARGUMENT) == (
        "invalid model version specified '-1' , version should be an integral value > 0"
    )
