"""The generate extension in process (httpx over ASGI, ONNX models): the JSON a client
sends and gets back on /generate and /generate_stream, the versions path, and the errors
of requests that fail before they run. Decoupled Python models, and streams read as they
arrive, are in tests/e2e/test_generate_e2e.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from modelgen import add_sub_model, identity_model, make_lifecycle, write_model
from onnx import TensorProto

from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.inference.core import InferenceServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

SSE = "text/event-stream; charset=utf-8"

ADD_SUB = """
name: "add_sub"
backend: "onnxruntime"
max_batch_size: 0
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] }
]
version_policy { all { } }
"""

TEXT = """
name: "text"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

ROWS = """
name: "rows"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 3 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 3 ] } ]
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    """One app for the module: its tests only send requests, none loads or unloads a model."""
    repo = tmp_path_factory.mktemp("generate")
    write_model(repo, "add_sub", add_sub_model(dims=(4,)), ADD_SUB, versions=(1, 2))
    write_model(repo, "text", identity_model(TensorProto.STRING, ("batch", 1)), TEXT)
    write_model(repo, "rows", identity_model(TensorProto.INT32, ("batch", 3)), ROWS)
    lifecycle = make_lifecycle(repo)
    try:
        core = InferenceServer(lifecycle)
        assert await lifecycle.load_many(["add_sub", "text", "rows"]) == {}
        front = HttpFrontEnd(core, HttpSettings(max_input_size=1 << 16, restricted_api=()))
        transport = httpx.ASGITransport(app=front.build())
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client
    finally:
        await lifecycle.close()


def events(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON of each `data:` event; anything else in the body fails the test."""
    assert response.headers["content-type"] == SSE
    found = []
    for block in response.text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        found.append(json.loads(block.removeprefix("data: ")))
    assert response.text.endswith("\n\n") or not response.text
    return found


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    message: str = response.json()["error"]
    return message


ADD_SUB_REQUEST: dict[str, Any] = {
    "A": [1, 2, 3, 4],
    "B": [1, 1, 1, 1.5],
    "id": "7",
    "temperature": 0.5,
}
ADD_SUB_ANSWER = {
    "DIFF": [0.0, 1.0, 2.0, 2.5],
    "SUM": [2.0, 3.0, 4.0, 5.5],
    "id": "7",
    "model_name": "add_sub",
    "model_version": "2",
}


async def test_generate_maps_keys_to_inputs_and_outputs_to_keys(http: httpx.AsyncClient) -> None:
    response = await http.post("/v2/models/add_sub/generate", json=ADD_SUB_REQUEST)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json() == ADD_SUB_ANSWER
    # Triton writes the keys in sorted order.
    assert list(response.json()) == sorted(ADD_SUB_ANSWER)


async def test_generate_stream_on_a_model_that_is_not_decoupled_is_one_event(
    http: httpx.AsyncClient,
) -> None:
    response = await http.post("/v2/models/add_sub/generate_stream", json=ADD_SUB_REQUEST)
    assert response.status_code == 200
    assert events(response) == [ADD_SUB_ANSWER]


async def test_the_versions_path_picks_the_version(http: httpx.AsyncClient) -> None:
    for version in ("1", "2"):
        for route in ("generate", "generate_stream"):
            url = f"/v2/models/add_sub/versions/{version}/{route}"
            response = await http.post(url, json=ADD_SUB_REQUEST)
            assert response.status_code == 200, response.text
            answer = response.json() if route == "generate" else events(response)[0]
            assert answer == {**ADD_SUB_ANSWER, "model_version": version}
    response = await http.post("/v2/models/add_sub/versions/3/generate", json=ADD_SUB_REQUEST)
    assert error_of(response, 404) == "Request for unknown model: 'add_sub' version 3 is not found"


async def test_a_one_element_output_is_a_scalar_and_bytes_are_text(
    http: httpx.AsyncClient,
) -> None:
    # INPUT has dims [1] under a batch dimension: a scalar becomes shape [1, 1].
    response = await http.post("/v2/models/text/generate", json={"INPUT": "héllo"})
    assert response.status_code == 200, response.text
    assert response.json() == {"OUTPUT": "héllo", "model_name": "text", "model_version": "1"}
    response = await http.post("/v2/models/text/generate", json={"INPUT": ["a", "b"]})
    assert response.json()["OUTPUT"] == ["a", "b"]


