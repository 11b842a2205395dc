"""Python-backend models in a real ge-serve, through tritonclient, as python_backend's
example clients use them: add_sub, decoupled repeat and square over gRPC streaming, BLS,
custom metrics on /metrics, and what a user sees when a model fails or its worker is
killed."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import psutil
import pymodels
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from polling import poll
from protocols import PROTOCOLS, Triton
from serverproc import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

MODELS = (
    "add_sub", "failing", "sleeper", "repeat", "square", "once", "bls", "bls_decoupled",
    "metrics", "stumble", "bls_stumble",
)  # fmt: skip


@pytest.fixture(scope="module")
def python_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = pymodels.write(tmp_path_factory.mktemp("python-models"), *MODELS)
    with running_server([repo]) as proc:
        yield proc


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, python_server: ServerProcess) -> Iterator[Triton]:
    client = Triton.connect(request.param, python_server)
    try:
        yield client
    finally:
        client.close()


def add_sub_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "INPUT0": rng.random(4, dtype=np.float32),
        "INPUT1": rng.random(4, dtype=np.float32),
    }


def check_add_sub(result: Any, tensors: dict[str, np.ndarray]) -> None:
    a, b = tensors["INPUT0"], tensors["INPUT1"]
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)


def test_add_sub_answers_on_both_protocols(triton: Triton) -> None:
    tensors = add_sub_tensors()
    result = triton.infer("add_sub", tensors, ["OUTPUT0", "OUTPUT1"], request_id="1")
    check_add_sub(result, tensors)
    config = triton.client.get_model_config("add_sub")
    backend = config["backend"] if isinstance(config, dict) else config.config.backend
    assert backend == "python"


def test_a_model_error_fails_only_its_request(triton: Triton) -> None:
    with pytest.raises(InferenceServerException) as raised:
        triton.infer("failing", {"IN": np.array([1], np.int32)})
    assert "Failed to process the request(s) for model instance 'failing_0', message: " in (
        raised.value.message()
    )
    assert "TritonModelException: the model refused this batch" in raised.value.message()
    with pytest.raises(InferenceServerException) as raised:
        triton.infer("failing", {"IN": np.array([2], np.int32)})
    triton.expect_error(raised.value, "NOT_FOUND", "no such thing")
    result = triton.infer("failing", {"IN": np.array([5], np.int32)})
    assert result.as_numpy("OUT").tolist() == [5]


# --- decoupled --------------------------------------------------------------------------------


def stream(server: ServerProcess, sends: list[dict[str, Any]], expected: int) -> list[Any]:
    """Send the requests on one ModelStreamInfer stream; `expected` results come back."""
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        for send in sends:
            client.async_stream_infer(**send)
        found = [answers.get(timeout=20) for _ in range(expected)]
        client.stop_stream()  # returns once the stream has ended: every response is in
    assert answers.empty(), f"more than {expected} responses: {answers.get()}"
    for item in found:
        if isinstance(item, InferenceServerException):
            raise item
    return found


def grpc_inputs(**arrays: np.ndarray) -> list[grpcclient.InferInput]:
    built = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), _dtype(array))
        tensor.set_data_from_numpy(array)
        built.append(tensor)
    return built


def _dtype(array: np.ndarray) -> str:
    return {np.int32: "INT32", np.uint32: "UINT32"}[array.dtype.type]


def test_repeat_streams_a_response_per_element(python_server: ServerProcess) -> None:
    inputs = grpc_inputs(
        IN=np.array([4, 2, 0, 1], np.int32),
        DELAY=np.array([1, 2, 3, 4], np.uint32),
        WAIT=np.array([5], np.uint32),
    )
    outputs = [grpcclient.InferRequestedOutput("OUT"), grpcclient.InferRequestedOutput("IDX")]
    send: dict[str, Any] = {
        "model_name": "repeat",
        "inputs": inputs,
        "outputs": outputs,
        "request_id": "0",
    }
    send["enable_empty_final_response"] = True
    found = stream(python_server, [send], 5)
    values = [r.as_numpy("OUT").tolist() for r in found[:4]]
    assert values == [[4], [2], [0], [1]]
    assert [r.as_numpy("IDX").tolist() for r in found[:4]] == [[0], [1], [2], [3]]
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r in found]
    assert finals == [False, False, False, False, True]
    assert all(r.get_response().id == "0" for r in found)
    assert not found[4].get_response().outputs  # the flag-only final response, empty


def test_square_answers_each_request_as_often_as_it_says(python_server: ServerProcess) -> None:
    values = [4, 2, 0, 1]
    sends = [
        {"model_name": "square", "inputs": grpc_inputs(IN=np.array([v], np.int32)),
         "request_id": str(i)}
        for i, v in enumerate(values)
    ]  # fmt: skip
    found = stream(python_server, sends, sum(values))
    by_id: dict[str, list[int]] = {}
    for result in found:
        by_id.setdefault(result.get_response().id, []).extend(result.as_numpy("OUT").tolist())
    assert by_id == {"0": [4] * 4, "1": [2] * 2, "3": [1]}


@pytest.mark.parametrize("empty_final", [False, True])
def test_a_response_sent_with_the_final_flag_is_the_final_one(
    python_server: ServerProcess, empty_final: bool
) -> None:
    send: dict[str, Any] = {
        "model_name": "once",
        "inputs": grpc_inputs(IN=np.array([21], np.int32)),
    }
    send["enable_empty_final_response"] = empty_final
    (found,) = stream(python_server, [send], 1)
    assert found.as_numpy("OUT").tolist() == [42]
    assert found.get_response().parameters["triton_final_response"].bool_param is True


def test_an_error_response_mid_stream_is_followed_by_the_rest(
    python_server: ServerProcess,
) -> None:
    """As Triton: a decoupled model's error response without the final flag is one
    response of the stream, naming its model and saying it was not the last, and the
    model's later responses follow it; the request counts as failed."""
    stats = f"{python_server.base_url}/v2/models/stumble/stats"
    failed_before = httpx.get(stats).json()["model_stats"][0]["inference_stats"]["fail"]["count"]
    request = pb.ModelInferRequest(model_name="stumble", id="s1")
    request.inputs.add(name="IN", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.array([3], np.int32).tobytes())
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    with grpc.insecure_channel(python_server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        found = list(stub.ModelStreamInfer(iter([request]), timeout=20))
    answers = [
        (
            item.error_message,
            item.infer_response.model_name,
            item.infer_response.id,
            item.infer_response.parameters["triton_final_response"].bool_param,
            [
                np.frombuffer(raw, np.int32).tolist()
                for raw in item.infer_response.raw_output_contents
            ],
        )
        for item in found
    ]
    assert answers == [
        ("", "stumble", "s1", False, [[0]]),
        ("response 1 failed", "stumble", "s1", False, []),
        ("", "stumble", "s1", False, [[2]]),
        ("", "stumble", "s1", True, []),
    ]
    failed = httpx.get(stats).json()["model_stats"][0]["inference_stats"]["fail"]["count"]
    assert failed == failed_before + 1

    # With Triton's `triton_grpc_error` header, the error ends the stream with its status.
    with grpc.insecure_channel(python_server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(
            iter([request]), timeout=20, metadata=(("triton_grpc_error", "true"),)
        )
        first = next(call)
        assert np.frombuffer(first.infer_response.raw_output_contents[0], np.int32) == [0]
        with pytest.raises(grpc.RpcError) as ended:
            next(call)
    assert ended.value.details() == "response 1 failed"

    # /generate_stream: the same three events, the error one in its place.
    body = {"IN": [3]}
    url = f"{python_server.base_url}/v2/models/stumble/generate_stream"
    with httpx.stream("POST", url, json=body, timeout=20) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert [json.loads(event[6:]) for event in events] == [
        {"model_name": "stumble", "model_version": "1", "OUT": 0},
        {"error": "response 1 failed"},
        {"model_name": "stumble", "model_version": "1", "OUT": 2},
    ]

    # BLS: the iterator gives the error response and goes on.
    with httpclient.InferenceServerClient(python_server.http_url) as client:
        tensor = httpclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([3], np.int32))
        assert client.infer("bls_stumble", [tensor]).as_numpy("OUT").tolist() == [0, -1, 2]


def test_one_response_endpoints_refuse_a_decoupled_model(python_server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(python_server.http_url) as client:
        tensor = httpclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], np.int32))
        with pytest.raises(InferenceServerException) as raised:
            client.infer("square", [tensor])
    assert raised.value.status() == "501"
    assert raised.value.message() == (
        "HTTP end point doesn't support models with decoupled transaction policy"
    )
    with (
        grpcclient.InferenceServerClient(python_server.grpc_url) as client,
        pytest.raises(InferenceServerException) as raised,
    ):
        client.infer("square", grpc_inputs(IN=np.array([1], np.int32)))
    assert raised.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in (
        raised.value.message()
    )


