"""The generate extension in a real ge-serve, over real sockets: decoupled Python models
stream their responses over /generate_stream as Server-Sent Events, read with httpx as
they arrive; /generate serves a decoupled model that answers once and refuses one that
answers zero or several times; errors mid-stream are events. The `llm` model behaves as
the mock LLM of Triton's own generate-endpoint tests, which these follow."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pymodels
import pytest
from modelgen import add_sub_model, write_model
from polling import poll
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

SSE = "text/event-stream; charset=utf-8"
EXACTLY_ONE = "generate expects model to produce exactly 1 response"

ONNX_ADD_SUB = """
name: "onnx_add_sub"
backend: "onnxruntime"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = pymodels.write(tmp_path_factory.mktemp("generate"), "llm", "repeat", "add_sub")
    write_model(repo, "onnx_add_sub", add_sub_model(), ONNX_ADD_SUB)
    with running_server([repo]) as proc:
        yield proc


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def read_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """Each event's JSON as it arrives; every line is an event's `data:` or the blank
    line that ends it."""
    pending = False
    for line in response.iter_lines():
        if pending:
            assert line == "", line
            pending = False
            continue
        assert line.startswith("data: "), line
        pending = True
        yield json.loads(line.removeprefix("data: "))
    assert not pending, "the stream ended inside an event"


def stream(http: httpx.Client, model: str, body: dict[str, Any]) -> tuple[int, list[Any]]:
    with http.stream("POST", f"/v2/models/{model}/generate_stream", json=body) as response:
        assert response.headers["content-type"] == SSE
        return response.status_code, list(read_events(response))


def llm(prompt: str = "hello world", stream: bool = True, **more: Any) -> dict[str, Any]:
    return {"PROMPT": prompt, "STREAM": stream, **more}


def test_each_response_reaches_the_client_while_the_model_still_runs(
    http: httpx.Client, tmp_path: Path
) -> None:
    # The model sends response i only after the client has created gate file i, which it
    # does on receiving event i - 1: a server that held events back would stall it.
    gate = str(tmp_path / "gate-")
    body = llm(REPETITION=3, GATE=gate)
    found = []
    with http.stream("POST", "/v2/models/llm/generate_stream", json=body) as response:
        assert response.status_code == 200
        for index, event in enumerate(read_events(response), start=1):
            found.append(event)
            Path(gate + str(index)).touch()
    assert found == [{"TEXT": "hello world", "model_name": "llm", "model_version": "1"}] * 3


def test_a_decoupled_model_streams_several_responses(http: httpx.Client) -> None:
    body = {"IN": [10, 20, 30], "DELAY": [0, 50, 50], "WAIT": 0}
    status, events = stream(http, "repeat", body)
    assert status == 200
    assert events == [
        {"IDX": index, "OUT": value, "model_name": "repeat", "model_version": "1"}
        for index, value in enumerate([10, 20, 30])
    ]


def test_the_mock_llm_streams_its_repetitions(http: httpx.Client) -> None:
    status, events = stream(http, "llm", llm(REPETITION=3))
    assert status == 200
    assert events == [{"TEXT": "hello world", "model_name": "llm", "model_version": "1"}] * 3
    # Through the nested parameters too, and with the optional input given.
    body = {"PROMPT": ["hi"], "STREAM": True, "input_ids": [100, 200]}
    status, events = stream(http, "llm", {**body, "parameters": {"REPETITION": 2}})
    assert (status, [e["TEXT"] for e in events]) == (200, ["hi", "hi"])


def test_generate_answers_with_the_one_response(http: httpx.Client) -> None:
    response = http.post("/v2/models/llm/generate", json=llm(stream=False, id="42"))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "TEXT": "hello world",
        "id": "42",
        "model_name": "llm",
        "model_version": "1",
    }
    # One response, then the final flag on its own: still exactly one.
    response = http.post("/v2/models/llm/generate", json=llm(REPETITION=1))
    assert response.status_code == 200, response.text
    assert response.json()["TEXT"] == "hello world"


@pytest.mark.parametrize("repetitions", [0, 2])
def test_generate_refuses_a_model_that_answers_zero_or_several_times(
    http: httpx.Client, repetitions: int
) -> None:
    response = http.post("/v2/models/llm/generate", json=llm(REPETITION=repetitions))
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert EXACTLY_ONE in response.json()["error"]


def test_a_stream_with_no_response_is_empty(http: httpx.Client) -> None:
    assert stream(http, "llm", llm(REPETITION=0)) == (200, [])


def test_an_error_after_the_first_response_is_an_event(http: httpx.Client) -> None:
    status, events = stream(http, "llm", llm(REPETITION=1, FAIL_LAST=True))
    assert status == 200
    assert events[0]["TEXT"] == "hello world"
    assert events[1:] == [{"error": "An Error Occurred"}]


def test_an_error_as_the_first_response_sets_the_status(http: httpx.Client) -> None:
    status, events = stream(http, "llm", llm(REPETITION=0, FAIL_LAST=True))
    assert status == 500
    assert events == [{"error": "An Error Occurred"}]


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "expected number of inputs between 2 and 3 but got 0 inputs for model 'llm'"),
        (
            {"PROMPT": "hello"},
            "expected number of inputs between 2 and 3 but got 1 inputs for model 'llm'",
        ),
        ({"PROMPT": 123, "STREAM": False}, "attempt to access JSON non-string as string"),
        ({"PROMPT": "hello", "STREAM": "false"}, "attempt to access JSON non-boolean as boolean"),
        ({"PROMPT": True, "STREAM": 123}, "attempt to access JSON non-string as string"),
        ({"STREAM": 123, "PROMPT": True}, "attempt to access JSON non-boolean as boolean"),
    ],
)
def test_a_bad_request_is_a_json_error(
    http: httpx.Client, route: str, body: dict[str, Any], message: str
) -> None:
    response = http.post(f"/v2/models/llm/{route}", json=body)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert message in response.json()["error"]


@pytest.mark.parametrize("model", ["add_sub", "onnx_add_sub"])
def test_models_that_are_not_decoupled_answer_both_endpoints(
    http: httpx.Client, model: str
) -> None:
    python = ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")
    names = python if model == "add_sub" else ("A", "B", "SUM", "DIFF")
    body = {names[0]: [1, 2, 3, 4], names[1]: [0.5, 0.5, 0.5, 0.5]}
    expected = {
        names[2]: [1.5, 2.5, 3.5, 4.5],
        names[3]: [0.5, 1.5, 2.5, 3.5],
        "model_name": model,
        "model_version": "1",
    }
    response = http.post(f"/v2/models/{model}/generate", json=body)
    assert response.status_code == 200, response.text
    assert response.json() == expected
    assert stream(http, model, body) == (200, [expected])
    response = http.post(f"/v2/models/{model}/versions/1/generate", json=body)
    assert response.json() == expected
    response = http.post(f"/v2/models/{model}/versions/7/generate", json=body)
    assert response.status_code == 404


def test_a_client_that_goes_away_cancels_its_request(
    http: httpx.Client, server: ServerProcess
) -> None:
    body = llm(REPETITION=50, DELAY=0.1)
    with http.stream("POST", "/v2/models/llm/generate_stream", json=body) as response:
        assert next(read_events(response))["TEXT"] == "hello world"
    # The model asks is_cancelled() before each response and stops.
    poll(lambda: "llm: the request was cancelled" in server.log(), 30, "the model stops")
    assert http.get("/v2/health/ready").status_code == 200