async def test_the_shape_is_deduced_from_the_model_dims(http: httpx.AsyncClient) -> None:
    # dims [3] with a batch dimension: six values are two rows.
    response = await http.post("/v2/models/rows/generate", json={"INPUT": [1, 2, 3, 4, 5, 6]})
    assert response.status_code == 200, response.text
    assert response.json()["OUTPUT"] == [1, 2, 3, 4, 5, 6]
    response = await http.post("/v2/models/rows/generate", json={"INPUT": [1, 2, 3, 4, 5]})
    assert error_of(response, 400) == (
        "The schema can not convert input 'INPUT' to tensor with proper shape"
    )


async def test_nested_parameters_map_like_top_level_keys(http: httpx.AsyncClient) -> None:
    body = {"B": [1, 1, 1, 1.5], "parameters": {"A": [1, 2, 3, 4], "id": "x"}, "id": "7"}
    response = await http.post("/v2/models/add_sub/generate", json=body)
    assert response.status_code == 200, response.text
    assert response.json() == ADD_SUB_ANSWER
    response = await http.post("/v2/models/add_sub/generate", json={**body, "parameters": 1})
    assert "Expected JSON object for keyword: 'parameters'" in error_of(response, 400)
    body = {**ADD_SUB_REQUEST, "parameters": {"nested": {"twice": 1}}}
    response = await http.post("/v2/models/add_sub/generate", json=body)
    assert error_of(response, 400) == (
        "Converting keyword: 'parameters': parameter 'nested' has invalid type. It should be "
        "either 'int', 'bool', or 'string'."
    )


# (model, body, status, a part of the message)
FAILURES: dict[str, tuple[str, bytes, int, str]] = {
    "unknown model": ("nope", b"{}", 404, "Request for unknown model: 'nope' is not found"),
    "missing input": (
        "add_sub",
        b'{"A": [1, 2, 3, 4]}',
        400,
        "expected 2 inputs but got 1 inputs for model 'add_sub'",
    ),
    "empty body": ("add_sub", b"", 400, "expected 2 inputs but got 0 inputs for model 'add_sub'"),
    "not a number": (
        "add_sub",
        b'{"A": [1, 2, 3, 4], "B": [1, 2, 3, "4"]}',
        400,
        "Unable to parse 'data': attempt to access JSON non-number as double",
    ),
    "not a string": ("text", b'{"INPUT": 5}', 400, "attempt to access JSON non-string as string"),
    "input twice": (
        "add_sub",
        b'{"A": [1, 2, 3, 4], "B": [1, 2, 3, 4], "A": [0, 0, 0, 0]}',
        400,
        "input 'A' already exists in request",
    ),
    "bad JSON": ("add_sub", b'{"A": [1, 2, 3]', 400, "failed to parse the request JSON buffer"),
    "not an object": ("add_sub", b"[1]", 400, "the generate request JSON must be an object"),
    "id not a string": ("add_sub", b'{"id": 5}', 400, "Unable to parse 'id'"),
    "body too large": (
        "rows",
        b'{"big": "' + b"x" * (1 << 16) + b'"}',
        400,
        "exceeds the maximum allowed input size of 65536 bytes",
    ),
    # Under the body limit, but over it as tensors: 4-byte INT32s from 2-byte "1,".
    "tensors too large": (
        "rows",
        b'{"INPUT": [' + b"1," * 17000 + b"1]}",
        400,
        "request size of 0 bytes with input 'INPUT' of size 68004 bytes exceeds the maximum "
        "allowed input size of 65536",
    ),
}


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize("case", FAILURES)
async def test_a_request_that_fails_before_it_runs_is_a_json_error(
    http: httpx.AsyncClient, route: str, case: str
) -> None:
    model, body, status, message = FAILURES[case]
    response = await http.post(f"/v2/models/{model}/{route}", content=body)
    assert message in error_of(response, status)
