"""Bad requests end to end: each gets a 4xx with a clear `{"error": ...}`, and the server
stays live after every one of them."""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from serverproc import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

MAX_INPUT = 64 * 1024


@pytest.fixture(scope="module")
def bad_server() -> Iterator[ServerProcess]:
    """A server of its own, with a small --http-max-input-size."""
    with running_server(extra=["--http-max-input-size", str(MAX_INPUT)]) as proc:
        yield proc


@pytest.fixture
def http(bad_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=bad_server.base_url, timeout=30.0) as session:
        yield session
    # Whatever the test sent, the server is still up and live.
    assert bad_server.alive(), bad_server.log()
    assert httpx.get(bad_server.base_url + "/v2/health/live").status_code == 200


def json_input(name: str, data: Any, shape: list[int], datatype: str = "INT32") -> dict[str, Any]:
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


def simple_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [
            json_input("INPUT0", list(range(16)), [1, 16]),
            json_input("INPUT1", [1] * 16, [1, 16]),
        ]
    }
    body.update(changes)
    return body


def binary_body(inputs: list[tuple[str, str, list[int], bytes]], **extra: Any) -> tuple[bytes, int]:
    header = {
        "inputs": [
            {"name": n, "shape": s, "datatype": d, "parameters": {"binary_data_size": len(raw)}}
            for n, d, s, raw in inputs
        ],
        **extra,
    }
    head = orjson.dumps(header)
    return head + b"".join(raw for *_, raw in inputs), len(head)


def simple_binary() -> tuple[bytes, int]:
    a = np.arange(16, dtype=np.int32).tobytes()
    b = np.ones(16, dtype=np.int32).tobytes()
    return binary_body([("INPUT0", "INT32", [1, 16], a), ("INPUT1", "INT32", [1, 16], b)])


def expect_error(response: httpx.Response, status: int, *fragments: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    message = response.json()["error"]
    assert isinstance(message, str) and message
    for fragment in fragments:
        assert fragment in message, message
    return message


def post_binary(
    http: httpx.Client, body: bytes, header_length: int | str, model: str = "simple", **headers: str
) -> httpx.Response:
    return http.post(
        f"/v2/models/{model}/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(header_length), **headers},
    )


# --- the request is fine, as a baseline ------------------------------------------------------


def test_valid_requests_pass(http: httpx.Client) -> None:
    assert http.post("/v2/models/simple/infer", json=simple_body()).status_code == 200
    body, length = simple_binary()
    assert post_binary(http, body, length).status_code == 200


# --- JSON and tensor contents ------------------------------------------------------------------


def test_malformed_json(http: httpx.Client) -> None:
    response = http.post("/v2/models/simple/infer", content=b'{"inputs": [')
    expect_error(response, 400, "failed to parse the request JSON buffer")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"", "failed to parse the request JSON buffer"),
        (b"[1, 2]", "must be an object, not an array"),
        (b"{}", "the request JSON has no 'inputs'"),
        (b'{"inputs": 3}', "'inputs' must be an array"),
        # Triton's order: the datatype is read before the shape.
        (b'{"inputs": [{"name": "INPUT0"}]}', "input 'INPUT0' has no 'datatype'"),
        (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32"}]}', "input 'INPUT0' has no 'shape'"),
        (b'{"inputs": [], "id": 5}', "the request 'id' must be a string"),
    ],
)
def test_malformed_request_documents(http: httpx.Client, body: bytes, fragment: str) -> None:
    expect_error(http.post("/v2/models/simple/infer", content=body), 400, fragment)


def test_wrong_dtype(http: httpx.Client) -> None:
    body = simple_body()
    body["inputs"][0] = json_input("INPUT0", [0.5] * 16, [1, 16], "FP32")
    expect_error(
        http.post("/v2/models/simple/infer", json=body),
        400,
        "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'",
    )


def test_unknown_datatype(http: httpx.Client) -> None:
    body = simple_body()
    body["inputs"][0]["datatype"] = "INT128"
    expect_error(http.post("/v2/models/simple/infer", json=body), 400, "invalid datatype 'INT128'")


def test_wrong_shape(http: httpx.Client) -> None:
    body = simple_body()
    body["inputs"][0] = json_input("INPUT0", list(range(8)), [1, 8])
    expect_error(
        http.post("/v2/models/simple/infer", json=body),
        400,
        "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,8]",
    )


