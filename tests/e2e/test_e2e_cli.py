"""The command line and the process: repository flags, the startup log, and a graceful stop
on SIGINT/SIGTERM that finishes in-flight requests."""

from __future__ import annotations

import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import orjson
import pytest
from certs import make_tls_files
from modelgen import add_sub_model, slow_model, write_model
from polling import poll
from serverproc import (
    EXAMPLE_MODELS,
    REPO_ROOT,
    ServerProcess,
    running_server,
    start_server,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def run_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ge_serve.server.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
    )


# --- flags ------------------------------------------------------------------------------------


def test_help_lists_the_flags() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for flag in (
        "--model-repository",
        "--model-repo",
        "--http-port",
        "--grpc-port",
        "--metrics-port",
        "--exit-on-error",
        "--exit-timeout-secs",
        "--disable-auto-complete-config",
        "--http-max-input-size",
        "--model-control-mode",
        "--strict-readiness",
    ):
        assert flag in result.stdout


def test_a_model_repository_is_required() -> None:
    result = run_cli()
    assert result.returncode == 2
    assert "--model-repository" in result.stderr


def test_a_missing_repository_fails_at_startup(tmp_path: Path) -> None:
    result = run_cli("--model-repo", str(tmp_path / "absent"), "--http-port", "0")
    assert result.returncode != 0
    assert "absent" in result.stdout + result.stderr
    assert "is not a folder" in result.stdout + result.stderr


def test_a_missing_repository_with_exit_on_error_false_runs_not_live(tmp_path: Path) -> None:
    # Triton's server failed to initialize and, told not to exit, serves on: not live,
    # not ready, its metadata answered.
    server = start_server([tmp_path / "absent"], ["--exit-on-error=false"], wait_ready=False)
    try:
        wait_for(server, "/v2", 60.0)
        assert httpx.get(server.base_url + "/v2/health/live").status_code == 400
        assert httpx.get(server.base_url + "/v2/health/ready").status_code == 400
        assert "is not a folder" in server.log()
    finally:
        server.stop()


def test_model_repo_alias_and_repeated_repositories(tmp_path: Path) -> None:
    second = tmp_path / "second"
    write_model(second, "addsub", add_sub_model(("batch", 4)))
    extra = ["--model-repo", str(EXAMPLE_MODELS), "--model-repo", str(second)]
    with running_server(repos=[], extra=extra) as proc:
        index = httpx.post(proc.base_url + "/v2/repository/index").json()
        examples = sorted(p.name for p in EXAMPLE_MODELS.iterdir() if p.is_dir())
        assert [row["name"] for row in index] == sorted(["addsub", *examples])
        assert all(row["state"] == "READY" for row in index)
        body = {
            "inputs": [
                {"name": "A", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                {"name": "B", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]},
            ]
        }
        response = httpx.post(proc.base_url + "/v2/models/addsub/infer", json=body)
        outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
        assert outputs == {"SUM": [2, 3, 4, 5], "DIFF": [0, 1, 2, 3]}
    assert proc.process.returncode == 0


def test_a_model_in_two_repositories_fails_at_startup(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    write_model(first, "twin", add_sub_model())
    write_model(second, "twin", add_sub_model())
    result = run_cli("--model-repo", str(first), "--model-repo", str(second), "--http-port", "0")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    # Triton's reason; the name fails alone (--exit-on-error=false would serve the rest).
    assert "failed to poll model 'twin': not unique across all model repositories" in output


def test_a_taken_port_fails_startup_with_a_clear_reason() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            "--model-repo", str(EXAMPLE_MODELS),
            "--http-address", "127.0.0.1", "--http-port", str(port),
        )  # fmt: skip
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert f"cannot listen for HTTP on 127.0.0.1:{port}" in output
    assert "Traceback" not in output


def test_a_tls_setting_that_cannot_work_is_one_line_not_a_traceback() -> None:
    result = run_cli(
        "--model-repo", str(EXAMPLE_MODELS), "--http-port", "0", "--grpc-use-ssl", "true"
    )  # fmt: skip
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert "--grpc-use-ssl needs --grpc-server-cert" in output
    assert "Traceback" not in output


