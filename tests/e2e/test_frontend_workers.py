"""`--grpc-workers`, `--http-workers`: worker processes accept connections and feed the
one scheduler.

Requests that arrive through different workers run in one batch (the probe model answers
each request with the size of its batch, and TRITONSERVER_DELAY_SCHEDULER holds the
batcher until every request is queued); a worker that is killed is started again while
the others keep serving; errors, metadata and statistics are the server's own.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pymodels
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from certs import make_tls_files
from modelgen import batch_probe_model, identity_model, write_model
from onnx import TensorProto
from polling import poll
from serverproc import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc
from ge_serve.server.startup.grpc_core import EXPERIMENTS, VARIABLE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

WORKERS = 2
# TRITONSERVER_DELAY_SCHEDULER: the first batch waits until this many requests are queued.
HELD = 12
# Floats per request of the `wide` model: 256 KiB, past the link's inline limit.
WIDE = 65536
# Connections opened at most while looking for one on every worker.
MAX_CONNECTIONS = 48

CONFIG = """name: "probe"
backend: "onnxruntime"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "BATCH" data_type: TYPE_FP32 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { }
"""
# The probe again, for the one test that sends its first batch: no other test sends to it,
# so its batcher still holds, and its statistics are that test's alone, on a shared server.
HELD_CONFIG = CONFIG.replace('name: "probe"', 'name: "held"')
WIDE_CONFIG = f"""name: "wide"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {WIDE} ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {WIDE} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
# No batching: the batchers here hold requests until HELD are queued.
TEXT_CONFIG = """name: "text"
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_STRING dims: [ -1, -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_STRING dims: [ -1, -1 ] } ]
"""


def worker_pids(server: ServerProcess, module: bytes = b"ge_serve.server.grpc.worker") -> list[int]:
    pids: list[int] = []
    for task in Path(f"/proc/{server.process.pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if module in cmdline:
                pids.append(int(child))
    return sorted(pids)


def connections_of(pid: int, port: int, state: str = "01") -> int:
    """TCP sockets on `port` in `state` (01 established, 0A listening) that `pid` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == state and fields[9] in inodes:
                count += 1
    return count


def all_listening(server: ServerProcess) -> bool:
    """Every gRPC worker runs and listens (a restarted one only after a while)."""
    pids = worker_pids(server)
    return len(pids) == WORKERS and all(connections_of(p, server.grpc_port, "0A") for p in pids)


def probe_request(value: float, model: str = "probe") -> pb.ModelInferRequest:
    data = np.full((1, 4), value, dtype=np.float32)
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(data.tobytes())
    return request


def open_channel(server: ServerProcess) -> grpc.Channel:
    # A channel of its own: its own TCP connection, which the kernel gives one worker.
    channel = grpc.insecure_channel(
        server.grpc_url, options=[("grpc.use_local_subchannel_pool", 1)]
    )
    grpc.channel_ready_future(channel).result(timeout=30)
    return channel


def spread_channels(server: ServerProcess) -> list[grpc.Channel]:
    """Connections until every worker holds at least one."""
    channels: list[grpc.Channel] = []
    pids = worker_pids(server)
    while len(channels) < MAX_CONNECTIONS:
        channels.append(open_channel(server))
        if len(channels) >= WORKERS and all(connections_of(p, server.grpc_port) for p in pids):
            return channels
    raise AssertionError(f"{MAX_CONNECTIONS} connections did not reach every worker")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("workers-repo")
    write_model(path, "probe", batch_probe_model(), CONFIG)
    write_model(path, "held", batch_probe_model(), HELD_CONFIG)
    # 256 KiB a request: tensors this large travel through shared memory.
    write_model(path, "wide", identity_model(TensorProto.FLOAT, ("batch", None)), WIDE_CONFIG)
    write_model(path, "text", identity_model(TensorProto.STRING, ("batch", None)), TEXT_CONFIG)
    return path


@contextlib.contextmanager
def grpc_workers_server(repo: Path) -> Iterator[ServerProcess]:
    env = {"TRITONSERVER_DELAY_SCHEDULER": str(HELD)}
    with running_server([repo], ["--grpc-workers", str(WORKERS)], env=env) as proc:
        poll(lambda: all_listening(proc), 30, "the workers")
        yield proc


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    """One server for the module's tests that leave its workers as they found them: each
    releases the probe's hold before it uses the probe (the one test that sends the first
    batch uses a model of its own), and none reads statistics that another test moves."""
    with grpc_workers_server(repo) as proc:
        yield proc


@pytest.fixture
def own_server(repo: Path) -> Iterator[ServerProcess]:
    """A server for a test that kills one of its workers."""
    with grpc_workers_server(repo) as proc:
        yield proc


def test_requests_through_every_worker_share_one_batch(server: ServerProcess) -> None:
    channels = spread_channels(server)
    stubs = [pb_grpc.GRPCInferenceServiceStub(c) for c in channels]
    # HELD requests over connections on every worker; the batcher waits for all of them.
    calls = [
        stubs[i % len(stubs)].ModelInfer.future(probe_request(float(i), "held"), timeout=60)
        for i in range(HELD)
    ]
    for index, call in enumerate(calls):
        answer = call.result()
        out = np.frombuffer(answer.raw_output_contents[0], dtype=np.float32)
        batch = np.frombuffer(answer.raw_output_contents[1], dtype=np.float32)
        assert out.tolist() == [float(index)] * 4
        assert batch[0] == HELD  # every request, from every worker, in one batch
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        (stats,) = client.get_inference_statistics("held").model_stats
        assert stats.inference_count == HELD
        assert stats.execution_count == 1
    finally:
        client.close()
    for channel in channels:
        channel.close()
    # Each worker took its calls through its call intake (it logs when it cannot).
    assert "calls start one per loop wakeup" not in server.log()


def test_grpc_workers_run_grpc_core_as_the_server_does(server: ServerProcess) -> None:
    """The server takes its GRPC_EXPERIMENTS choice back once grpc has read it
    (test_grpc_core_environment.py); its gRPC workers are given it."""
    pids = worker_pids(server)
    assert len(pids) == WORKERS
    for pid in pids:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"{VARIABLE}={EXPERIMENTS}".encode() in environ


def _release_hold(server: ServerProcess) -> None:
    """Send the held count of requests at once, so the batcher stops holding."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with concurrent.futures.ThreadPoolExecutor(HELD) as pool:
            list(pool.map(lambda v: infer_probe(client, v), range(HELD)))
    finally:
        client.close()