def test_data_count_does_not_match_shape(http: httpx.Client) -> None:
    body = simple_body()
    body["inputs"][0] = json_input("INPUT0", list(range(15)), [1, 16])
    expect_error(
        http.post("/v2/models/simple/infer", json=body),
        400,
        "Failed to parse 'data' field: shape does not match true shape",
    )


def test_value_out_of_range(http: httpx.Client) -> None:
    body = simple_body()
    body["inputs"][0] = json_input("INPUT0", [2**40] * 16, [1, 16])
    expect_error(http.post("/v2/models/simple/infer", json=body), 400, "out of range for INT32")


def test_batch_over_the_maximum(http: httpx.Client) -> None:
    body = simple_body(
        inputs=[
            json_input("INPUT0", [0] * 16 * 9, [9, 16]),
            json_input("INPUT1", [0] * 16 * 9, [9, 16]),
        ]
    )
    expect_error(
        http.post("/v2/models/simple/infer", json=body),
        400,
        "inference request batch-size must be <= 8 for 'simple'",
    )


def test_missing_input(http: httpx.Client) -> None:
    body = simple_body()
    del body["inputs"][1]
    expect_error(
        http.post("/v2/models/simple/infer", json=body),
        400,
        "expected 2 inputs but got 1 inputs",
        "missing required input(s) ['INPUT1']",
    )


def test_unknown_input_and_output(http: httpx.Client) -> None:
    body = simple_body()
    body["inputs"].append(json_input("INPUT7", [0] * 16, [1, 16]))
    expect_error(
        http.post("/v2/models/simple/infer", json=body),
        400,
        "unexpected inference input 'INPUT7' for model 'simple'",
    )
    body = simple_body(outputs=[{"name": "OUTPUT7"}])
    expect_error(
        http.post("/v2/models/simple/infer", json=body),
        400,
        "unexpected inference output 'OUTPUT7' for model 'simple'",
    )


def test_classification_of_bytes_output(http: httpx.Client) -> None:
    body = {
        "inputs": [
            json_input("INPUT0", ["1"] * 16, [1, 16], "BYTES"),
            json_input("INPUT1", ["2"] * 16, [1, 16], "BYTES"),
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}],
    }
    expect_error(
        http.post("/v2/models/simple_string/infer", json=body),
        400,
        "class result not available for output due to unsupported type 'BYTES'",
    )


def test_half_precision_as_json(http: httpx.Client) -> None:
    body = simple_body()
    body["inputs"][0] = json_input("INPUT0", [0.5] * 16, [1, 16], "FP16")
    expect_error(
        http.post("/v2/models/simple/infer", json=body),
        400,
        "receiving FP16 data via JSON is not supported",
    )


@pytest.mark.parametrize("key", ["triton_enable_empty_final_response", "triton_x"])
def test_reserved_parameter(http: httpx.Client, key: str) -> None:
    response = http.post("/v2/models/simple/infer", json=simple_body(parameters={key: True}))
    expect_error(response, 400, f"'{key}'", "reserved")


@pytest.mark.parametrize("key", ["priority", "timeout"])
@pytest.mark.parametrize("value", [-1, "high", 1.5, True, 2**64])
def test_bad_priority_or_timeout(http: httpx.Client, key: str, value: Any) -> None:
    response = http.post("/v2/models/simple/infer", json=simple_body(parameters={key: value}))
    # Triton's words: its HTTP front end reads both as JSON unsigned integers.
    message = expect_error(response, 400)
    assert message == (
        f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as unsigned-integer"
    )


# --- models and versions -----------------------------------------------------------------------


def test_unknown_model(http: httpx.Client) -> None:
    for path in ("/v2/models/nope/infer", "/v2/models/nope/versions/1/infer"):
        expect_error(
            http.post(path, json=simple_body()),
            404,
            "Request for unknown model: 'nope' is not found",
        )
    expect_error(http.get("/v2/models/nope"), 404, "'nope' is not found")
    expect_error(http.get("/v2/models/nope/config"), 404, "'nope' is not found")


@pytest.mark.parametrize("version", ["3", "0", "5abc"])
def test_unknown_version(http: httpx.Client, version: str) -> None:
    path = f"/v2/models/simple/versions/{version}"
    message = f"Request for unknown model: 'simple' version {version} is not found"
    expect_error(http.post(path + "/infer", json=simple_body()), 404, message)
    expect_error(http.get(path), 404, message)
    expect_error(http.get(path + "/config"), 404, message)


