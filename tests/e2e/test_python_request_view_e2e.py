"""What a Python model sees of a request, against the real server: Triton's
`request.correlation_id()` and `request.flags()`, sequence parameters kept out of
`request.parameters()`, `request.timeout()`, BLS requests that name a sequence with
`pb_utils.InferenceRequest(correlation_id=..., flags=...)`, and, as an ensemble's step,
the ensemble request's ID, parameters and sequence."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pymodels
import pytest
import tritonclient.grpc as grpcclient
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

# What the model saw of each request: its correlation ID (typed), flags and parameters.
SEQ_ECHO = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            cid = request.correlation_id()
            seen = f"{type(cid).__name__}:{cid}"
            outputs = [
                pb_utils.Tensor("CORRID", np.array([[seen.encode()]], np.object_)),
                pb_utils.Tensor("FLAGS", np.array([[request.flags()]], np.int32)),
                pb_utils.Tensor("PARAMS", np.array([[request.parameters().encode()]], np.object_)),
                pb_utils.Tensor("ID", np.array([[request.request_id().encode()]], np.object_)),
                pb_utils.Tensor("TIMEOUT", np.array([[request.timeout()]], np.int64)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

_ECHO_TENSORS = """
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "CORRID" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "ID" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "TIMEOUT" data_type: TYPE_INT64 dims: [ 1 ] }
]
"""

SEQ_ECHO_CONFIG = (
    'name: "seq_echo"\nbackend: "python"\nmax_batch_size: 2\n'
    "sequence_batching { max_sequence_idle_microseconds: 5000000 }\n" + _ECHO_TENSORS
)
PLAIN_ECHO_CONFIG = 'name: "plain_echo"\nbackend: "python"\nmax_batch_size: 2\n' + _ECHO_TENSORS

# An ensemble of the one step plain_echo, giving all it saw.
ENSEMBLE_CONFIG = """
name: "ens_echo"
platform: "ensemble"
max_batch_size: 2
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "CORRID" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "ID" data_type: TYPE_STRING dims: [ 1 ] }
]
ensemble_scheduling { step [ {
  model_name: "plain_echo" model_version: -1
  input_map { key: "IN" value: "IN" }
  output_map [
    { key: "CORRID" value: "CORRID" }, { key: "FLAGS" value: "FLAGS" },
    { key: "PARAMS" value: "PARAMS" }, { key: "ID" value: "ID" }
  ]
} ] }
"""

# Calls seq_echo with the sequence its own parameters `cid` and `cflags` name.
BLS_SEQ = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            call = pb_utils.InferenceRequest(
                model_name="seq_echo",
                inputs=[pb_utils.Tensor("IN", np.array([[1]], np.int32))],
                requested_output_names=["CORRID", "FLAGS"],
                correlation_id=params["cid"],
                flags=params["cflags"],
            )
            if "set_flags" in params:
                call.set_flags(params["set_flags"])
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse(answer.output_tensors()))
        return responses
"""

