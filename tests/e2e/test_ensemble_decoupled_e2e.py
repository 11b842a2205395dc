"""An ensemble with a decoupled step, over the wire: it is decoupled itself, each response
of the step runs the step after it, and the ensemble streams a response for each, then
its final flag (gRPC ModelStreamInfer and /generate_stream), as Triton's does. Its
request is counted and traced when released, with its steps' compute times."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pymodels
import pytest
from polling import poll
from promtext import scrape
from serverproc import ServerProcess, running_server

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# A response per element of IN, a moment apart; -1 answers an error response there, and
# -2 streams until the client goes away (it asks is_cancelled() before each response).
COUNTER = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().tolist()
            if values == [-2]:
                values = range(1000)
            for value in values:
                if request.is_cancelled():
                    pb_utils.Logger.log_info("counter: the request was cancelled")
                    break
                if value == -1:
                    error = pb_utils.TritonError("counter cannot count -1")
                    sender.send(pb_utils.InferenceResponse(error=error))
                    break
                out = pb_utils.Tensor("OUT", np.array([value], np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
                time.sleep(0.3)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

PLUS1 = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return responses
"""

ENSEMBLE = """
name: "counted"
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "counter" input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "mid" } },
  { model_name: "plus1" input_map { key: "X" value: "mid" } output_map { key: "Y" value: "Y" } }
] }
"""  # noqa: E501


def write_repo(repo: Path) -> Path:
    pymodels.write_model(
        repo,
        "counter",
        COUNTER,
        'name: "counter"\nbackend: "python"\n'
        "model_transaction_policy { decoupled: true }\n"
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n',
    )
    pymodels.write_model(
        repo,
        "plus1",
        PLUS1,
        'name: "plus1"\nbackend: "python"\n'
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n',
    )
    (repo / "counted" / "1").mkdir(parents=True)
    (repo / "counted" / "config.pbtxt").write_text(ENSEMBLE)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("traces")
    flags = [
        f"--trace-config=triton,file={folder / 'trace.json'}",
        "--trace-config=triton,log-frequency=1",
        "--trace-config=level=OFF",
    ]
    repo = write_repo(tmp_path_factory.mktemp("decoupled-ensemble"))
    with running_server([repo], flags) as proc:
        proc.trace_folder = folder  # type: ignore[attr-defined]
        yield proc


def request(values: list[int], request_id: str = "r1") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="counted", id=request_id)
    message.inputs.add(name="IN", datatype="INT32", shape=[len(values)])
    message.raw_input_contents.append(np.array(values, np.int32).tobytes())
    message.parameters["triton_enable_empty_final_response"].bool_param = True
    return message