def test_a_version_string_that_is_no_number(http: httpx.Client) -> None:
    # Triton's words: C's stol cannot read it.
    path = "/v2/models/simple/versions/abc"
    message = (
        "failed to get model version from specified version string 'abc' (details: stol), "
        "version should be an integral value > 0"
    )
    expect_error(http.post(path + "/infer", json=simple_body()), 400, message)
    expect_error(http.get(path), 400, message)
    expect_error(http.get(path + "/config"), 400, message)


def test_tritonclient_sees_the_message(bad_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(bad_server.http_url)
    try:
        # Both inputs: with one, Triton's count check (too few inputs) would answer first.
        inputs = [httpclient.InferInput(name, [1, 8], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.zeros((1, 8), np.int32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("simple", inputs)
        assert "unexpected shape for input 'INPUT0'" in info.value.message()
        assert info.value.status() == "400"
        with pytest.raises(InferenceServerException) as info:
            client.infer("nope", inputs)
        assert "Request for unknown model: 'nope' is not found" in info.value.message()
    finally:
        client.close()


# --- the binary tensor extension ---------------------------------------------------------------


def test_header_length_larger_than_the_body(http: httpx.Client) -> None:
    body, _ = simple_binary()
    expect_error(
        post_binary(http, body, len(body) + 10),
        400,
        "invalid Inference-Header-Content-Length",
        f"has {len(body)} bytes",
    )


def test_header_length_shorter_than_the_json(http: httpx.Client) -> None:
    body, length = simple_binary()
    expect_error(post_binary(http, body, length - 5), 400, "failed to parse the request JSON")


def test_header_length_not_a_number(http: httpx.Client) -> None:
    body, _ = simple_binary()
    expect_error(
        post_binary(http, body, "12abc"),
        400,
        "invalid Inference-Header-Content-Length header value '12abc'",
    )


@pytest.mark.parametrize(
    "spelling",
    [
        lambda n: "_".join(str(n)).encode(),  # 2_1_0: int() reads 210
        lambda n: b"+%d" % n,
        lambda n: b"0x%x" % n,
        # Latin-1 bytes that int() takes for whitespace, as the value is decoded.
        lambda n: b"%d\xa0" % n,
        lambda n: b"\x85%d" % n,
    ],
    ids=["underscores", "plus", "hex", "nbsp", "nel"],
)
def test_header_length_only_in_ascii_digits(http: httpx.Client, spelling: Any) -> None:
    body, length = simple_binary()
    value = spelling(length)
    response = http.post(
        "/v2/models/simple/infer",
        content=body,
        headers={"Inference-Header-Content-Length": value},
    )
    expect_error(
        response,
        400,
        f"invalid Inference-Header-Content-Length header value '{value.decode('latin-1')}'",
    )
    # The same length in ASCII digits is read.
    assert post_binary(http, body, length).status_code == 200


@pytest.mark.parametrize(
    ("key", "value"),
    [("trace_rate", "1_0"), ("trace_rate", "+5"), ("trace_count", " 5"), ("log_frequency", "٢")],
)
def test_trace_settings_only_in_ascii_digits(http: httpx.Client, key: str, value: str) -> None:
    before = http.get("/v2/trace/setting").json()
    response = http.post("/v2/trace/setting", json={key: value})
    expect_error(response, 400, f"Unable to parse '{key}', got: {value}")
    assert http.get("/v2/trace/setting").json() == before


def test_header_length_negative(http: httpx.Client) -> None:
    body, _ = simple_binary()
    expect_error(post_binary(http, body, -1), 400, "invalid Inference-Header-Content-Length -1")


def test_truncated_binary(http: httpx.Client) -> None:
    body, length = simple_binary()
    expect_error(
        post_binary(http, body[:-10], length),
        400,
        "unexpected size for input 'INPUT1', expecting 10 additional bytes for model 'simple'",
    )


def test_extra_binary_bytes(http: httpx.Client) -> None:
    body, length = simple_binary()
    expect_error(
        post_binary(http, body + b"\0" * 8, length), 400, "unexpected additional input data"
    )


def test_binary_size_does_not_match_the_shape(http: httpx.Client) -> None:
    a = np.arange(16, dtype=np.int32).tobytes()
    body, length = binary_body(
        [("INPUT0", "INT32", [1, 16], a[:-4]), ("INPUT1", "INT32", [1, 16], a)]
    )
    expect_error(
        post_binary(http, body, length),
        400,
        "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60",
    )


def test_binary_data_without_the_header(http: httpx.Client) -> None:
    body, length = simple_binary()
    response = http.post("/v2/models/simple/infer", content=body[:length])
    expect_error(response, 400, "must specify valid 'Infer-Header-Content-Length'")


def test_bytes_length_prefix_overruns(http: httpx.Client) -> None:
    element = struct.pack("<I", 1000) + b"12"
    rest = b"".join(struct.pack("<I", 1) + b"1" for _ in range(16))
    body, length = binary_body(
        [("INPUT0", "BYTES", [1, 16], element), ("INPUT1", "BYTES", [1, 16], rest)]
    )
    expect_error(
        post_binary(http, body, length, model="simple_string"),
        400,
        "[request id: <id_unknown>] input 'INPUT0': BYTES element 0 has length 1000, which "
        "overruns the buffer",
    )


def test_bytes_element_count_short(http: httpx.Client) -> None:
    few = b"".join(struct.pack("<I", 1) + b"1" for _ in range(3))
    body, length = binary_body(
        [("INPUT0", "BYTES", [1, 16], few), ("INPUT1", "BYTES", [1, 16], few)]
    )
    expect_error(
        post_binary(http, body, length, model="simple_string"),
        400,
        "[request id: <id_unknown>] expected 16 string elements for inference input 'INPUT0' "
        "for model 'simple_string', got 3",
    )


def test_raw_binary_needs_a_single_input_model(http: httpx.Client) -> None:
    expect_error(
        post_binary(http, b"\0" * 128, 0),
        400,
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced "
        "but got 2 inputs in 'simple' model configuration",
    )


def test_raw_binary_of_the_wrong_size(http: httpx.Client) -> None:
    expect_error(
        post_binary(http, b"\0" * 100, 0, model="image_classifier"),
        400,
        "[request id: <id_unknown>] input byte size mismatch for input",
    )


# --- body size and compression -----------------------------------------------------------------


def test_oversized_body(http: httpx.Client) -> None:
    response = http.post("/v2/models/simple/infer", content=b" " * (MAX_INPUT + 1))
    expect_error(response, 400, "exceeds the maximum allowed input size", "--http-max-input-size")
    response = http.post("/v2/models/simple/infer", content=b" " * (1024 * 1024))
    expect_error(response, 400, "exceeds the maximum allowed input size")


def test_oversized_chunked_body(http: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b" " * 4096

    response = http.post("/v2/models/simple/infer", content=chunks())
    expect_error(response, 400, "exceeds the maximum allowed input size")


def test_body_at_the_limit_is_read(http: httpx.Client) -> None:
    document = orjson.dumps(simple_body())
    padded = document + b" " * (MAX_INPUT - len(document))
    assert http.post("/v2/models/simple/infer", content=padded).status_code == 200


def test_oversized_after_decompression(http: httpx.Client) -> None:
    bomb = gzip.compress(b" " * (4 * MAX_INPUT))
    assert len(bomb) < MAX_INPUT
    response = http.post(
        "/v2/models/simple/infer", content=bomb, headers={"Content-Encoding": "gzip"}
    )
    expect_error(
        response,
        400,
        f"exceeds the maximum allowed value of {MAX_INPUT} bytes",
        "--http-max-input-size",
    )


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_bad_compressed_body(http: httpx.Client, encoding: str) -> None:
    response = http.post(
        "/v2/models/simple/infer",
        content=b"this is not compressed at all",
        headers={"Content-Encoding": encoding},
    )
    expect_error(response, 400, "failed to decompress request body")


def test_truncated_gzip(http: httpx.Client) -> None:
    packed = gzip.compress(orjson.dumps(simple_body()))
    response = http.post(
        "/v2/models/simple/infer", content=packed[:-12], headers={"Content-Encoding": "gzip"}
    )
    expect_error(response, 400, "failed to decompress request body")


def test_unsupported_content_encoding(http: httpx.Client) -> None:
    response = http.post(
        "/v2/models/simple/infer",
        content=orjson.dumps(simple_body()),
        headers={"Content-Encoding": "br"},
    )
    expect_error(response, 400, "unsupported Content-Encoding 'br'")


# --- other routes -------------------------------------------------------------------------------


def test_repository_index_bad_body(http: httpx.Client) -> None:
    expect_error(http.post("/v2/repository/index", content=b"{oops"), 400, "failed to parse")
    expect_error(
        http.post("/v2/repository/index", json={"ready": "yes"}),
        400,
        "Invalid value for 'ready': expected a boolean",
    )