# --- BLS and custom metrics ---------------------------------------------------------------


def test_bls_calls_other_models(python_server: ServerProcess) -> None:
    tensors = add_sub_tensors()
    with httpclient.InferenceServerClient(python_server.http_url) as client:
        before = client.get_inference_statistics("add_sub")["model_stats"][0]
        inputs = Triton("http", httpclient, httpclient, "", client).inputs(
            {**tensors, "MODEL_NAME": np.array([b"add_sub"], dtype=object)}
        )
        check_add_sub(client.infer("bls", inputs), tensors)
        after = client.get_inference_statistics("add_sub")["model_stats"][0]
        assert after["inference_count"] == before["inference_count"] + 1
        inputs[-1].set_data_from_numpy(np.array([b"undefined_model"], dtype=object))
        with pytest.raises(InferenceServerException, match="undefined_model"):
            client.infer("bls", inputs)
        for value in (4, 2, 0, 1):
            tensor = httpclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], np.int32))
            result = client.infer("bls_decoupled", [tensor])
            assert result.as_numpy("SUM").tolist() == [value * value]


def test_custom_metrics_show_on_the_metrics_endpoint(python_server: ServerProcess) -> None:
    tensors = add_sub_tensors()
    with httpclient.InferenceServerClient(python_server.http_url) as client:
        inputs = Triton("http", httpclient, httpclient, "", client).inputs(tensors)
        for _ in range(2):
            client.infer("metrics", inputs)
    text = httpx.get(python_server.metrics_url, timeout=10).text
    assert "# HELP pbtest_requests_total_count Requests this model answered" in text
    assert "# TYPE pbtest_requests_total_count counter" in text
    assert 'pbtest_requests_total_count{model="metrics",version="1"} ' in text
    assert "# TYPE pbtest_sum histogram" in text
    assert 'pbtest_sum_bucket{model="metrics",version="1",le="+Inf"}' in text
    # Triton's own families are still there.
    assert 'nv_inference_request_success{model="metrics",version="1"}' in text