def grpc_stream(server: ServerProcess, values: list[int]) -> list[tuple[Any, ...]]:
    """(error, model, id, final flag, Y) of each message on one ModelStreamInfer call."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        found = list(stub.ModelStreamInfer(iter([request(values)]), timeout=30))
    answers = []
    for item in found:
        response = item.infer_response
        final = response.parameters["triton_final_response"].bool_param
        values = [np.frombuffer(raw, np.int32).tolist() for raw in response.raw_output_contents]
        answers.append((item.error_message, response.model_name, response.id, final, values))
    return answers


def generate_stream(server: ServerProcess, values: list[int]) -> list[dict[str, Any]]:
    url = f"{server.base_url}/v2/models/counted/generate_stream"
    with httpx.stream("POST", url, json={"IN": values}, timeout=30) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    return [json.loads(event.removeprefix("data: ")) for event in events]


def stats(server: ServerProcess, model: str) -> dict[str, Any]:
    found = httpx.get(f"{server.base_url}/v2/models/{model}/stats").json()
    return dict(found["model_stats"][0])


def test_the_ensemble_is_decoupled_and_one_response_endpoints_refuse_it(
    server: ServerProcess,
) -> None:
    config = httpx.get(f"{server.base_url}/v2/models/counted/config").json()
    assert config["model_transaction_policy"] == {"decoupled": True}
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}
    refused = httpx.post(f"{server.base_url}/v2/models/counted/infer", json=body)
    assert refused.status_code == 501
    assert refused.json() == {
        "error": "HTTP end point doesn't support models with decoupled transaction policy"
    }
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as unary:
            stub.ModelInfer(request([1]), timeout=30)
    assert unary.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in (
        str(unary.value.details())
    )


def test_each_response_of_the_decoupled_step_runs_the_next_and_is_streamed(
    server: ServerProcess,
) -> None:
    before = {name: stats(server, name) for name in ("counted", "counter", "plus1")}
    assert grpc_stream(server, [3, 5, 9]) == [
        ("", "counted", "r1", False, [[4]]),
        ("", "counted", "r1", False, [[6]]),
        ("", "counted", "r1", False, [[10]]),
        ("", "counted", "r1", True, []),
    ]

    def grew(name: str, key: str, field: str = "count") -> int:
        new, old = stats(server, name)["inference_stats"], before[name]["inference_stats"]
        return int(new[key][field]) - int(old[key][field])

    # One request to the ensemble and to its decoupled step; one per response after it.
    # Each is counted once released (its execution returned), as in Triton: soon after
    # the final flag, not before it.
    poll(lambda: grew("counted", "success") == 1, 10, "the ensemble's request released")
    assert (grew("counter", "success"), grew("plus1", "success")) == (1, 3)
    # The decoupled step's compute time, its three responses 0.3 s apart, is counted, in
    # the step's statistics and in the ensemble's (the sum of its steps').
    assert grew("counter", "compute_infer", "ns") >= 0.85e9
    assert grew("counted", "compute_infer", "ns") >= 0.85e9
    counter = stats(server, "counter")
    assert counter["execution_count"] - before["counter"]["execution_count"] == 1

    events = generate_stream(server, [3, 5, 9])
    assert [event["Y"] for event in events] == [4, 6, 10]
    assert all(event["model_name"] == "counted" for event in events)
    # No response at all: the final flag alone.
    assert grpc_stream(server, []) == [("", "counted", "r1", True, [])]


def test_the_first_response_histogram_is_observed_at_the_first_response(
    server: ServerProcess,
) -> None:
    """Triton's nv_inference_first_response_histogram_ms: a decoupled model's (and the
    ensemble's) request observes when its first response goes out, not when it ends;
    the step after it, which answers once, observes each of its requests."""
    name = "nv_inference_first_response_histogram_ms"

    def histogram(model: str) -> tuple[float, float]:
        m = scrape(server.metrics_url)
        at = {"model": model, "version": "1"}
        found = m.find(name + "_count", **at)
        count = found[0][1] if found else 0.0
        within = m.find(name + "_bucket", **at, le="2000.0")
        return count, within[0][1] if within else 0.0

    before = {model: histogram(model) for model in ("counted", "counter", "plus1")}
    # Eight responses 0.3 s apart: the request ends 2.4 s or more after it began.
    answers = grpc_stream(server, [1] * 8)
    assert [answer[4] for answer in answers] == [[[2]]] * 8 + [[]]
    poll(lambda: histogram("plus1")[0] - before["plus1"][0] == 8, 10, "the steps observed")
    for model, count in (("counted", 1), ("counter", 1), ("plus1", 8)):
        after = histogram(model)
        assert after[0] - before[model][0] == count, model
        assert after[1] - before[model][1] == count, model  # each under 2 s


def test_a_step_error_mid_stream_fails_the_request_after_its_responses(
    server: ServerProcess,
) -> None:
    failed = int(stats(server, "counted")["inference_stats"]["fail"]["count"])
    message = "in ensemble 'counted', counter cannot count -1"
    assert grpc_stream(server, [3, 5, -1, 7]) == [
        ("", "counted", "r1", False, [[4]]),
        ("", "counted", "r1", False, [[6]]),
        (message, "counted", "r1", True, []),
    ]
    assert generate_stream(server, [3, 5, -1, 7]) == [
        {"model_name": "counted", "model_version": "1", "Y": 4, **no_sequence()},
        {"model_name": "counted", "model_version": "1", "Y": 6, **no_sequence()},
        {"error": message},
    ]
    assert int(stats(server, "counted")["inference_stats"]["fail"]["count"]) == failed + 2


def no_sequence() -> dict[str, Any]:
    # An ensemble's response echoes the sequence its outputs carry, none here.
    return {"sequence_id": 0, "sequence_start": False, "sequence_end": False}


def test_a_client_that_goes_away_stops_the_steps(server: ServerProcess) -> None:
    url = f"{server.base_url}/v2/models/counted/generate_stream"
    with httpx.stream("POST", url, json={"IN": [-2]}, timeout=30) as response:
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
    assert json.loads(first.removeprefix("data: "))["Y"] == 1
    # The cancellation reaches the decoupled step, whose model asks is_cancelled().
    poll(lambda: "counter: the request was cancelled" in server.log(), 20, "the step stops")
    # Its instance is free again: the next request is answered at once.
    assert [event["Y"] for event in generate_stream(server, [1])] == [2]


def test_a_streamed_request_and_its_decoupled_step_are_traced(server: ServerProcess) -> None:
    folder: Path = server.trace_folder  # type: ignore[attr-defined]
    settings = f"{server.base_url}/v2/trace/setting"
    httpx.post(settings, json={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}).raise_for_status()
    try:
        answered = grpc_stream(server, [3])
    finally:
        httpx.post(settings, json={"trace_level": ["OFF"]}).raise_for_status()
    assert answered[0] == ("", "counted", "r1", False, [[4]])

    def heads() -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        for path in sorted(folder.glob("trace.json*")):
            records += json.loads(path.read_text())
        return [r for r in records if "model_name" in r]

    def traced() -> bool:
        ensembles = [h for h in heads() if h["model_name"] == "counted"]
        children = [h for h in heads() if ensembles and h.get("parent_id") == ensembles[0]["id"]]
        return len(children) == 2

    poll(traced, 20, "the ensemble's and its steps' traces")
    (ensemble,) = [h for h in heads() if h["model_name"] == "counted"]
    assert ensemble["request_id"] == "r1" and "parent_id" not in ensemble
    steps = sorted(h["model_name"] for h in heads() if h.get("parent_id") == ensemble["id"])
    assert steps == ["counter", "plus1"]
