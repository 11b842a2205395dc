"""What Triton's qa/L0_backend_python tests expect of the server, against the real one:
a model with no inputs, a model's error codes, BLS error texts, and custom metrics."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pymodels
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serverproc import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

# Makes its output itself, as qa's bls and custom_metrics models do (no inputs).
NO_INPUT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = pb_utils.Tensor("OUTPUT0", np.array([1.5], np.float32))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
"""
_NO_INPUT_CONFIG = 'output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }]\n'

# Fails its request with the code its CODE input names, as qa's error_code model does.
ERROR_CODE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy()[0]
            code = getattr(pb_utils.TritonError, name.decode())
            error = pb_utils.TritonError("error code test", code)
            responses.append(pb_utils.InferenceResponse(error=error))
        return responses
"""
_ERROR_CODE_CONFIG = """
input [{ name: "CODE", data_type: TYPE_STRING, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] }]
"""

# Calls a model that does not exist, as qa's bls test_bls_sync does; answers the error.
BLS_UNKNOWN = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        call = pb_utils.InferenceRequest(
            model_name="non_existent_model", inputs=[], requested_output_names=[]
        )
        errors = [call.exec().error().message()]
        errors += [r.error().message() for r in call.exec(decoupled=True) if r.has_error()]
        out = pb_utils.Tensor("ERRORS", np.array(errors, np.object_))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
"""
_BLS_UNKNOWN_CONFIG = 'output [{ name: "ERRORS", data_type: TYPE_STRING, dims: [ -1 ] }]\n'

MODELS = {
    "no_input": (NO_INPUT, _NO_INPUT_CONFIG),
    "error_code": (ERROR_CODE, _ERROR_CODE_CONFIG),
    "bls_unknown": (BLS_UNKNOWN, _BLS_UNKNOWN_CONFIG),
    "add_sub": pymodels.MODELS["add_sub"],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("python-qa-parity")
    for name, (source, config) in MODELS.items():
        pymodels.write_model(repo, name, source, f'name: "{name}"\nbackend: "python"\n{config}')
    with running_server([repo]) as proc:
        yield proc


def test_a_model_with_no_inputs_loads_and_answers_a_request_with_none(
    server: ServerProcess,
) -> None:
    as_json = httpx.post(f"{server.base_url}/v2/models/no_input/infer", json={"inputs": []})
    assert as_json.status_code == 200, as_json.text
    assert as_json.json()["outputs"][0]["data"] == [1.5]
    with httpclient.InferenceServerClient(server.http_url) as client:
        binary = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
        result = client.infer("no_input", [], outputs=binary)
        assert result.as_numpy("OUTPUT0").tolist() == [1.5]
        assert client.get_model_metadata("no_input")["inputs"] == []
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.infer("no_input", []).as_numpy("OUTPUT0").tolist() == [1.5]


@pytest.mark.parametrize(
    ("code", "http_status", "grpc_status"),
    [
        ("UNKNOWN", 400, grpc.StatusCode.UNKNOWN),
        ("INTERNAL", 500, grpc.StatusCode.INTERNAL),
        ("NOT_FOUND", 404, grpc.StatusCode.NOT_FOUND),
        ("INVALID_ARG", 400, grpc.StatusCode.INVALID_ARGUMENT),
        ("UNSUPPORTED", 501, grpc.StatusCode.UNIMPLEMENTED),
    ],
)
def test_a_models_error_code_is_the_status_triton_answers(
    server: ServerProcess, code: str, http_status: int, grpc_status: grpc.StatusCode
) -> None:
    body = {"inputs": [{"name": "CODE", "datatype": "BYTES", "shape": [1], "data": [code]}]}
    answered = httpx.post(f"{server.base_url}/v2/models/error_code/infer", json=body)
    assert answered.status_code == http_status, answered.text
    assert answered.json() == {"error": "error code test"}
    tensor = grpcclient.InferInput("CODE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([code.encode()], np.object_))
    with (
        grpcclient.InferenceServerClient(server.grpc_url) as client,
        pytest.raises(InferenceServerException) as caught,
    ):
        client.infer("error_code", [tensor])
    assert caught.value.status() == str(grpc_status)
    assert caught.value.message() == "error code test"


def test_a_bls_call_to_an_unknown_model_fails_with_python_backends_words(
    server: ServerProcess,
) -> None:
    answered = httpx.post(f"{server.base_url}/v2/models/bls_unknown/infer", json={"inputs": []})
    assert answered.status_code == 200, answered.text
    expected = (
        "Model non_existent_model - Error when running inference: Request for unknown "
        "model: 'non_existent_model' is not found"
    )
    assert answered.json()["outputs"][0]["data"] == [expected, expected]


def test_too_few_inputs_is_said_before_a_wrong_data_type(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP64", "shape": [4], "data": [0] * 4}]}
    answered = httpx.post(f"{server.base_url}/v2/models/add_sub/infer", json=body)
    assert answered.status_code == 400
    assert answered.json() == {
        "error": "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model "
        "'add_sub'. Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. "
        "Please provide all required input(s)."
    }
