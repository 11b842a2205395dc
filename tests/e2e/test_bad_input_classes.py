"""Classes of bad input that used to reach a 500 / INTERNAL, each on both protocols.

Every test sends the bad input raw (httpx for HTTP, bare gRPC stubs for gRPC, so malformed
requests can be built at all), checks the 4xx / INVALID_ARGUMENT / NOT_FOUND and its
message, and then checks that the server still answers a valid request correctly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tritonclient.utils.shared_memory as shm
from modelgen import add_sub_model, write_model
from serverproc import EXAMPLE_MODELS, ServerProcess, running_server
from simple_requests import (
    OVERFLOW,
    A,
    B,
    assert_grpc_serves,
    assert_http_serves,
    assert_sum,
    expect_grpc,
    expect_http,
    json_input,
    valid_body,
    valid_message,
)

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

HUGE_SHAPES = [[0, 2**62], [2**31, 2**31, 0], [2**62, 0, 1]]
ODD_VERSIONS = ["\u00b2", "\u0661", "1" * 5000, "9" * 20]
TOO_DEEP = "JSON nesting depth exceeds maximum allowed limit"
UNREADABLE_VERSION = "failed to get model version from specified version string"


# --- the server -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def odd_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Models whose version folders have names only str.isdigit() takes for numbers."""
    repo = tmp_path_factory.mktemp("odd-versions")
    write_model(repo, "odd_versions", add_sub_model(), versions=["1", *ODD_VERSIONS[:2], "9" * 25])
    write_model(repo, "only_odd", add_sub_model(), versions=["\u0661"])
    return repo


@pytest.fixture(scope="module")
def srv(odd_repo: Path) -> Iterator[ServerProcess]:
    extra = [
        "--model-control-mode",
        "explicit",
        "--load-model",
        "simple",
        "--allow-client-shm=true",
    ]
    with running_server((EXAMPLE_MODELS, odd_repo), extra) as proc:
        yield proc


@pytest.fixture
def http(srv: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.base_url, timeout=30.0) as session:
        yield session
    assert srv.alive(), srv.log()


@pytest.fixture
def stub(srv: ServerProcess) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(srv.grpc_url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)
    assert srv.alive(), srv.log()


@pytest.fixture
def raw_channel(srv: ServerProcess) -> Iterator[grpc.Channel]:
    """For messages protobuf cannot build: bytes go out as they are."""
    with grpc.insecure_channel(srv.grpc_url) as channel:
        yield channel


# --- shapes whose element count overflows, or is absurd behind a zero ------------------------


@pytest.mark.parametrize("shape", HUGE_SHAPES)
def test_huge_shape_http_json(http: httpx.Client, shape: list[int]) -> None:
    body = valid_body()
    body["inputs"][0] = json_input("INPUT0", shape, [])
    expect_http(http.post("/v2/models/simple/infer", json=body), 400, "'INPUT0'", OVERFLOW)
    assert_http_serves(http)