# --- clients that leave ----------------------------------------------------------------------


def test_an_http_client_that_leaves_takes_its_queued_request_with_it(
    python_server: ServerProcess,
) -> None:
    """As for a cancelled gRPC call: requests whose clients closed the connection while
    they waited are dropped, not run for nobody ahead of the next client's (the model
    runs one request at a time, first come first served)."""
    before = sleeper_executions(python_server)
    request = raw_sleep_request(0.2)
    sockets = [socket.create_connection(("127.0.0.1", python_server.http_port)) for _ in range(10)]
    for sock in sockets:
        sock.sendall(request)
    time.sleep(0.3)  # all in: one runs, the others wait
    for sock in sockets:
        sock.close()
    with httpclient.InferenceServerClient(python_server.http_url, network_timeout=30) as client:
        sleep_for(client, 0)
    after = sleeper_executions(python_server)
    # The one running when its client left may finish; the nine waiting never run.
    assert after - before <= 3, f"{after - before} executions for 1 request answered"


def test_a_pipelining_client_that_leaves_takes_its_running_request_with_it(
    python_server: ServerProcess,
) -> None:
    """uvicorn keeps only a connection's newest request; the one still waiting behind
    another client's is found and dropped too when the connection closes."""
    before = sleeper_executions(python_server)
    request = raw_sleep_request(0.2)
    with httpclient.InferenceServerClient(python_server.http_url, network_timeout=30) as client:
        # Long enough that, on a loaded machine too, the busy request is running before
        # the pipelined ones come, and still running when their connection's close is seen.
        busy = client.async_infer("sleeper", [_seconds(2.0)])
        time.sleep(0.5)  # the model is busy: what comes next waits
        with socket.create_connection(("127.0.0.1", python_server.http_port)) as sock:
            sock.sendall(request * 2)
            time.sleep(0.2)
        busy.get_result()
        sleep_for(client, 0)
    after = sleeper_executions(python_server)
    assert after - before == 2, f"{after - before} executions for 2 requests answered"


def sleeper_executions(server: ServerProcess) -> int:
    stats = httpx.get(f"{server.base_url}/v2/models/sleeper/stats").json()
    return int(stats["model_stats"][0]["execution_count"])


def raw_sleep_request(seconds: float) -> bytes:
    """A whole HTTP/1.1 request for the sleeper, to send on a socket of one's own."""
    body = orjson.dumps(
        {"inputs": [{"name": "IN", "shape": [1], "datatype": "FP32", "data": [seconds]}]}
    )
    head = f"POST /v2/models/sleeper/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
    return (head + "\r\n\r\n").encode() + body


def _seconds(value: float) -> httpclient.InferInput:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], np.float32))
    return tensor


# --- a worker killed -------------------------------------------------------------------------


