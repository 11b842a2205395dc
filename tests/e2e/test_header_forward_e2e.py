"""`--http-header-forward-pattern`, `--grpc-header-forward-pattern` (Triton's
qa/L0_parameters test_headers, test_headers_reserved_rejected): the headers (metadata)
whose names match, in any case, reach the model as string parameters, over HTTP, gRPC and
a gRPC stream, served in the server process and by front-end workers; a matching header
named as a reserved parameter is refused 400 / INVALID_ARGUMENT."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from functools import partial
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from pymodels import write_model
from serverproc import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ECHO = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out = [pb_utils.Tensor("OUT", value)]
            params = {"seen": request.parameters()}
            responses.append(pb_utils.InferenceResponse(out, parameters=params))
        return responses
"""

CONFIG = """
name: "echo"
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# Triton's qa pattern, which it reads case-insensitively; the reserved names are matched so
# that their refusal can be seen.
PATTERN = "MY_HEADER.*|^triton_|^priority$|^sequence_id$"
HEADERS = {"header_1": "value_1", "my_header_1": "my_value_1", "my_header_2": 'a "quoted" \\'}
EXPECTED = {"my_header_1": "my_value_1", "my_header_2": 'a "quoted" \\'}
BODY = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [5]}]}
RESERVED = ("triton_x", "priority", "sequence_id")


@pytest.fixture(scope="module", params=["in-process", "workers"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("models")
    write_model(repo, "echo", ECHO, CONFIG)
    extra = [f"--http-header-forward-pattern={PATTERN}", f"--grpc-header-forward-pattern={PATTERN}"]
    if request.param == "workers":
        extra += ["--http-workers=1", "--grpc-workers=1"]
    with running_server([repo], extra) as proc:
        yield proc


def http_seen(server: ServerProcess, headers: dict[str, str], body: Any = BODY) -> Any:
    answer = httpx.post(
        f"http://{server.http_url}/v2/models/echo/infer", json=body, headers=headers
    )
    assert answer.status_code == 200, answer.text
    return json.loads(answer.json()["parameters"]["seen"])


def one() -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([5], dtype=np.int32))
    return [tensor]


def test_http_forwards_the_matching_headers(server: ServerProcess) -> None:
    assert http_seen(server, HEADERS) == EXPECTED


def test_http_a_header_wins_over_the_body_parameter_of_its_name(server: ServerProcess) -> None:
    body = {**BODY, "parameters": {"my_header_1": "from the body", "other": 3}}
    seen = http_seen(server, {"my_header_1": "from the header"}, body)
    assert seen == {"my_header_1": "from the header", "other": 3}


def test_grpc_forwards_the_matching_metadata(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer("echo", one(), headers=HEADERS, parameters={"key": "value"})
    seen = json.loads(result.get_response().parameters["seen"].string_param)
    client.close()
    assert seen == {"key": "value", **EXPECTED}


def test_grpc_stream_forwards_the_stream_metadata(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(
        callback=partial(lambda q, result, error: q.put((result, error)), answers),
        headers=HEADERS,
    )
    for _ in range(2):
        client.async_stream_infer("echo", one())
    for _ in range(2):
        result, error = answers.get(timeout=30)
        assert error is None, error
        assert json.loads(result.get_response().parameters["seen"].string_param) == EXPECTED
    client.stop_stream()
    client.close()


@pytest.mark.parametrize("name", RESERVED)
def test_a_reserved_header_is_refused(server: ServerProcess, name: str) -> None:
    url = f"http://{server.http_url}/v2/models/echo/infer"
    answer = httpx.post(url, json=BODY, headers={name: "dummy-value"})
    message = f"Header '{name}' is reserved for Triton usage and cannot be forwarded."
    assert (answer.status_code, answer.json()) == (400, {"error": message})

    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("echo", one(), headers={name: "dummy-value"})
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert caught.value.message() == message

    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(
        callback=partial(lambda q, result, error: q.put((result, error)), answers),
        headers={name: "dummy-value"},
    )
    client.async_stream_infer("echo", one())
    result, error = answers.get(timeout=30)
    client.stop_stream()
    client.close()
    assert result is None and message in str(error)
