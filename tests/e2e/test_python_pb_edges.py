"""Edge cases of `triton_python_backend_utils` as Triton's qa/L0_backend_python tests
them, seen by a client of the real server: the default-mode response sender's rules
(response_sender_test.py), BLS response iterators (bls/model.py) and their cancellation
(decoupled_bls_cancel), and a response without an output the request asked for (the
stub prunes the response to what the model made)."""

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

# Decoupled: OUT=1 every 50 ms, 20 times, unless it was cancelled and IN is 0 (IN=1
# ignores the cancellation); cancelled, it ends with a CANCELLED error response.
UNTIL_CANCELLED = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        request = requests[0]
        ignore = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0]) == 1
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for _ in range(20):
            if not ignore and request.is_cancelled():
                error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=error), flags=final)
                return None
            one = pb_utils.Tensor("OUT", np.array([1], np.int32))
            sender.send(pb_utils.InferenceResponse([one]))
            time.sleep(0.05)
        sender.send(flags=final)
        return None
"""

# Sums until_cancelled's responses and cancels the stream at 5, reading on to its end:
# OUT = sum * 10 + 1 if a CANCELLED error came.
BLS_CANCEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        call = pb_utils.InferenceRequest(
            model_name="until_cancelled",
            inputs=[pb_utils.get_input_tensor_by_name(requests[0], "IN")],
            requested_output_names=["OUT"],
        )
        stream = call.exec(decoupled=True)
        total, cancelled = 0, 0
        for response in stream:
            if response.has_error():
                cancelled = int(response.error().code() == pb_utils.TritonError.CANCELLED)
                break
            out = pb_utils.get_output_tensor_by_name(response, "OUT")
            if out is None:
                continue
            total += int(out.as_numpy()[0])
            if total == 5:
                stream.cancel()
        out = pb_utils.Tensor("OUT", np.array([total * 10 + cancelled], np.int32))
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
    "until_cancelled": (UNTIL_CANCELLED, _DECOUPLED + _INT_IN_OUT),
    "bls_cancel": (BLS_CANCEL, _INT_IN_OUT),
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


def test_a_cancelled_bls_stream_is_marked_and_its_responses_still_come(
    server: ServerProcess,
) -> None:
    # As Triton's qa decoupled_bls_cancel: the called model sees is_cancelled() and ends
    # with a CANCELLED error, which the caller reads from the stream.
    honoured = infer(server, "bls_cancel", 0)
    assert honoured.status_code == 200, honoured.text
    total, cancelled = divmod(honoured.json()["outputs"][0]["data"][0], 10)
    assert cancelled == 1 and 5 <= total < 20
    # A called model that ignores the cancellation sends all its responses, and the
    # caller reads them all (qa test_decoupled_bls_ignore_cancel).
    ignored = infer(server, "bls_cancel", 1)
    assert ignored.status_code == 200, ignored.text
    assert ignored.json()["outputs"][0]["data"] == [200]