def test_a_grpc_key_that_is_not_the_certificates_is_named(tmp_path: Path) -> None:
    # grpc itself would say only that the port could not be bound.
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    tls, other = make_tls_files(tmp_path / "a"), make_tls_files(tmp_path / "b")
    garbage = tmp_path / "garbage.key"
    garbage.write_bytes(b"not a key")
    for key in (other.key, garbage):
        result = run_cli(
            "--model-repo", str(EXAMPLE_MODELS), "--http-port", "0", "--grpc-port", "0",
            "--grpc-use-ssl", "true", f"--grpc-server-cert={tls.cert}",
            f"--grpc-server-key={key}",
        )  # fmt: skip
        output = result.stdout + result.stderr
        assert result.returncode == 1, output
        assert f"--grpc-server-key '{key}' are not a certificate and its key" in output
        assert "Traceback" not in output


def test_a_startup_model_that_fails_is_logged_when_the_server_goes_on() -> None:
    extra = ["--model-control-mode=explicit", "--load-model=simpel", "--exit-on-error=false"]
    with running_server(extra=extra) as proc:
        assert "model 'simpel' failed to load" in proc.log()


def test_startup_log_shows_models_and_addresses(server: ServerProcess) -> None:
    # The address line follows the listener's start, so a ready answer may come first.
    started = f"Started HTTPService at 127.0.0.1:{server.http_port}"
    poll(lambda: started in server.log(), 10, "the address line")
    log = server.log()
    assert "Model" in log and "| Version | Status" in log
    for name in ("image_classifier", "simple", "simple_string"):
        assert any(
            line.startswith(name) and line.rstrip().endswith("| READY") for line in log.splitlines()
        ), log


# --- graceful stop ---------------------------------------------------------------------------

ROWS, WIDTH = 64, 256


def slow_request(iterations: int, seed: int) -> tuple[bytes, npt.NDArray[np.float32]]:
    """A raw HTTP/1.1 request for the slow model, and its input."""
    x = np.random.default_rng(seed).standard_normal((ROWS, WIDTH)).astype(np.float32)
    iters = np.array([iterations], np.int64)
    header = orjson.dumps(
        {
            "inputs": [
                {"name": "X", "shape": [ROWS, WIDTH], "datatype": "FP32",
                 "parameters": {"binary_data_size": x.nbytes}},
                {"name": "ITERS", "shape": [1], "datatype": "INT64",
                 "parameters": {"binary_data_size": iters.nbytes}},
            ],
            "outputs": [{"name": "Y", "parameters": {"binary_data": True}}],
        }
    )  # fmt: skip
    body = header + x.tobytes() + iters.tobytes()
    head = (
        "POST /v2/models/slow/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n\r\n"
    )
    return head.encode() + body, x


def read_response(sock: socket.socket) -> tuple[int, npt.NDArray[np.float32]]:
    """Read a whole `Connection: close` response; returns (status, Y)."""
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    if status != 200:
        raise AssertionError(f"status {status}: {body[:500]!r}")
    json_length = int(headers["inference-header-content-length"])
    y = np.frombuffer(body[json_length:], dtype=np.float32).reshape(ROWS, WIDTH)
    return status, y


