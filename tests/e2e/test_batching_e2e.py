"""Priorities, queue policies and the delay hook end to end: the real server and tritonclient
over HTTP and gRPC.

The probe model answers each request with the size of the batch it ran in, so batching is
observable from the client. TRITONSERVER_DELAY_SCHEDULER=3 holds every batcher until three
requests are queued, which makes queue states deterministic without any timing.
"""

from __future__ import annotations

import concurrent.futures
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from modelgen import batch_probe_model
from serverproc import EXAMPLE_MODELS, ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

HOLD = 3

PROTOCOLS = ("http", "grpc")
# What a full queue and an expired timeout look like to each client.
UNAVAILABLE = {"http": "503", "grpc": "StatusCode.UNAVAILABLE"}

PROBE_DYNAMIC_BATCHING = {
    "probe_queue": """
  priority_levels: 2
  default_priority_level: 2
  priority_queue_policy { key: 1 value { max_queue_size: 1 } }
""",
    "probe_timeout": """
  priority_levels: 2
  default_priority_level: 2
  priority_queue_policy {
    key: 1
    value {
      timeout_action: REJECT
      default_timeout_microseconds: 60000000
      allow_timeout_override: true
    }
  }
""",
    "bad_policy": """
  priority_levels: 2
  default_priority_level: 3
""",
}


