"""The real process under SIGTERM and under bodies it will not take: gRPC calls in flight are
answered while new ones are refused UNAVAILABLE (never CANCELLED); an oversized HTTP body
gets its 400 even from a client that writes it whole before reading; a client that goes
away mid-body is one line in the log."""

from __future__ import annotations

import contextlib
import queue
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import orjson
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from modelgen import slow_model, write_model
from polling import poll
from promtext import scrape
from serverproc import ServerProcess, running_server, start_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

ROWS, WIDTH = 16, 256
# One instance runs the requests one after another. The first holds it for seconds, so
# that the others are all queued behind it before the signal; they take a fraction of one.
BLOCKER_ITERATIONS = 30_000
ITERATIONS = 2000
UNARY, STREAMED = 3, 2
# What the server log must not show after a clean stop.
UNCLEAN = ("Traceback", "exiting without waiting", "_poll_wrapper", "grpc-aio-poller")


@pytest.fixture
def slow_server(tmp_path: Path) -> Iterator[ServerProcess]:
    write_model(tmp_path / "repo", "slow", slow_model())
    proc = start_server([tmp_path / "repo"], ["--exit-timeout-secs", "30"])
    try:
        yield proc
    finally:
        proc.stop(signal.SIGKILL)
        shutil.rmtree(proc.log_path.parent, ignore_errors=True)


# Every request sends the same input, so that the expected answer is computed once.
X = np.random.default_rng(0).standard_normal((ROWS, WIDTH)).astype(np.float32)


def slow_inputs(iterations: int = ITERATIONS) -> list[grpcclient.InferInput]:
    inputs = [
        grpcclient.InferInput("X", [ROWS, WIDTH], "FP32"),
        grpcclient.InferInput("ITERS", [1], "INT64"),
    ]
    inputs[0].set_data_from_numpy(X)
    inputs[1].set_data_from_numpy(np.array([iterations], np.int64))
    return inputs


def expected() -> npt.NDArray[np.float32]:
    session = ort.InferenceSession(
        slow_model().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    feed = {"X": X, "ITERS": np.array([ITERATIONS], np.int64)}
    return np.asarray(session.run(None, feed)[0])


def in_server(proc: ServerProcess) -> tuple[float, float]:
    """Requests of `slow` that reached the server and wait for its one instance (Triton's
    pending count ends as a request starts executing), and those answered."""
    exposition = scrape(proc.metrics_url)
    counts = [
        exposition.find(name, model="slow")
        for name in ("nv_inference_pending_request_count", "nv_inference_request_success")
    ]
    waiting, answered = (found[0][1] if found else 0.0 for found in counts)
    return waiting, answered


def all_arrived(proc: ServerProcess) -> bool:
    """Every request but the executing one is waiting or answered, twice in a row: once
    could be the moment between two executions, when none executes and one request is
    still on its way (the next reading then counts one fewer, as one executes)."""
    first = in_server(proc)
    time.sleep(0.05)
    second = in_server(proc)
    waiting, answered = first
    return first == second and waiting + answered == UNARY + STREAMED and waiting >= 3


def status_of(error: BaseException) -> str:
    assert isinstance(error, InferenceServerException), repr(error)
    return str(error.status())


def http_body() -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "X", "shape": [ROWS, WIDTH], "datatype": "FP32", "data": X.ravel().tolist()},
            {"name": "ITERS", "shape": [1], "datatype": "INT64", "data": [ITERATIONS]},
        ]
    }