@pytest.mark.parametrize("shape", HUGE_SHAPES)
def test_huge_shape_http_binary(http: httpx.Client, shape: list[int]) -> None:
    header = orjson.dumps(
        {
            "inputs": [
                json_input("INPUT0", shape, binary_data_size=0),
                json_input("INPUT1", [1, 16], binary_data_size=64),
            ]
        }
    )
    response = http.post(
        "/v2/models/simple/infer",
        content=header + np.array(B, dtype=np.int32).tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    expect_http(response, 400, "'INPUT0'", OVERFLOW)
    assert_http_serves(http)


def test_shape_past_any_count_http(http: httpx.Client) -> None:
    """Past int64 and past what numpy can even take as a dimension."""
    body = valid_body()
    body["inputs"][0] = json_input("INPUT0", [2**64 - 1, 0], [])
    expect_http(http.post("/v2/models/simple/infer", json=body), 400, OVERFLOW)
    body["inputs"][0] = json_input("INPUT0", [1] * 40, [0])
    expect_http(http.post("/v2/models/simple/infer", json=body), 400, "40 dimensions")
    assert_http_serves(http)


@pytest.mark.parametrize("shape", HUGE_SHAPES)
@pytest.mark.parametrize("form", ["typed", "raw", "no data"])
def test_huge_shape_grpc(
    stub: pb_grpc.GRPCInferenceServiceStub, shape: list[int], form: str
) -> None:
    message = valid_message()
    bad = message.inputs[0]
    del bad.shape[:]
    bad.shape.extend(shape)
    if form == "typed":
        del message.raw_input_contents[:]
        bad.contents.int_contents.extend([])
        bad.contents.SetInParent()
        message.inputs[1].contents.int_contents.extend(B)
    elif form == "raw":
        message.raw_input_contents[0] = b""
    else:
        del message.raw_input_contents[:]
        message.inputs[1].contents.int_contents.extend(B)
    expect_grpc(stub.ModelInfer, message, grpc.StatusCode.INVALID_ARGUMENT, "'INPUT0'", OVERFLOW)
    assert_grpc_serves(stub)


def test_huge_shape_grpc_stream(srv: ServerProcess) -> None:
    """In a stream the error is in-stream, and the stream goes on serving."""
    bad = valid_message("bad")
    bad.inputs[0].shape[:] = [0, 2**62]
    bad.raw_input_contents[0] = b""
    with grpc.insecure_channel(srv.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        answers = list(stub.ModelStreamInfer(iter([bad, valid_message("good")]), timeout=30))
    assert [a.infer_response.id for a in answers] == ["bad", "good"]
    assert OVERFLOW in answers[0].error_message
    assert not answers[1].error_message
    assert_sum(answers[1].infer_response)


# --- shapes of tensors in shared memory, and requested outputs there -------------------------


@pytest.fixture(scope="module")
def region(srv: ServerProcess) -> Iterator[str]:
    """A registered 128-byte system shared-memory region."""
    name = f"bad_input_{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region(name, f"/ge_test_{name}", 128)
    try:
        response = httpx.post(
            f"{srv.base_url}/v2/systemsharedmemory/region/{name}/register",
            json={"key": f"/ge_test_{name}", "offset": 0, "byte_size": 128},
        )
        assert response.status_code == 200, response.text
        yield name
    finally:
        httpx.post(f"{srv.base_url}/v2/systemsharedmemory/region/{name}/unregister")
        shm.destroy_shared_memory_region(handle)


def test_huge_shape_in_shared_memory_http(http: httpx.Client, region: str) -> None:
    body = valid_body()
    body["inputs"][0] = json_input(
        "INPUT0", [0, 2**62], shared_memory_region=region, shared_memory_byte_size=0
    )
    expect_http(http.post("/v2/models/simple/infer", json=body), 400, OVERFLOW)
    assert_http_serves(http)


def test_huge_shape_in_shared_memory_grpc(
    stub: pb_grpc.GRPCInferenceServiceStub, region: str
) -> None:
    message = valid_message()
    del message.raw_input_contents[0]
    bad = message.inputs[0]
    bad.shape[:] = [2**31, 2**31, 0]
    bad.parameters["shared_memory_region"].string_param = region
    bad.parameters["shared_memory_byte_size"].int64_param = 0
    expect_grpc(stub.ModelInfer, message, grpc.StatusCode.INVALID_ARGUMENT, OVERFLOW)
    assert_grpc_serves(stub)


def test_huge_output_window_http(http: httpx.Client, region: str) -> None:
    params = {
        "shared_memory_region": region,
        "shared_memory_offset": 2**64 - 1,
        "shared_memory_byte_size": 2**64 - 1,
    }
    body = valid_body(outputs=[{"name": "OUTPUT0", "parameters": params}])
    expect_http(http.post("/v2/models/simple/infer", json=body), 400, "Invalid offset")
    params["shared_memory_offset"] = 0
    expect_http(http.post("/v2/models/simple/infer", json=body), 400, "Invalid offset + byte size")
    assert_http_serves(http)


def test_huge_output_window_grpc(stub: pb_grpc.GRPCInferenceServiceStub, region: str) -> None:
    message = valid_message()
    output = message.outputs.add(name="OUTPUT0")
    output.parameters["shared_memory_region"].string_param = region
    output.parameters["shared_memory_offset"].uint64_param = 2**64 - 1
    output.parameters["shared_memory_byte_size"].uint64_param = 2**64 - 1
    expect_grpc(stub.ModelInfer, message, grpc.StatusCode.INVALID_ARGUMENT, "Invalid offset")
    assert_grpc_serves(stub)


# --- JSON nested deeper than Python's recursion limit ---------------------------------------


def nested(levels: int, inner: bytes = b"") -> bytes:
    return b"[" * levels + inner + b"]" * levels


def infer_body_with_data(data: bytes) -> bytes:
    head = b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": '
    rest = orjson.dumps(json_input("INPUT1", [1, 16], B))
    return head + data + b"}, " + rest + b"]}"


@pytest.mark.parametrize("levels", [101, 1010, 50_000])
def test_deep_json_data_http(http: httpx.Client, levels: int) -> None:
    """Past our limit, past Python's recursion limit, past orjson's own (1024)."""
    body = infer_body_with_data(nested(levels, b"0"))
    message = expect_http(http.post("/v2/models/simple/infer", content=body), 400)
    assert TOO_DEEP in message or "depth limit exceeded" in message, message
    assert_http_serves(http)


def test_json_data_at_the_depth_limit_http(http: httpx.Client) -> None:
    """100 levels, 'data' itself included, are fine."""
    data = nested(99, orjson.dumps(A))
    response = http.post("/v2/models/simple/infer", content=infer_body_with_data(data))
    assert response.status_code == 200, response.text
    assert_http_serves(http)


@pytest.mark.parametrize(
    "path",
    [
        "/v2/repository/index",
        "/v2/repository/models/simple/unload",
        "/v2/systemsharedmemory/region/deep/register",
        "/v2/logging",
    ],
)
@pytest.mark.parametrize("levels", [1010, 50_000])
def test_deep_json_bodies_http(http: httpx.Client, path: str, levels: int) -> None:
    """Past Python's recursion limit nothing fails; past orjson's (1024) the body is a 400."""
    body = b'{"ready": false, "key": "/k", "byte_size": 1, "parameters": ' + nested(levels) + b"}"
    response = http.post(path, content=body)
    if levels > 1024:
        expect_http(response, 400, "depth limit exceeded")
    else:
        assert response.status_code < 500, response.text
    assert http.get("/v2/models/simple/ready").status_code == 200
    assert_http_serves(http)


def nested_groups(levels: int) -> bytes:
    """Unknown field 99 as nested groups, which protobuf parses recursively (limit 100)."""
    return b"\x9b\x06" * levels + b"\x9c\x06" * levels


@pytest.mark.parametrize(
    ("method", "answer"),
    [
        ("ModelInfer", pb.ModelInferResponse),
        ("RepositoryIndex", pb.RepositoryIndexResponse),
        ("RepositoryModelUnload", pb.RepositoryModelUnloadResponse),
        ("SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterResponse),
        ("LogSettings", pb.LogSettingsResponse),
    ],
)
def test_deep_messages_grpc(
    raw_channel: grpc.Channel,
    stub: pb_grpc.GRPCInferenceServiceStub,
    method: str,
    answer: Any,
) -> None:
    """gRPC's counterpart: a message nested past protobuf's recursion limit, or bytes that
    are no message at all, used to end the call UNKNOWN (grpc's own deserializer failure)."""
    call = raw_channel.unary_unary(
        f"/inference.GRPCInferenceService/{method}",
        request_serializer=None,
        response_deserializer=answer.FromString,
    )
    for data in (nested_groups(50_000), b"\xff\xff\xff"):
        expect_grpc(call, data, grpc.StatusCode.INVALID_ARGUMENT, "failed to decode the")
    assert_grpc_serves(stub)


def test_undecodable_stream_message_grpc(raw_channel: grpc.Channel) -> None:
    call = raw_channel.stream_stream(
        "/inference.GRPCInferenceService/ModelStreamInfer",
        request_serializer=None,
        response_deserializer=pb.ModelStreamInferResponse.FromString,
    )
    messages = [nested_groups(50_000), valid_message("good").SerializeToString()]
    answers = list(call(iter(messages), timeout=30))
    assert "failed to decode the ModelInferRequest message" in answers[0].error_message
    assert answers[1].infer_response.id == "good" and not answers[1].error_message
    assert_sum(answers[1].infer_response)


# --- version strings ------------------------------------------------------------------------


@pytest.mark.parametrize("version", ODD_VERSIONS, ids=["superscript", "arabic", "5000", "20"])
def test_odd_versions_http(http: httpx.Client, version: str) -> None:
    # None of them is a number C's stol reads: Triton's answer for the string itself.
    base = f"/v2/models/simple/versions/{version}"
    for suffix in ("", "/config", "/stats"):
        expect_http(http.get(base + suffix), 400, UNREADABLE_VERSION)
    expect_http(http.post(base + "/infer", json=valid_body()), 400, UNREADABLE_VERSION)
    # Readiness too, as Triton's HandleModelReady reads the version string first.
    expect_http(http.get(base + "/ready"), 400, UNREADABLE_VERSION)
    assert_http_serves(http)


@pytest.mark.parametrize("version", ODD_VERSIONS, ids=["superscript", "arabic", "5000", "20"])
def test_odd_versions_grpc(stub: pb_grpc.GRPCInferenceServiceStub, version: str) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    unknown = UNREADABLE_VERSION
    expect_grpc(
        stub.ModelMetadata, pb.ModelMetadataRequest(name="simple", version=version), invalid
    )
    expect_grpc(stub.ModelConfig, pb.ModelConfigRequest(name="simple", version=version), invalid)
    expect_grpc(
        stub.ModelStatistics,
        pb.ModelStatisticsRequest(name="simple", version=version),
        invalid,
        unknown,
    )
    message = valid_message()
    message.model_version = version
    expect_grpc(stub.ModelInfer, message, invalid, unknown)
    ready = pb.ModelReadyRequest(name="simple", version=version)
    expect_grpc(stub.ModelReady, ready, invalid, unknown)
    assert_grpc_serves(stub)


def test_odd_version_folders_http(http: httpx.Client) -> None:
    """Folders named with a superscript two, an Arabic-Indic one, or a number past int64
    are no versions: only '1' serves."""
    response = http.post("/v2/repository/models/odd_versions/load")
    assert response.status_code == 200, response.text
    response = http.get("/v2/models/odd_versions")
    assert response.status_code == 200, response.text
    assert response.json()["versions"] == ["1"]
    expect_http(http.post("/v2/repository/models/only_odd/load"), 400, "no version folder to serve")
    assert_http_serves(http)


def test_odd_version_folders_grpc(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="odd_versions"))
    metadata = stub.ModelMetadata(pb.ModelMetadataRequest(name="odd_versions"))
    assert list(metadata.versions) == ["1"]
    expect_grpc(
        stub.RepositoryModelLoad,
        pb.RepositoryModelLoadRequest(model_name="only_odd"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "no version folder to serve",
    )
    assert_grpc_serves(stub)


# --- a load API config nested 50 000 levels deep ---------------------------------------------


DEEP_CONFIGS = [
    "[" * 50_000 + "]" * 50_000,
    '{"name": "simple", "parameters": ' + "[" * 50_000 + "]" * 50_000 + "}",
    '{"name": "simple", "parameters": ' + '{"a": ' * 50_000 + "1" + "}" * 50_001,
]


@pytest.mark.parametrize("config", DEEP_CONFIGS, ids=["array", "field", "objects"])
def test_deep_load_config_http(http: httpx.Client, config: str) -> None:
    response = http.post(
        "/v2/repository/models/simple/load", json={"parameters": {"config": config}}
    )
    expect_http(response, 400, "failed to load 'simple'", "not a valid JSON ModelConfig")
    assert_http_serves(http)


@pytest.mark.parametrize("config", DEEP_CONFIGS, ids=["array", "field", "objects"])
def test_deep_load_config_grpc(stub: pb_grpc.GRPCInferenceServiceStub, config: str) -> None:
    request = pb.RepositoryModelLoadRequest(model_name="simple")
    request.parameters["config"].string_param = config
    expect_grpc(
        stub.RepositoryModelLoad,
        request,
        grpc.StatusCode.INVALID_ARGUMENT,
        "failed to load 'simple'",
        "not a valid JSON ModelConfig",
    )
    assert_grpc_serves(stub)