def expected_y(xs: list[npt.NDArray[np.float32]], iterations: int) -> list[npt.NDArray[np.float32]]:
    session = ort.InferenceSession(
        slow_model().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    iters = np.array([iterations], np.int64)
    return [np.asarray(session.run(None, {"X": x, "ITERS": iters})[0]) for x in xs]


def refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return False
    except OSError:
        return True


@pytest.fixture
def slow_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    write_model(repo, "slow", slow_model())
    return repo


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_finishes_in_flight_requests_and_exits_0(slow_repo: Path, sig: int) -> None:
    iterations, count = 3000, 4
    proc = start_server([slow_repo], ["--exit-timeout-secs", "60"])
    sockets: list[socket.socket] = []
    try:
        inputs = []
        # Every request is fully written before anything else happens. One instance runs
        # them one at a time, so when the first answer arrives the others are queued in the
        # server.
        for i in range(count):
            request, x = slow_request(iterations, seed=i)
            sock = socket.create_connection(("127.0.0.1", proc.http_port), timeout=120)
            sock.sendall(request)
            sockets.append(sock)
            inputs.append(x)
        first = sockets.index(first_answered(sockets))
        done = {first: read_response(sockets[first])[1]}

        proc.process.send_signal(sig)
        # A real signal that the server stopped accepting: new connections are refused.
        poll(
            lambda: refuses_connections(proc.http_port) or not proc.alive(),
            30,
            "the HTTP port to close",
        )
        for i, sock in enumerate(sockets):
            if i not in done:
                done[i] = read_response(sock)[1]
        rc = proc.process.wait(60)
        assert rc == 0, proc.log()
        for i, y in enumerate(expected_y(inputs, iterations)):
            np.testing.assert_allclose(done[i], y, rtol=1e-4, atol=1e-5)
        log = proc.log()
        assert "signal received: stopping" in log
        assert "Waiting for in-flight requests to complete." in log  # Triton's line
        assert "stopped" in log.splitlines()[-1]
    finally:
        for sock in sockets:
            sock.close()
        proc.stop(signal.SIGKILL)
        shutil.rmtree(proc.log_path.parent, ignore_errors=True)


def test_exit_timeout_bounds_the_wait(tmp_path: Path) -> None:
    """A request longer than --exit-timeout-secs does not hold the process: it exits 0."""
    # Two instances, so the short request never waits behind the endless one.
    config = "instance_group [ { count: 2 kind: KIND_CPU } ]"
    write_model(tmp_path / "repo", "slow", slow_model(), config)
    proc = start_server([tmp_path / "repo"], ["--exit-timeout-secs", "2"])
    try:
        short, _ = slow_request(4000, seed=0)
        # Long enough to outlast the exit timeout by far (minutes).
        endless, _ = slow_request(5_000_000, seed=1)
        with (
            socket.create_connection(("127.0.0.1", proc.http_port), timeout=120) as first,
            socket.create_connection(("127.0.0.1", proc.http_port), timeout=120) as second,
        ):
            first.sendall(short)
            second.sendall(endless)
            # Once the short one has answered, the server has long read the endless one,
            # which holds the other instance.
            read_response(first)
            signalled = time.monotonic()
            proc.process.send_signal(signal.SIGTERM)
            rc = proc.process.wait(60)
            # One exit timeout in all (2 s), then up to 2 s for closed slot threads to
            # end: the front ends' drain and the models' unload share the timeout (each
            # had a whole one, so this took 6 s).
            assert time.monotonic() - signalled < 5.0, proc.log()
            # The client sees its connection end, not a hang and not a made-up answer.
            second.settimeout(10)
            assert not second.recv(1 << 16).startswith(b"HTTP/1.1 200")
        assert rc == 0, proc.log()
        assert "exiting without waiting for" in proc.log()
        assert "slot-slow_1_cpu_" in proc.log()
        assert "Event loop is closed" not in proc.log()
    finally:
        proc.stop(signal.SIGKILL)
        shutil.rmtree(proc.log_path.parent, ignore_errors=True)


def first_answered(sockets: list[socket.socket]) -> socket.socket:
    ready, _, _ = select.select(sockets, [], [], 120)
    assert ready, "no response within 120 s"
    return ready[0]


def test_log_verbose_is_our_lines_and_grpc_debug_needs_its_own_switch() -> None:
    import tritonclient.grpc as grpcclient

    with running_server(extra=["--log-verbose=1", "--trace-config=log_frequency=1"]) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        data = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(data)
        for _ in range(3):
            client.infer("simple", inputs)
        client.close()
        log = server.log()
    assert "loading 'simple' v1 on" in log, log
    assert " grpc." not in log, "grpc's debug lines without GRPC_VERBOSITY=debug"
    # A --trace-config key Triton ignores starts the server, with a warning.
    assert "ignoring unknown global trace setting 'log_frequency'" in log
    assert "did you mean 'triton,log_frequency'?" in log