def index_row(server: ServerProcess, model: str) -> dict[str, str]:
    rows = httpx.post(server.base_url + "/v2/repository/index", timeout=10).json()
    return next(row for row in rows if row["name"] == model)


def sleep_for(client: httpclient.InferenceServerClient, seconds: float, **kwargs: Any) -> Any:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], np.float32))
    return client.infer("sleeper", [tensor], **kwargs)


def test_a_killed_worker_fails_its_requests_and_comes_back(
    python_server: ServerProcess, tmp_path: Path
) -> None:
    with httpclient.InferenceServerClient(python_server.http_url, network_timeout=30) as client:
        pid = int(sleep_for(client, 0).as_numpy("PID")[0])
        assert psutil.Process(pid).ppid() == python_server.process.pid
        outcome: queue.Queue[Any] = queue.Queue()
        started = tmp_path / "started"

        def in_flight() -> None:
            # A client of its own: tritonclient.http's gevent client stays on its thread.
            url = python_server.http_url
            with httpclient.InferenceServerClient(url, network_timeout=30) as own:
                try:
                    outcome.put(sleep_for(own, 20, parameters={"started": str(started)}))
                except InferenceServerException as exc:
                    outcome.put(exc)

        threading.Thread(target=in_flight, daemon=True).start()
        poll(started.exists, 10, "the worker to start executing the long request")
        os.kill(pid, signal.SIGKILL)
        error = outcome.get(timeout=20)
        assert isinstance(error, InferenceServerException)
        assert error.status() == "503"
        assert "model instance 'sleeper_0' of 'sleeper' failed" in error.message()
        assert f"the worker process (pid {pid}) was killed by SIGKILL" in error.message()
        # A new worker takes a Python start-up at least: the model shows why it is down.
        row = index_row(python_server, "sleeper")
        assert row["state"] == "UNAVAILABLE", row
        # Triton's sentence first (qa's model_readiness greps it), then ge-serve's detail.
        assert row["reason"] == (
            "Stub process 'sleeper_0' is not healthy. model instance 'sleeper_0' is "
            f"restarting: the worker process (pid {pid}) was killed by SIGKILL"
        )
        with pytest.raises(InferenceServerException) as refused:
            sleep_for(client, 0)
        assert refused.value.status() == "503"
        assert refused.value.message() == f"model 'sleeper' is unavailable: {row['reason']}"
        # The other models keep serving meanwhile.
        tensors = add_sub_tensors()
        other = Triton("http", httpclient, httpclient, "", client)
        check_add_sub(other.infer("add_sub", tensors), tensors)
        poll(lambda: index_row(python_server, "sleeper")["state"] == "READY", 30, "READY")
        again = int(sleep_for(client, 0).as_numpy("PID")[0])
        assert again != pid
        assert "reason" not in index_row(python_server, "sleeper")  # Triton leaves it out


# The model's initialize marks that it runs (its pid in the file), then never returns:
# it sleeps, or loads itself, which waits for the load under way.
STUCK_INITIALIZE = """
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        with open({marker!r}, "w") as marker:
            marker.write(str(os.getpid()))
        {hang}

    def execute(self, requests):
        return None
"""


@pytest.mark.parametrize(
    "hang", ["time.sleep(10**6)", "pb_utils.load_model('stuck')"], ids=["sleeps", "loads-itself"]
)
def test_an_initialize_that_never_returns_does_not_hold_the_exit(tmp_path: Path, hang: str) -> None:
    marker = tmp_path / "initializing"
    repo = tmp_path / "models"
    source = STUCK_INITIALIZE.format(marker=str(marker), hang=hang)
    pymodels.write_model(repo, "stuck", source, pymodels.MODELS["failing"][1])
    extra = ["--model-control-mode", "explicit", "--exit-timeout-secs", "2"]
    with running_server([repo], extra) as proc:
        url = f"{proc.base_url}/v2/repository/models/stuck/load"

        def load() -> None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(url, json={}, timeout=60)

        threading.Thread(target=load, daemon=True).start()
        poll(lambda: marker.exists() and marker.read_text() != "", 20, "initialize to run")
        worker = int(marker.read_text())
        started = time.monotonic()
        proc.process.send_signal(signal.SIGTERM)
        try:
            proc.process.wait(15)
        except subprocess.TimeoutExpired:
            proc.stop(signal.SIGKILL)
            pytest.fail("the server did not exit within its exit timeout")
        # The exit timeout, and a small fixed margin for the rest of the stop.
        assert time.monotonic() - started < 2 + 6
        assert proc.process.returncode == 0
        poll(lambda: not psutil.pid_exists(worker), 10, "the model's worker to end")