def probe_config(name: str, dynamic_batching: str) -> str:
    return f"""name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "BATCH" data_type: TYPE_FP32 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{{dynamic_batching}}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("batching-repo")
    for base, dynamic_batching in PROBE_DYNAMIC_BATCHING.items():
        # The delay hook fires once per model: each protocol gets its own copy.
        for name in [base] if base == "bad_policy" else [f"{base}_{p}" for p in PROTOCOLS]:
            (repo / name / "1").mkdir(parents=True)
            onnx.save(batch_probe_model(), str(repo / name / "1" / "model.onnx"))
            (repo / name / "config.pbtxt").write_text(probe_config(name, dynamic_batching))
    with running_server(
        [repo],
        ["--exit-on-error=false", "--strict-readiness=false"],
        env={"TRITONSERVER_DELAY_SCHEDULER": str(HOLD)},
    ) as proc:
        yield proc


def infer(
    server: ServerProcess,
    protocol: str,
    model: str,
    value: float,
    priority: int = 0,
    timeout: int | None = None,
) -> float:
    """One request on its own client (so that several can run from threads); returns the
    batch size the request ran in."""
    module = httpclient if protocol == "http" else grpcclient
    data = np.full((1, 4), value, dtype=np.float32)
    tensor = module.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(data)
    if protocol == "http":
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        try:
            result = client.infer(model, [tensor], priority=priority, timeout=timeout)
        finally:
            client.close()
    else:
        channel = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            result = channel.infer(
                model, [tensor], priority=priority, timeout=timeout, client_timeout=60
            )
        finally:
            channel.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    return float(result.as_numpy("BATCH")[0, 0])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_full_priority_queue_is_unavailable_and_the_hook_makes_a_batch_of_exactly_n(
    server: ServerProcess, protocol: str
) -> None:
    model = f"probe_queue_{protocol}"
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        # Level 1 holds one request; of two, exactly one is refused at once.
        urgent = [pool.submit(infer, server, protocol, model, v, priority=1) for v in (1, 2)]
        done, _ = concurrent.futures.wait(
            urgent, timeout=60, return_when=concurrent.futures.FIRST_COMPLETED
        )
        assert len(done) == 1
        refused = done.pop()
        error = refused.exception()
        assert isinstance(error, InferenceServerException)
        assert error.status() == UNAVAILABLE[protocol]
        assert error.message() == "Exceeds maximum queue size"
        held = next(f for f in urgent if f is not refused)
        assert not held.done()
        # Two more at the default level make three queued: the batcher lets go, once.
        relaxed = [pool.submit(infer, server, protocol, model, v) for v in (3, 4)]
        sizes = [f.result(timeout=60) for f in (held, *relaxed)]
    assert sizes == [HOLD] * HOLD
    # The hook is one-shot: a lone request now runs alone.
    assert infer(server, protocol, model, 5) == 1
    # The statistics extension sees the same: one execution of 3, one of 1; the refusal by
    # the full queue is no failure of the model's (Triton's Enqueue returns it uncounted).
    stats = httpx.get(server.base_url + f"/v2/models/{model}/stats", timeout=10).json()
    model_stats = stats["model_stats"][0]
    executions = {b["batch_size"]: b["compute_infer"]["count"] for b in model_stats["batch_stats"]}
    assert executions == {1: 1, HOLD: 1}
    assert model_stats["inference_stats"]["success"]["count"] == HOLD + 1
    assert model_stats["inference_stats"]["fail"]["count"] == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_request_timeout_parameter_rejects_a_queued_request(
    server: ServerProcess, protocol: str
) -> None:
    model = f"probe_timeout_{protocol}"
    # The batcher is still held (nothing queued yet), so this request waits, and its own
    # 1 ms timeout, allowed by the level's policy, expires.
    with pytest.raises(InferenceServerException) as info:
        infer(server, protocol, model, 1, priority=1, timeout=1000)
    assert info.value.status() == UNAVAILABLE[protocol]
    assert info.value.message() == "Request timeout expired"
    with concurrent.futures.ThreadPoolExecutor(HOLD) as pool:
        futures = [pool.submit(infer, server, protocol, model, v, priority=1) for v in range(3)]
        assert [f.result(timeout=60) for f in futures] == [HOLD] * HOLD


def test_a_bad_queue_policy_fails_only_its_own_load(server: ServerProcess) -> None:
    rows = httpx.post(server.base_url + "/v2/repository/index", json={}, timeout=10).json()
    bad = next(row for row in rows if row["name"] == "bad_policy")
    assert bad["state"] == "UNAVAILABLE"
    assert "default priority level must be in range [1, 2] for bad_policy" in bad["reason"]
    assert "failed to load 'bad_policy'" in server.log()
    ready = httpx.get(server.base_url + "/v2/models/probe_queue_http/ready", timeout=10)
    assert ready.status_code == 200
    assert server.alive()


def test_adaptive_batching_flag_serves_correct_results_under_concurrency(tmp_path: Path) -> None:
    # The example `simple` with dynamic batching (its config, as Triton's, has none).
    shutil.copytree(EXAMPLE_MODELS / "simple", tmp_path / "simple")
    config = tmp_path / "simple" / "config.pbtxt"
    config.write_text(config.read_text() + "dynamic_batching {}\n")
    with running_server([tmp_path], ["--adaptive-batching=true"]) as proc:
        assert "model 'simple': adaptive batching" in proc.log()

        def one(value: int) -> None:
            client = httpclient.InferenceServerClient(proc.http_url)
            try:
                a = np.full((1, 16), value, dtype=np.int32)
                b = np.arange(16, dtype=np.int32).reshape(1, 16)
                inputs = [
                    httpclient.InferInput("INPUT0", [1, 16], "INT32"),
                    httpclient.InferInput("INPUT1", [1, 16], "INT32"),
                ]
                inputs[0].set_data_from_numpy(a)
                inputs[1].set_data_from_numpy(b)
                for _ in range(5):
                    result = client.infer("simple", inputs)
                    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
                    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            finally:
                client.close()

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for future in [pool.submit(one, v) for v in range(8)]:
                future.result(timeout=60)
        # The controller's choice and the queue depth reach the metrics endpoint.
        text = httpx.get(proc.metrics_url, timeout=10).text
        simple = [line for line in text.splitlines() if 'model="simple"' in line]
        assert any(line.startswith("ge_serve_target_batch_size{") for line in simple), text
        assert any(line.startswith("ge_serve_batch_window_us{") for line in simple), text
        assert any(line.startswith("ge_serve_queue_depth{") for line in simple), text