def infer_probe(client: grpcclient.InferenceServerClient, value: float) -> float:
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), value, dtype=np.float32))
    result = client.infer("probe", [tensor], client_timeout=60)
    assert result.as_numpy("OUTPUT0").tolist() == [[value] * 4]
    return float(result.as_numpy("BATCH")[0, 0])


def test_a_killed_worker_is_started_again_while_the_others_serve(
    own_server: ServerProcess,
) -> None:
    server = own_server
    _release_hold(server)
    channels = spread_channels(server)
    stubs = [pb_grpc.GRPCInferenceServiceStub(c) for c in channels]
    first = worker_pids(server)[0]
    os.kill(first, signal.SIGKILL)
    poll(lambda: first not in worker_pids(server), 30, "the killed worker to go")
    # Connections on the other worker keep being answered; those on the killed one fail
    # UNAVAILABLE (or reconnect to a live worker).
    answered = 0
    for stub in stubs:
        try:
            stub.ModelInfer(probe_request(1.0), timeout=30)
            answered += 1
        except grpc.RpcError as exc:
            assert exc.code() is grpc.StatusCode.UNAVAILABLE
    assert answered >= 1
    poll(lambda: all_listening(server), 60, "the worker to be started again")
    assert server.alive()
    for channel in channels:
        channel.close()
    # New connections reach the restarted worker too, and every one is answered.
    for channel in spread_channels(server):
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(probe_request(2.0), timeout=30)
        channel.close()
    assert "starting it again" in server.log()