BLS_SEQ_CONFIG = """
name: "bls_seq"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "CORRID" data_type: TYPE_STRING dims: [ 1, 1 ] },
  { name: "FLAGS" data_type: TYPE_INT32 dims: [ 1, 1 ] }
]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("python-sequence")
    pymodels.write_model(repo, "seq_echo", SEQ_ECHO, SEQ_ECHO_CONFIG)
    pymodels.write_model(repo, "plain_echo", SEQ_ECHO, PLAIN_ECHO_CONFIG)
    pymodels.write_model(repo, "bls_seq", BLS_SEQ, BLS_SEQ_CONFIG)
    ensemble = repo / "ens_echo"
    (ensemble / "1").mkdir(parents=True)
    (ensemble / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    with running_server([repo]) as proc:
        yield proc


def _post(
    server: ServerProcess, model: str, parameters: dict[str, Any], request_id: str = ""
) -> httpx.Response:
    shape = [1] if model == "bls_seq" else [1, 1]
    body: dict[str, Any] = {
        "inputs": [{"name": "IN", "datatype": "INT32", "shape": shape, "data": [1]}],
        "parameters": parameters,
    }
    if request_id:
        body["id"] = request_id
    return httpx.post(f"{server.base_url}/v2/models/{model}/infer", json=body, timeout=20)


def _seen(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"][0] for o in response.json()["outputs"]}
    if "PARAMS" in outputs:
        outputs["PARAMS"] = json.loads(outputs["PARAMS"])
    return outputs


def test_a_python_model_reads_the_sequence_of_each_http_request(server: ServerProcess) -> None:
    sent: list[dict[str, Any]] = [
        {"sequence_id": 7, "sequence_start": True, "note": "a"},
        {"sequence_id": 7},
        {"sequence_id": 7, "sequence_end": True},
        {"sequence_id": 8, "sequence_start": True, "sequence_end": True},
    ]
    seen = [_seen(_post(server, "seq_echo", params)) for params in sent]
    assert [s["CORRID"] for s in seen] == ["int:7", "int:7", "int:7", "int:8"]
    assert [s["FLAGS"] for s in seen] == [1, 0, 2, 3]
    # The sequence parameters are the request's correlation ID and flags, not parameters.
    assert [s["PARAMS"] for s in seen] == [{"note": "a"}, {}, {}, {}]
    assert [s["ID"] for s in seen] == ["", "", "", ""]


def test_a_python_model_reads_the_requests_timeout(server: ServerProcess) -> None:
    assert _seen(_post(server, "plain_echo", {"timeout": 5_000_000}))["TIMEOUT"] == 5_000_000
    assert _seen(_post(server, "plain_echo", {}))["TIMEOUT"] == 0


def test_a_string_correlation_id_reaches_the_model_as_a_string(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[1]], np.int32))
        result = client.infer(
            "seq_echo", [tensor], sequence_id="abc", sequence_start=True, sequence_end=True
        )
    assert result.as_numpy("CORRID")[0][0] == b"str:abc"
    assert result.as_numpy("FLAGS")[0][0] == 3


def test_a_bls_request_names_its_sequence_with_correlation_id_and_flags(
    server: ServerProcess,
) -> None:
    start = _seen(_post(server, "bls_seq", {"cid": 9, "cflags": 1}))
    assert start == {"CORRID": "int:9", "FLAGS": 1}
    end = _seen(_post(server, "bls_seq", {"cid": 9, "cflags": 2}))
    assert end == {"CORRID": "int:9", "FLAGS": 2}
    text = _seen(_post(server, "bls_seq", {"cid": "s-1", "cflags": 3}))
    assert text == {"CORRID": "str:s-1", "FLAGS": 3}


def test_set_flags_changes_the_flags_a_bls_request_sends(server: ServerProcess) -> None:
    # qa's bls test_bls_sequence ends its sequence with set_flags(SEQUENCE_END).
    start = _seen(_post(server, "bls_seq", {"cid": 11, "cflags": 0, "set_flags": 1}))
    assert start == {"CORRID": "int:11", "FLAGS": 1}
    end = _seen(_post(server, "bls_seq", {"cid": 11, "cflags": 1, "set_flags": 2}))
    assert end == {"CORRID": "int:11", "FLAGS": 2}
    refused = _post(server, "bls_seq", {"cid": 11, "cflags": 0, "set_flags": -1})
    assert refused.status_code != 200 and "set_flags()" in refused.text


def test_a_bls_sequence_request_without_an_id_is_refused_by_the_sequence_model(
    server: ServerProcess,
) -> None:
    refused = _post(server, "bls_seq", {"cid": 0, "cflags": 1})
    # The model raises the BLS answer's error: a model's exception is INTERNAL.
    assert refused.status_code == 500, refused.text
    assert "must specify a non-zero or non-empty correlation ID" in refused.json()["error"]


def test_a_correlation_id_outside_uint64_is_refused_in_the_model(server: ServerProcess) -> None:
    refused = _post(server, "bls_seq", {"cid": -1, "cflags": 1})
    assert refused.status_code == 500, refused.text
    assert "correlation_id must be an unsigned 64-bit integer, got -1" in refused.json()["error"]
    # The model keeps serving.
    assert _seen(_post(server, "bls_seq", {"cid": 4, "cflags": 3}))["CORRID"] == "int:4"


def test_an_ensemble_step_gets_the_ensemble_requests_id_parameters_and_sequence(
    server: ServerProcess,
) -> None:
    params = {"note": "x", "n": 3, "sequence_id": 12, "sequence_start": True}
    seen = _seen(_post(server, "ens_echo", params, request_id="req-7"))
    assert seen == {
        "CORRID": "int:12",
        "FLAGS": 1,
        "PARAMS": {"note": "x", "n": 3},
        "ID": "req-7",
    }
    plain = _seen(_post(server, "ens_echo", {}))
    assert plain == {"CORRID": "int:0", "FLAGS": 0, "PARAMS": {}, "ID": ""}
