"""Triton's exact error messages, over HTTP and gRPC, for each class of bad request that
clients match on (the wording lives once, in server/inference/error_texts.py)."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
from modelgen import identity_model, write_model
from onnx import TensorProto
from serverproc import EXAMPLE_MODELS, ServerProcess, running_server
from simple_requests import A, B, json_input, valid_message

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

LIMIT = 1 << 16
TAG = "[request id: r1] "
NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension "
    "to be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)
Tensors = pb.ModelInferRequest.InferInputTensor


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("extra")
    write_model(
        repo,
        "two_free_dims",
        identity_model(TensorProto.FLOAT, dims=(None, None, None)),
        'name: "two_free_dims"\nmax_batch_size: 0\n',
    )
    write_model(repo, "one_string", identity_model(TensorProto.STRING, dims=("batch", 2)))
    write_model(repo, "one_float", identity_model(TensorProto.FLOAT, dims=("batch", 4)))
    flags = [f"--http-max-input-size={LIMIT}", "--allow-client-shm=true"]
    with running_server([EXAMPLE_MODELS, repo], flags) as proc:
        yield proc


@pytest.fixture(scope="module")
def http(srv: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.base_url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def stub(srv: ServerProcess) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(srv.grpc_url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def http_error(response: httpx.Response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    message: str = response.json()["error"]
    return message


def grpc_error(call: Any, request: Any, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call(request)
    error: Any = caught.value
    assert error.code() == code, error.details()
    return str(error.details())


def infer(http: httpx.Client, body: dict[str, Any], model: str = "simple") -> str:
    return http_error(http.post(f"/v2/models/{model}/infer", json={"id": "r1", **body}))


def message(**changes: Any) -> pb.ModelInferRequest:
    request = valid_message("r1")
    for key, value in changes.items():
        request.ClearField(key)
        getattr(request, key).extend(value)
    return request


def binary(http: httpx.Client, inputs: list[tuple[str, str, list[int], bytes]], model: str) -> str:
    header = orjson.dumps(
        {
            "id": "r1",
            "inputs": [
                {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": len(b)}}
                for n, d, s, b in inputs
            ],
        }
    )
    body = header + b"".join(b for *_, b in inputs)
    headers = {"Inference-Header-Content-Length": str(len(header))}
    return http_error(http.post(f"/v2/models/{model}/infer", content=body, headers=headers))


def test_shape_mismatch(http: httpx.Client, stub: Any) -> None:
    expected = (
        f"{TAG}unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got "
        f"[1,8]. {NOTE}"
    )
    body = {"inputs": [json_input("INPUT0", [1, 8], A[:8]), json_input("INPUT1", [1, 16], B)]}
    assert infer(http, body) == expected
    request = message(
        inputs=[
            Tensors(name="INPUT0", datatype="INT32", shape=[1, 8]),
            Tensors(name="INPUT1", datatype="INT32", shape=[1, 16]),
        ],
        raw_input_contents=[np.zeros(8, np.int32).tobytes(), np.zeros(16, np.int32).tobytes()],
    )
    assert grpc_error(stub.ModelInfer, request, grpc.StatusCode.INVALID_ARGUMENT) == expected


def test_data_count_mismatch(http: httpx.Client, stub: Any) -> None:
    expected = (
        f"{TAG}input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60"
    )
    short = np.zeros(15, np.int32).tobytes()
    full = np.zeros(16, np.int32).tobytes()
    inputs = [("INPUT0", "INT32", [1, 16], short), ("INPUT1", "INT32", [1, 16], full)]
    assert binary(http, inputs, "simple") == expected
    request = message(raw_input_contents=[short, full])
    assert grpc_error(stub.ModelInfer, request, grpc.StatusCode.INVALID_ARGUMENT) == expected
    long = {"inputs": [json_input("INPUT0", [1, 16], [*A, 1]), json_input("INPUT1", [1, 16], B)]}
    assert infer(http, long) == (
        "Unable to parse 'data': Shape does not match true shape of 'data' field"
    )
    few = {"inputs": [json_input("INPUT0", [1, 16], A[:3]), json_input("INPUT1", [1, 16], B)]}
    assert infer(http, few) == "Failed to parse 'data' field: shape does not match true shape"


def test_element_count_overflow(http: httpx.Client, stub: Any) -> None:
    shape = [1, 2**62, 4]
    expected = (
        "invalid shape for input 'INPUT0': shape [1,4611686018427387904,4] causes total element "
        "count to exceed maximum size of 9223372036854775807"
    )
    body = {"inputs": [json_input("INPUT0", shape, []), json_input("INPUT1", [1, 16], B)]}
    assert infer(http, body) == expected
    request = message(
        inputs=[
            Tensors(name="INPUT0", datatype="INT32", shape=shape),
            Tensors(name="INPUT1", datatype="INT32", shape=[1, 16]),
        ]
    )
    assert grpc_error(stub.ModelInfer, request, grpc.StatusCode.INVALID_ARGUMENT) == expected


def test_json_depth_on_infer_and_repository(http: httpx.Client) -> None:
    deep: Any = A
    for _ in range(100):
        deep = [deep]
    body = {"inputs": [json_input("INPUT0", [1, 16], deep), json_input("INPUT1", [1, 16], B)]}
    assert infer(http, body) == (
        "Unable to parse 'data': JSON nesting depth exceeds maximum allowed limit (100)"
    )
    nested: Any = {}
    for _ in range(101):
        nested = {"x": nested}
    response = http.post("/v2/repository/models/simple/load", json={"parameters": nested})
    assert http_error(response) == (
        "Unable to parse the load request: JSON nesting depth exceeds maximum allowed limit (100)"
    )


def test_raw_binary_requests(http: httpx.Client) -> None:
    def raw(model: str, body: bytes) -> httpx.Response:
        headers = {"Inference-Header-Content-Length": "0"}
        return http.post(f"/v2/models/{model}/infer", content=body, headers=headers)

    assert http_error(raw("simple", bytes(128))) == (
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced "
        "but got 2 inputs in 'simple' model configuration"
    )
    assert http_error(raw("two_free_dims", bytes(16))) == (
        "[request id: <id_unknown>] The shape of the raw input 'INPUT' can not be deduced "
        "because there are more than one variable-sized dimension"
    )
    assert http_error(raw("one_string", b"abc")) == (
        "[request id: <id_unknown>] For BYTE datatype raw input 'INPUT', the model must have "
        "input shape [1]"
    )
    assert http_error(raw("simple", bytes(LIMIT + 1))) == (
        f"Raw input has a byte_size ({LIMIT + 1} bytes) that exceeds the maximum allowed value "
        f"of {LIMIT} bytes. Use --http-max-input-size to increase the limit."
    )


def test_raw_binary_answers_binary(http: httpx.Client) -> None:
    """Triton's response format: binary outputs after a JSON header, with its length."""
    values = np.arange(4, dtype=np.float32)
    response = http.post(
        "/v2/models/one_float/infer",
        content=values.tobytes(),
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    length = int(response.headers["inference-header-content-length"])
    header = orjson.loads(response.content[:length])
    (output,) = header["outputs"]
    assert output["shape"] == [1, 4] and output["parameters"] == {"binary_data_size": 16}
    np.testing.assert_array_equal(np.frombuffer(response.content[length:], np.float32), values)


def test_duplicate_inputs_and_outputs(http: httpx.Client, stub: Any) -> None:
    twice = {"inputs": [json_input("INPUT0", [1, 16], A)] * 2}
    assert infer(http, twice) == f"{TAG}input 'INPUT0' already exists in request"
    outputs = {"inputs": valid_inputs(), "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]}
    assert infer(http, outputs) == f"{TAG}output 'OUTPUT0' already exists in request"
    request = message(inputs=[Tensors(name="INPUT0", datatype="INT32", shape=[1, 16])] * 2)
    assert (
        grpc_error(stub.ModelInfer, request, grpc.StatusCode.INVALID_ARGUMENT)
        == f"{TAG}input 'INPUT0' already exists in request"
    )
    request = valid_message("r1")
    request.outputs.extend([pb.ModelInferRequest.InferRequestedOutputTensor(name="OUTPUT0")] * 2)
    assert (
        grpc_error(stub.ModelInfer, request, grpc.StatusCode.INVALID_ARGUMENT)
        == f"{TAG}output 'OUTPUT0' already exists in request"
    )


def valid_inputs() -> list[dict[str, Any]]:
    return [json_input("INPUT0", [1, 16], A), json_input("INPUT1", [1, 16], B)]


def test_request_json_size(http: httpx.Client) -> None:
    body = b'{"inputs": []}' + b" " * LIMIT
    response = http.post("/v2/models/simple/infer", content=body)
    assert http_error(response) == (
        f"request JSON size of {len(body)} bytes exceeds the maximum allowed input size of "
        f"{LIMIT} bytes. Use --http-max-input-size to increase the limit."
    )
    response = http.post("/v2/repository/index", content=body)
    assert "request JSON size of" in http_error(response)


def test_bytes_element_counts(http: httpx.Client, stub: Any) -> None:
    few = b"".join(struct.pack("<I", 1) + b"x" for _ in range(3))
    assert binary(http, [("INPUT", "BYTES", [1, 2], few)], "one_string") == (
        f"{TAG}unexpected number of string elements 3 for inference input 'INPUT' for model "
        "'one_string', expecting 2"
    )
    one = struct.pack("<I", 1) + b"x"
    assert binary(http, [("INPUT", "BYTES", [1, 2], one)], "one_string") == (
        f"{TAG}expected 2 string elements for inference input 'INPUT' for model 'one_string', got 1"
    )
    request = pb.ModelInferRequest(
        model_name="one_string",
        id="r1",
        inputs=[
            Tensors(
                name="INPUT",
                datatype="BYTES",
                shape=[1, 2],
                contents=pb.InferTensorContents(bytes_contents=[b"a", b"b", b"c"]),
            )
        ],
    )
    assert grpc_error(stub.ModelInfer, request, grpc.StatusCode.INVALID_ARGUMENT) == (
        f"{TAG}unexpected number of string elements 3 for inference input 'INPUT' for model "
        "'one_string', expecting 2"
    )


def test_shared_memory_registration(http: httpx.Client, stub: Any) -> None:
    name = f"r_{uuid.uuid4().hex[:8]}"
    response = http.post(
        f"/v2/systemsharedmemory/region/{name}/register",
        json={"key": "/../etc/passwd", "offset": 0, "byte_size": 8},
    )
    expected = f"cannot register shared memory region '{name}' - invalid shm key '/../etc/passwd'"
    assert http_error(response) == expected
    request = pb.SystemSharedMemoryRegisterRequest(name=name, key="/../etc/passwd", byte_size=8)
    assert (
        grpc_error(stub.SystemSharedMemoryRegister, request, grpc.StatusCode.INVALID_ARGUMENT)
        == expected
    )
    missing = f"/ge_missing_{uuid.uuid4().hex[:8]}"
    response = http.post(
        f"/v2/systemsharedmemory/region/{name}/register",
        json={"key": missing, "offset": 0, "byte_size": 8},
    )
    # Triton's code for it is INTERNAL, named before any size check; over HTTP a 400.
    assert http_error(response) == f"Unable to open shared memory region: '{missing}'"
    request = pb.SystemSharedMemoryRegisterRequest(name=name, key=missing, byte_size=0)
    assert (
        grpc_error(stub.SystemSharedMemoryRegister, request, grpc.StatusCode.INTERNAL)
        == f"Unable to open shared memory region: '{missing}'"
    )


def test_a_named_repository(http: httpx.Client, stub: Any) -> None:
    """Triton serves its repositories as one: an index request that names one is answered
    with the index over HTTP and refused over gRPC; load and unload refuse the name."""
    unsupported = "'repository_name' specification is not supported"
    index = http.post("/v2/repository/any/index")
    assert index.status_code == 200
    assert {"name": "simple", "version": "1", "state": "READY"} in index.json()
    for action in ("load", "unload"):
        answer = http.post(f"/v2/repository/any/models/simple/{action}")
        assert (answer.status_code, answer.json()) == (501, {"error": unsupported})
    calls = [
        (stub.RepositoryIndex, pb.RepositoryIndexRequest(repository_name="any")),
        (stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(repository_name="any",
                                                                 model_name="simple")),
        (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(repository_name="any",
                                                                     model_name="simple")),
    ]  # fmt: skip
    for call, request in calls:
        with pytest.raises(grpc.RpcError) as info:
            call(request, timeout=10)
        error: Any = info.value
        assert (error.code(), error.details()) == (grpc.StatusCode.UNIMPLEMENTED, unsupported)
    assert http.get("/v2/models/simple/ready").status_code == 200


def test_a_kserve_clients_repository_call_is_told_why_it_fails(stub: Any) -> None:
    """KServe's protos give RepositoryModelLoadRequest (and Unload) only `model_name`, as
    field 1: Triton's `repository_name`. The refusal keeps Triton's words first, and says
    so."""
    for action, call, request in (
        ("load", stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest),
        ("unload", stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest),
    ):
        # What KServe's client sends: field 1 holds the model's name, field 2 is unset.
        kserve_shaped = request.FromString(b"\x0a\x06simple")
        assert (kserve_shaped.repository_name, kserve_shaped.model_name) == ("simple", "")
        with pytest.raises(grpc.RpcError) as info:
            call(kserve_shaped, timeout=10)
        error: Any = info.value
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
        details: str = error.details()
        assert details.startswith("'repository_name' specification is not supported, ")
        assert "KServe's protos" in details
        assert f"POST /v2/repository/models/simple/{action} over HTTP" in details