def test_errors_metadata_and_streams_are_the_servers_own(server: ServerProcess) -> None:
    _release_hold(server)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert client.is_server_ready()
        assert client.get_model_metadata("probe").name == "probe"
        with pytest.raises(InferenceServerException, match="unknown model: 'nope'"):
            client.get_model_metadata("nope")
        wrong = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
        wrong.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("probe", [wrong])
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "unexpected shape for input 'INPUT0'" in str(caught.value)
        good = grpcclient.InferInput("INPUT0", [2, 4], "FP32")
        good.set_data_from_numpy(np.ones((2, 4), dtype=np.float32))
        # A stream goes on to the server's own front end.
        answers: list[object] = []
        client.start_stream(callback=lambda result, error: answers.append(error or result))
        client.async_stream_infer("probe", [good])
        poll(lambda: bool(answers), 30, "the stream's answer")
        client.stop_stream()
        assert not isinstance(answers[0], Exception)
    finally:
        client.close()


def test_large_tensors_travel_through_shared_memory(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    rng = np.random.default_rng(0)
    samples = [rng.random((1, WIDE), dtype=np.float32) for _ in range(HELD)]

    def infer(data: np.ndarray) -> np.ndarray:
        tensor = grpcclient.InferInput("INPUT", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        out = client.infer("wide", [tensor], client_timeout=60).as_numpy("OUTPUT")
        assert isinstance(out, np.ndarray)  # tritonclient is untyped
        return out

    try:
        # Concurrent requests (as many as the hook holds for): their regions are in use
        # at once, then reused.
        with concurrent.futures.ThreadPoolExecutor(HELD) as pool:
            for _ in range(3):
                for data, out in zip(samples, pool.map(infer, samples), strict=True):
                    np.testing.assert_array_equal(out, data)
        # BYTES too, both ways: carried in the message, a large one could pass the link's
        # frame limit and end the link for every request on the worker.
        text = np.array([[bytes([65 + i % 26]) * (WIDE + i) for i in range(4)]], dtype=object)
        tensor = grpcclient.InferInput("INPUT", list(text.shape), "BYTES")
        tensor.set_data_from_numpy(text)
        echoed = client.infer("text", [tensor], client_timeout=60).as_numpy("OUTPUT")
        assert echoed is not None and echoed.tolist() == text.tolist()
    finally:
        client.close()


def http_worker_pids(server: ServerProcess) -> list[int]:
    return worker_pids(server, b"ge_serve.server.http.worker")


def test_http_workers_serve_every_route_and_one_killed_is_started_again(repo: Path) -> None:
    with running_server([repo], ["--http-workers", str(WORKERS)]) as server:
        poll(lambda: len(http_worker_pids(server)) == WORKERS, 30, "the workers")
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            assert client.is_server_ready()
            assert client.get_model_metadata("probe")["name"] == "probe"
            tensor = httpclient.InferInput("INPUT0", [2, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((2, 4), dtype=np.float32))
            result = client.infer("probe", [tensor])
            assert result.as_numpy("OUTPUT0").tolist() == [[1.0] * 4] * 2
            (stats,) = client.get_inference_statistics("probe")["model_stats"]
            assert (stats["inference_count"], stats["execution_count"]) == (2, 1)  # samples
        finally:
            client.close()
        missing = httpx.get(server.base_url + "/v2/models/nope", timeout=30)
        assert missing.status_code == 404
        assert missing.json() == {"error": "Request for unknown model: 'nope' is not found"}
        bad = httpx.post(server.base_url + "/v2/models/probe/infer", content=b"{", timeout=30)
        assert bad.status_code == 400 and "failed to parse the request JSON" in bad.json()["error"]
        metrics = httpx.get(server.base_url + "/metrics", timeout=30)
        assert 'nv_inference_request_success{model="probe",version="1"} 1' in metrics.text
        first = http_worker_pids(server)[0]
        os.kill(first, signal.SIGKILL)
        poll(lambda: first not in http_worker_pids(server), 30, "the killed worker to go")
        # The other worker keeps answering new connections meanwhile.
        assert httpx.get(server.base_url + "/v2/health/ready", timeout=30).status_code == 200
        poll(lambda: len(http_worker_pids(server)) == WORKERS, 60, "the worker to start again")
        for _ in range(8):  # new connections, over both workers
            assert httpx.get(server.base_url + "/v2/health/ready", timeout=30).status_code == 200


@pytest.fixture(scope="module")
def one_http_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with one HTTP worker, for the tests that only send it requests."""
    repo = pymodels.write(tmp_path_factory.mktemp("one-worker") / "models", "llm")
    write_model(repo, "probe", batch_probe_model(), CONFIG)
    with running_server([repo], ["--http-workers", "1"]) as server:
        poll(lambda: len(http_worker_pids(server)) == 1, 30, "the worker")
        yield server


def test_http_workers_compress_and_stream_as_the_server_does(
    one_http_worker: ServerProcess, tmp_path: Path
) -> None:
    server = one_http_worker
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                        "data": [1, 2, 3, 4]}]}  # fmt: skip
    # Inference, answered by the worker: compressed as the client accepts.
    answer = httpx.post(
        server.base_url + "/v2/models/probe/infer",
        content=json.dumps(body),
        headers={"Accept-Encoding": "gzip"},
        timeout=30,
    )
    assert answer.status_code == 200
    assert answer.headers["content-encoding"] == "gzip"
    # httpx decodes it; the header said it came compressed.
    assert answer.json()["outputs"][0]["data"] == [1, 2, 3, 4]
    # generate_stream is passed on to the server; each event must reach the client
    # while the model still runs: it sends event i only once the client, on reading
    # event i - 1, has created gate file i.
    gate = str(tmp_path / "gate-")
    request = {"PROMPT": "hi", "STREAM": True, "REPETITION": 3, "GATE": gate}
    events = []
    with httpx.stream(
        "POST",
        server.base_url + "/v2/models/llm/generate_stream",
        json=request,
        timeout=30,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: ")))
                Path(gate + str(len(events))).touch()
    assert [e.get("TEXT") for e in events] == ["hi"] * 3, events
    # A client that goes away mid-stream cancels the request in the server.
    request = {"PROMPT": "hi", "STREAM": True, "REPETITION": 50, "DELAY": 0.1}
    url = server.base_url + "/v2/models/llm/generate_stream"
    with httpx.stream("POST", url, json=request, timeout=30) as response:
        assert next(response.iter_lines()).startswith("data: ")
    poll(lambda: "llm: the request was cancelled" in server.log(), 30, "the model stops")


def raw_exchange(port: int, request: bytes) -> bytes:
    """What a bare socket-level client gets back for `request`: all of it, to the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
        return answer


def test_http_workers_answer_requests_without_one_host_as_the_server_does(
    one_http_worker: ServerProcess,
) -> None:
    # A health probe over HTTP/1.0 sends no Host (HAProxy's httpchk); the server answers
    # by the path alone, and so must a worker that passes the request on: it was a 503.
    requests = [
        b"GET /v2/health/ready HTTP/1.0\r\n\r\n",
        b"GET /v2/health/ready HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET /v2 HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n",
        b"GET /v2/models/probe/ready HTTP/1.1\r\nHost: a\r\nX-Odd: b \t\r\n"
        b"Connection: close\r\n\r\n",
    ]
    server = one_http_worker
    for request in requests:
        answer = raw_exchange(server.http_port, request)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), (request, answer)
    metadata = raw_exchange(server.http_port, requests[2]).split(b"\r\n\r\n", 1)[1]
    assert json.loads(metadata)["name"] == "triton"


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual-tls"])
def test_grpc_workers_serve_tls(repo: Path, tmp_path: Path, mutual: bool) -> None:
    """--grpc-use-ssl[-mutual] with workers: each worker serves TLS on the public port
    (inference there, metadata passed on); a plaintext client, or one without a
    certificate where one is required, is refused."""
    tls = make_tls_files(tmp_path)
    flags = ["--grpc-workers", "1", f"--grpc-server-cert={tls.cert}",
             f"--grpc-server-key={tls.key}", f"--grpc-root-cert={tls.ca}"]  # fmt: skip
    flags.append("--grpc-use-ssl-mutual=true" if mutual else "--grpc-use-ssl=true")
    with running_server([repo], flags) as server:
        # The server's own certificate, signed by the CA, serves as the client's.
        own = {"private_key": str(tls.key), "certificate_chain": str(tls.cert)}
        secure = grpcclient.InferenceServerClient(
            server.grpc_url, ssl=True, root_certificates=str(tls.ca), **own
        )
        try:
            poll(lambda: _answers(secure), 60, "ready over TLS")
            assert secure.get_model_metadata("probe").name == "probe"
            tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
            result = secure.infer("probe", [tensor])
            assert result.as_numpy("OUTPUT0").tolist() == [[1.0] * 4]
        finally:
            secure.close()
        plain = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=5)
        plain.close()
        anonymous = grpcclient.InferenceServerClient(
            server.grpc_url, ssl=True, root_certificates=str(tls.ca)
        )
        try:
            if mutual:
                with pytest.raises(InferenceServerException):
                    anonymous.is_server_live(client_timeout=5)
            else:
                assert anonymous.is_server_live(client_timeout=5)
        finally:
            anonymous.close()


def _answers(client: grpcclient.InferenceServerClient) -> bool:
    try:
        return bool(client.is_server_ready(client_timeout=2))
    except InferenceServerException:
        return False


def test_what_workers_pass_on_reaches_the_server_on_private_unix_sockets(repo: Path) -> None:
    """The server's own front ends answer the workers on Unix sockets in a directory only
    its user may enter, not on a loopback port that any process on the host could reach
    past the public port's TLS: the server process listens on TCP at its public ports
    alone, and the directory goes when it stops."""
    import psutil

    flags = ["--http-workers", "1", "--grpc-workers", "1"]
    with running_server([repo], flags) as server:
        poll(lambda: len(http_worker_pids(server)) == 1, 30, "the HTTP worker")
        proc = psutil.Process(server.process.pid)

        def listening() -> set[int]:
            found = proc.net_connections("inet")
            return {c.laddr.port for c in found if c.status == psutil.CONN_LISTEN}

        # The metrics port may open after the workers answer, on a loaded host.
        poll(lambda: server.metrics_port in listening(), 30, "the metrics port")
        # The HTTP port the workers share is bound here; the gRPC workers bind theirs.
        assert listening() == {server.http_port, server.metrics_port}, listening()
        # Each listening socket, and the server's ends of the connections it accepted.
        paths = sorted(
            {str(c.laddr) for c in proc.net_connections("unix") if str(c.laddr).endswith(".sock")}
        )
        assert [Path(p).name for p in paths] == ["grpc.sock", "http.sock"], paths
        folder = Path(paths[0]).parent
        assert folder.name.startswith("ge-serve-sock-")
        assert folder.stat().st_mode & 0o777 == 0o700
        assert [Path(p).stat().st_mode & 0o777 for p in paths] == [0o600, 0o600]
        # Passed on through them: the server's own answers.
        assert httpx.get(server.base_url + "/v2/models/probe", timeout=30).json()["name"] == "probe"
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            assert client.get_model_metadata("probe").name == "probe"
        finally:
            client.close()
    assert not folder.exists()


def test_a_worker_that_cannot_start_again_says_why_once_and_comes_back(
    repo: Path, tmp_path: Path
) -> None:
    """A gRPC worker killed while its certificate file is gone cannot start again: the
    reason is logged once (not at every try, nor as the kill of each failed start), and
    the worker serves again once the file is back."""
    tls = make_tls_files(tmp_path)
    flags = ["--grpc-workers", "1", "--grpc-use-ssl=true", f"--grpc-server-cert={tls.cert}",
             f"--grpc-server-key={tls.key}"]  # fmt: skip
    with running_server([repo], flags) as server:
        certificate = tls.cert.read_bytes()
        tls.cert.unlink()
        (first,) = worker_pids(server)
        os.kill(first, signal.SIGKILL)
        poll(lambda: "(trying again)" in server.log(), 60, "the failed restart")
        time.sleep(6)  # more tries, past the backoff's 5 s cap
        log = server.log()
        assert log.count("(trying again)") == 1, log
        assert f"cannot read {tls.cert}: No such file or directory (trying again)" in log, log
        assert log.count("was killed by SIGKILL: starting it again") == 1, log
        tls.cert.write_bytes(certificate)
        secure = grpcclient.InferenceServerClient(
            server.grpc_url, ssl=True, root_certificates=str(tls.ca)
        )
        try:
            poll(lambda: _answers(secure), 60, "the worker serving again")
        finally:
            secure.close()
