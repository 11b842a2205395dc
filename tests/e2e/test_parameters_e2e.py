"""The parameters extension: a request's custom parameters reach the model
(`request.parameters()`), and the parameters a model gives its responses reach the client,
over HTTP and gRPC, for plain and decoupled models."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from pymodels import write_model
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PARAMS = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)

    def execute(self, requests):
        responses = []
        for request in requests:
            seen = request.parameters()
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out = [pb_utils.Tensor("OUT", value)]
            if self.decoupled:
                sender = request.get_response_sender()
                for index in range(2):
                    params = {"seen": seen, "index": index, "last": index == 1}
                    sender.send(pb_utils.InferenceResponse(out, parameters=params))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                # bool, int and str: Triton's python backend refuses any other type.
                params = {"seen": seen, "count": 3, "flag": True}
                responses.append(pb_utils.InferenceResponse(out, parameters=params))
        return None if self.decoupled else responses
"""

CONFIG = """
name: "{name}"
backend: "python"
{extra}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""

SENT = {"custom": "value", "number": 7, "switch": False}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("models")
    write_model(repo, "params", PARAMS, CONFIG.format(name="params", extra=""))
    decoupled = "model_transaction_policy { decoupled: true }"
    write_model(repo, "params_stream", PARAMS, CONFIG.format(name="params_stream", extra=decoupled))
    with running_server([repo]) as proc:
        yield proc


def one(module: Any) -> list[Any]:
    tensor = module.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([5], dtype=np.int32))
    return [tensor]


def test_http(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer("params", one(httpclient), parameters=SENT)
    params = result.get_response()["parameters"]
    assert json.loads(params["seen"]) == SENT
    assert (params["count"], params["flag"]) == (3, True)
    client.close()


def test_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer("params", one(grpcclient), parameters=SENT)
    params = result.get_response().parameters
    assert json.loads(params["seen"].string_param) == SENT
    assert params["count"].int64_param == 3
    assert params["flag"].bool_param is True
    client.close()


def test_decoupled_responses_carry_their_parameters(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), answers))
    client.async_stream_infer("params_stream", one(grpcclient), parameters=SENT)
    seen = []
    for _ in range(2):
        result, error = answers.get(timeout=30)
        assert error is None, error
        params = result.get_response().parameters
        assert json.loads(params["seen"].string_param) == SENT
        seen.append((params["index"].int64_param, params["last"].bool_param))
    client.stop_stream()
    client.close()
    assert seen == [(0, False), (1, True)]
