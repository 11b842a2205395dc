"""Edge cases of `triton_python_backend_utils` as Triton's qa/L0_backend_python tests
them, seen by a client of the real server: the default-mode response sender's rules
(response_sender_test.py), BLS response iterators (bls/model.py), and a response without
an output the request asked for (the stub prunes the response to what the model made)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pymodels
import pytest
from protocols import PROTOCOLS, Triton
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

_INT_IN_OUT = pymodels.MODELS["failing"][1]

# A default-mode model answering through its response sender, as qa's response_sender
# does: IN=1 sends twice, IN=2 sends, sends the final flag and returns a response too,
# IN=3 sends the final flag alone.
SENDER_EDGES = """
import numpy as np
import triton_python_backend_utils as pb_utils


def response(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    def execute(self, requests):
        request = requests[0]
        case = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if case == 1:
            sender.send(response(1000))
            sender.send(response(1001))
            sender.send(flags=final)
            return None
        if case == 2:
            sender.send(response(1000))
            sender.send(flags=final)
            return [response(0)]
        sender.send(flags=final)
        return None
"""

# Decoupled: IN responses of OUT=1..IN, then the final flag alone.
REPEAT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            for value in range(1, count + 1):
                out = pb_utils.Tensor("OUT", np.array([value], np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Iterates one decoupled BLS call's responses twice: OUT = first count * 100 + second.
BLS_REITERATE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        call = pb_utils.InferenceRequest(
            model_name="repeat",
            inputs=[pb_utils.get_input_tensor_by_name(requests[0], "IN")],
            requested_output_names=["OUT"],
        )
        stream = call.exec(decoupled=True)
        first = list(stream)
        second = list(stream)
        assert all(a is b for a, b in zip(first, second))
        out = pb_utils.Tensor("OUT", np.array([len(first) * 100 + len(second)], np.int32))
        return [pb_utils.InferenceResponse([out])]
"""

# Two outputs in its config, only OUT in its responses.
ONE_OF_TWO = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
        return responses
"""

_DECOUPLED = "model_transaction_policy { decoupled: true }\n"
_TWO_OUTPUTS = (
    'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, '
    '{ name: "OTHER" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
)

MODELS = {
    "sender_edges": (SENDER_EDGES, _INT_IN_OUT),
    "repeat": (REPEAT, _DECOUPLED + _INT_IN_OUT),
    "bls_reiterate": (BLS_REITERATE, _INT_IN_OUT),
    "one_of_two": (ONE_OF_TWO, _TWO_OUTPUTS),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("python-pb-edges")
    pymodels.write_models(repo, MODELS)
    with running_server([repo]) as proc:
        yield proc


def infer(server: ServerProcess, model: str, value: int) -> httpx.Response:
    return pymodels.infer_in(server.base_url, model, value, 30)


def test_a_second_send_raises_in_the_model_and_the_client_gets_the_first(
    server: ServerProcess,
) -> None:
    answered = infer(server, "sender_edges", 1)
    assert answered.status_code == 200, answered.text
    assert answered.json()["outputs"][0]["data"] == [1000]


def test_a_response_returned_after_the_sender_closed_is_not_the_one_delivered(
    server: ServerProcess,
) -> None:
    answered = infer(server, "sender_edges", 2)
    assert answered.status_code == 200, answered.text
    assert answered.json()["outputs"][0]["data"] == [1000]


def test_a_final_flag_before_any_response_raises_in_the_model(server: ServerProcess) -> None:
    refused = infer(server, "sender_edges", 3)
    assert refused.status_code == 500
    assert (
        "Unable to send response. Non-decoupled model cannot send complete final before "
        "sending a response." in refused.json()["error"]
    )
    # The instance still serves.
    assert infer(server, "sender_edges", 2).status_code == 200


def test_a_finished_response_iterator_iterated_again_yields_its_responses_again(
    server: ServerProcess,
) -> None:
    answered = infer(server, "bls_reiterate", 3)
    assert answered.status_code == 200, answered.text
    # Three responses and the empty last one, twice.
    assert answered.json()["outputs"][0]["data"] == [404]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_output_asked_for_and_not_made_is_left_out_of_the_response(
    protocol: str, server: ServerProcess
) -> None:
    triton = Triton.connect(protocol, server)
    try:
        value = np.array([7], np.int32)
        result = triton.infer("one_of_two", {"IN": value}, outputs=["OUT", "OTHER"])
        np.testing.assert_array_equal(result.as_numpy("OUT"), value)
        assert result.as_numpy("OTHER") is None
        result = triton.infer("one_of_two", {"IN": value}, outputs=["OTHER"])
        assert result.as_numpy("OTHER") is None
    finally:
        triton.close()