def test_sigterm_answers_calls_in_flight_and_refuses_new_ones_unavailable(
    slow_server: ServerProcess,
) -> None:
    proc = slow_server
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    unary: queue.Queue[tuple[int, Any]] = queue.Queue()
    over_http: queue.Queue[httpx.Response] = queue.Queue()

    def call(index: int) -> None:
        iterations = BLOCKER_ITERATIONS if index == 0 else ITERATIONS
        try:
            result = client.infer("slow", slow_inputs(iterations), client_timeout=60)
            unary.put((index, result.as_numpy("Y")))
        except Exception as exc:
            unary.put((index, exc))

    threads = [threading.Thread(target=call, args=(index,)) for index in range(UNARY)]
    # The blocker, then one request behind it: one waiting (or, where the short one came
    # first and has run, answered) means the blocker runs.
    threads[0].start()
    threads[1].start()
    poll(lambda: sum(in_server(proc)) == 1, 30, "the first request running, one waiting")
    streamed: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: streamed.put((result, error)))
    for index in range(STREAMED):
        client.async_stream_infer("slow", slow_inputs(), request_id=f"streamed-{index}")
    threads.append(
        threading.Thread(
            target=lambda: over_http.put(
                httpx.post(f"{proc.base_url}/v2/models/slow/infer", json=http_body(), timeout=60)
            )
        )
    )
    for thread in threads[2:]:
        thread.start()
    # Every request has reached the model's queue (or runs, or was answered: under load
    # the blocker may end before the last arrives) before the signal, and at least three
    # still wait, so that the drain outlasts the refusals below.
    poll(lambda: all_arrived(proc), 30, "every request queued")
    # A keep-alive connection, open at the signal.
    kept = httpx.Client(base_url=proc.base_url, timeout=30)
    assert kept.get("/v2/health/ready").status_code == 200

    proc.process.send_signal(signal.SIGTERM)
    # Health turns NOT_SERVING once the server has begun to refuse new work.
    with grpc.insecure_channel(proc.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        poll(
            lambda: (
                health.Check(health_pb2.HealthCheckRequest(), timeout=10).status
                == health_pb2.HealthCheckResponse.NOT_SERVING
            ),
            30,
            "health NOT_SERVING",
        )
    # The HTTP side stopped first: a request on the open connection is refused 503,
    # and the answer closes that connection. Sent at once, while the drain surely runs
    # and before uvicorn's 5 s keep-alive timeout could close the idle connection.
    try:
        refused_http = kept.post("/v2/models/slow/infer", json=http_body())
    finally:
        kept.close()
    late = grpcclient.InferenceServerClient(proc.grpc_url)
    refusals = []
    try:
        # While the calls in flight run, new calls reach the server and are refused.
        inputs = slow_inputs()
        for _ in range(3):
            with pytest.raises(InferenceServerException) as caught:
                late.infer("slow", inputs, client_timeout=30)
            refusals.append(caught.value)
        late_stream: queue.Queue[Any] = queue.Queue()
        late.start_stream(callback=lambda result, error: late_stream.put(error))
        # The refusal may end the stream before the client writes to it; the callback
        # hears of it either way.
        with contextlib.suppress(InferenceServerException):
            late.async_stream_infer("slow", inputs, request_id="late")
        refusals.append(late_stream.get(timeout=30))
    finally:
        late.stop_stream()
        late.close()

    for thread in threads:
        thread.join(60)
    answers = dict(unary.get_nowait() for _ in range(UNARY))
    stream_results = [streamed.get(timeout=60) for _ in range(STREAMED)]
    end_of_stream = streamed.get(timeout=60)
    client.stop_stream()
    client.close()
    rc = proc.process.wait(60)
    log = proc.log()

    assert rc == 0, log
    y = expected()
    for index in range(UNARY):
        assert not isinstance(answers[index], Exception), answers[index]
    assert answers[0].shape == (ROWS, WIDTH) and np.isfinite(answers[0]).all()
    for index in range(1, UNARY):
        np.testing.assert_allclose(answers[index], y, rtol=1e-4, atol=1e-5)
    ids = []
    for result, error in stream_results:
        assert error is None, error
        ids.append(result.get_response().id)
        np.testing.assert_allclose(result.as_numpy("Y"), y, rtol=1e-4, atol=1e-5)
    assert ids == [f"streamed-{index}" for index in range(STREAMED)]
    answered = over_http.get_nowait()
    assert answered.status_code == 200, answered.text
    np.testing.assert_allclose(
        np.array(answered.json()["outputs"][0]["data"], np.float32).reshape(ROWS, WIDTH),
        y,
        rtol=1e-4,
        atol=1e-5,
    )
    assert refused_http.status_code == 503
    assert refused_http.json() == {"error": "Server is shutting down"}
    assert refused_http.headers["connection"] == "close"
    # The stream was open at the signal: once its requests are answered it ends,
    # UNAVAILABLE, so the client knows that what it wrote later was not read.
    _, error = end_of_stream
    assert status_of(error) == "StatusCode.UNAVAILABLE", error
    for refusal in refusals:
        assert status_of(refusal) == "StatusCode.UNAVAILABLE", refusal
        assert "Server is shutting down" in str(refusal)
    assert not [line for line in log.splitlines() if any(mark in line for mark in UNCLEAN)]
    assert "stopped" in log.splitlines()[-1]


LIMIT = 1 << 20


def raw_post(port: int, body: bytes, headers: str) -> bytes:
    """Write the whole request before reading anything, then read to the end."""
    head = (
        "POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\n{headers}\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + body)
        chunks = []
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
    return b"".join(chunks)


def chunked(body: bytes, size: int = 1 << 16) -> bytes:
    parts = [
        f"{len(body[i : i + size]):x}\r\n".encode() + body[i : i + size] + b"\r\n"
        for i in range(0, len(body), size)
    ]
    return b"".join(parts) + b"0\r\n\r\n"


@pytest.fixture(scope="module")
def limited() -> Iterator[ServerProcess]:
    with running_server(extra=["--http-max-input-size", str(LIMIT)]) as server:
        yield server


@pytest.mark.parametrize("framing", ["close", "keep-alive", "chunked"])
def test_an_oversized_body_written_whole_gets_its_400(limited: ServerProcess, framing: str) -> None:
    body = b"[" + b"0," * (2 * LIMIT) + b"0]"
    if framing == "chunked":
        headers, wire = "Transfer-Encoding: chunked\r\n", chunked(body)
    else:
        connection = "Connection: close\r\n" if framing == "close" else ""
        headers, wire = f"{connection}Content-Length: {len(body)}\r\n", body
    # A reset here would raise out of recv(), or lose the answer the kernel had received.
    raw = raw_post(limited.http_port, wire, headers)
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), raw[:300]
    assert b"connection: close" in head.lower()
    message = orjson.loads(payload)["error"]
    assert "exceeds the maximum allowed input size" in message
    assert "--http-max-input-size" in message
    assert httpx.get(limited.base_url + "/v2/health/ready").status_code == 200


def test_a_client_that_goes_away_mid_body_is_one_log_line(limited: ServerProcess) -> None:
    declared = LIMIT // 2
    head = (
        "POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", limited.http_port), timeout=30) as sock:
        sock.sendall(head + b"[" + b"0," * 50_000)
    marker = "the client went away after"
    poll(lambda: marker in limited.log(), 30, "the log line")
    assert httpx.get(limited.base_url + "/v2/health/ready").status_code == 200
    log = limited.log()
    lines = [line for line in log.splitlines() if marker in line]
    assert len(lines) == 1, log
    assert f"of {declared} body bytes" in lines[0]
    assert "Traceback" not in log
    assert "unhandled error" not in log
