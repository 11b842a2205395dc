"""How a Python model's mistakes and edge cases look to a client, against the real server:
what Triton's python backend answers, and that one bad request never jams the instance."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pymodels
import pytest
import tritonclient.grpc as grpcclient
from serverproc import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

_INT_IN_OUT = pymodels.MODELS["failing"][1]

# IN=1: execute returns None and never uses the request's response sender.
FORGETS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        value = int(pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()[0])
        if value == 1:
            return None
        out = pb_utils.Tensor("OUT", np.array([value], np.int32))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
"""

# OUT: how many responses exec(decoupled=True) gives for one request to "forgets".
BLS_COUNT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="forgets",
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                requested_output_names=["OUT"],
            )
            count = len(list(call.exec(decoupled=True)))
            out = pb_utils.Tensor("OUT", np.array([count], np.int32))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""

# Answers through the sender, and returns None in that request's place.
SENDS_THEN_NONE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            given = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", given + 1)])
            request.get_response_sender().send(
                response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
        return [None for _ in requests]
"""

# A decoupled model that returns a list, as a default-mode one would.
DECOUPLED_RETURNS = """
class TritonPythonModel:
    def execute(self, requests):
        return []
"""

# Sends with a flag that does not exist.
BAD_FLAG = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        given = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
        response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", given)])
        requests[0].get_response_sender().send(response, flags=2)
        return None
"""

MODELS = {
    "bad_flag": (BAD_FLAG, _INT_IN_OUT),
    "forgets": (FORGETS, _INT_IN_OUT),
    "bls_count": (BLS_COUNT, _INT_IN_OUT),
    "sends_then_none": (SENDS_THEN_NONE, _INT_IN_OUT),
    "decoupled_returns": (
        DECOUPLED_RETURNS,
        # As qa's decoupled_return_response_error: one unnamed group, instance `<model>_0_0`.
        "model_transaction_policy { decoupled: true }\ninstance_group [{ kind: KIND_CPU }]\n"
        + _INT_IN_OUT,
    ),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("python-contract")
    pymodels.write_models(repo, MODELS)
    with running_server([repo]) as proc:
        yield proc


def infer(server: ServerProcess, model: str, value: int) -> httpx.Response:
    return pymodels.infer_in(server.base_url, model, value, 20)


def test_a_request_left_unanswered_fails_and_frees_its_instance(server: ServerProcess) -> None:
    forgotten = infer(server, "forgets", 1)
    assert forgotten.status_code == 500
    assert forgotten.json() == {
        "error": "the model's execute returned None, and sent no response for the request"
    }
    # The one instance serves the next request.
    answered = infer(server, "forgets", 4)
    assert answered.status_code == 200, answered.text
    assert answered.json()["outputs"][0]["data"] == [4]


def test_decoupled_bls_on_a_default_mode_model_yields_its_one_response(
    server: ServerProcess,
) -> None:
    answered = infer(server, "bls_count", 3)
    assert answered.status_code == 200, answered.text
    assert answered.json()["outputs"][0]["data"] == [1]


def test_none_in_the_returned_list_stands_for_a_request_the_sender_answered(
    server: ServerProcess,
) -> None:
    answered = infer(server, "sends_then_none", 6)
    assert answered.status_code == 200, answered.text
    assert answered.json()["outputs"][0]["data"] == [7]


def test_a_decoupled_execute_that_returns_a_list_fails_its_request(
    server: ServerProcess,
) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        client.async_stream_infer("decoupled_returns", [tensor])
        error = answers.get(timeout=20)
        client.stop_stream()
    assert isinstance(error, InferenceServerException)
    assert error.message() == (
        "Python model 'decoupled_returns_0_0' is using the decoupled mode and the execute "
        "function must return None."
    )


def test_a_flag_other_than_final_is_refused(server: ServerProcess) -> None:
    refused = infer(server, "bad_flag", 1)
    assert refused.status_code == 500
    assert "Unable to send response. Unsupported flag provided." in refused.json()["error"]


# auto_complete_config inherited from a module beside model.py, as Triton finds it (the
# class has the attribute), and one that tries to make the model another.
INHERITS = """
from common import Base


class TritonPythonModel(Base):
    pass
"""

BASE = """
import triton_python_backend_utils as pb_utils


class Base:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [-1]})
        config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]})
        return config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
"""

RENAMES = BASE.replace(
    "        return config\n", '        config.as_dict()["name"] = "other"\n        return config\n'
).replace("class Base:", "class TritonPythonModel:")


def test_auto_complete_config_may_be_inherited_but_may_not_rename_the_model(
    tmp_path: Path,
) -> None:
    folder = pymodels.write_model(tmp_path, "inherits", INHERITS, None)
    (folder / "1" / "common.py").write_text(BASE)
    pymodels.write_model(tmp_path, "renames", RENAMES, None)
    with running_server([tmp_path], ["--model-control-mode=explicit"]) as proc:
        loaded = httpx.post(f"{proc.base_url}/v2/repository/models/inherits/load", timeout=60)
        assert loaded.status_code == 200, loaded.text
        assert infer(proc, "inherits", 5).json()["outputs"][0]["data"] == [5]
        refused = httpx.post(f"{proc.base_url}/v2/repository/models/renames/load", timeout=60)
        assert refused.status_code == 400
        assert (
            "auto_complete_config of model 'renames' changed its name to 'other'"
            in (refused.json()["error"])
        )
