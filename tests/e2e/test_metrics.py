"""Metrics, statistics and logging end to end: a real server, a known workload, exact counts.

Workload (the `traffic` fixture), on a repository of `simple` and a `gather` model whose
execution fails for an index out of range:
  simple  5 requests of batch 1 and 3 of batch 4    -> 8 successes, 17 inferences, 8 executions
  simple  2 requests with a wrong shape             -> refused, counted nowhere (as Triton)
  gather  2 requests of batch 2                     -> 2 successes, 4 inferences, 2 executions
  gather  3 requests with an index out of range     -> 3 failures, reason BACKEND (one over
                                                       gRPC: answered as invalid input)
  unknown model, 1 request                          -> counted nowhere
`simple` has no dynamic_batching, so each request is one execution.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from modelgen import lookup_model
from polling import poll
from promtext import Exposition, promql_metric_names, scrape
from serverproc import EXAMPLE_MODELS, ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "ge-serve.json"
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
QUANTILES = ("0.5", "0.9", "0.95", "0.99", "0.999")
LATENCIES = ("request", "queue", "compute_input", "compute_infer", "compute_output")

GATHER_CONFIG = """
name: "gather"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INDEX" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "VALUE" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(EXAMPLE_MODELS / "simple", root / "simple")
    (root / "gather" / "1").mkdir(parents=True)
    (root / "gather" / "config.pbtxt").write_text(GATHER_CONFIG)
    onnx.save(lookup_model(), str(root / "gather" / "1" / "model.onnx"))
    return root


def _simple(client: httpclient.InferenceServerClient, batch: int, width: int = 16) -> None:
    inputs = [
        httpclient.InferInput("INPUT0", [batch, width], "INT32"),
        httpclient.InferInput("INPUT1", [batch, width], "INT32"),
    ]
    data = np.arange(batch * width, dtype=np.int32).reshape(batch, width)
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(data)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data * 2)


def _gather(client: httpclient.InferenceServerClient, indices: list[int]) -> np.ndarray:
    value = httpclient.InferInput("INDEX", [len(indices), 1], "INT64")
    value.set_data_from_numpy(np.array(indices, dtype=np.int64).reshape(-1, 1))
    out = client.infer("gather", [value]).as_numpy("VALUE")
    assert isinstance(out, np.ndarray)  # tritonclient is untyped
    return out


def _gather_grpc_out_of_range(server: ServerProcess) -> None:
    value = grpcclient.InferInput("INDEX", [1, 1], "INT64")
    value.set_data_from_numpy(np.array([[9]], dtype=np.int64))
    with (
        grpcclient.InferenceServerClient(server.grpc_url) as client,
        pytest.raises(InferenceServerException) as raised,
    ):
        client.infer("gather", [value])
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert raised.value.message() == (
        "the model could not run on this request's data: Gather node: indices element out "
        "of data bounds, idx=9 must be within the inclusive range [-4,3]"
    )


def run_traffic(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        for _ in range(5):
            _simple(client, 1)
        for _ in range(3):
            _simple(client, 4)
        for _ in range(2):
            with pytest.raises(InferenceServerException, match="unexpected shape"):
                _simple(client, 1, width=8)
        for _ in range(2):
            np.testing.assert_array_equal(_gather(client, [0, 3]), [[1.5], [4.5]])
        for _ in range(2):
            with pytest.raises(InferenceServerException, match="out of data bounds") as raised:
                _gather(client, [9])
            # The request's data, not the server: a 400 (Triton's onnxruntime backend: 500).
            assert raised.value.status() == "400"
        _gather_grpc_out_of_range(server)
        unknown = httpclient.InferInput("X", [1], "INT32")
        unknown.set_data_from_numpy(np.zeros(1, dtype=np.int32))
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.infer("nosuch", [unknown])
    finally:
        client.close()


@pytest.fixture(scope="module")
def traffic(repo: Path) -> Iterator[ServerProcess]:
    with running_server([repo]) as server:
        run_traffic(server)
        yield server


def _wait_for_sample(url: str, name: str, timeout: float = 20.0) -> Exposition:
    """The resource sampler fills its first snapshot right after start; poll for it."""

    def sampled() -> Exposition | None:
        exposition = scrape(url)
        return exposition if exposition.find(name) else None

    with contextlib.suppress(TimeoutError):
        return poll(sampled, timeout, name)
    return scrape(url)


# --- Triton's metrics -------------------------------------------------------------------


@pytest.mark.parametrize("port", ["metrics", "http"])
def test_triton_counters_exact(traffic: ServerProcess, port: str) -> None:
    url = traffic.metrics_url if port == "metrics" else traffic.base_url + "/metrics"
    m = scrape(url)
    expected: dict[str, dict[str, Any]] = {
        "simple": {"success": 8, "count": 17, "exec": 8, "fail": {}},
        "gather": {"success": 2, "count": 4, "exec": 2, "fail": {"BACKEND": 3}},
    }
    for model, want in expected.items():
        at = {"model": model, "version": "1"}
        assert m.value("nv_inference_request_success", **at) == want["success"]
        assert m.value("nv_inference_count", **at) == want["count"]
        assert m.value("nv_inference_exec_count", **at) == want["exec"]
        for reason in REASONS:  # every reason pre-created, at 0 when nothing failed so
            got = m.value("nv_inference_request_failure", **at, reason=reason)
            assert got == want["fail"].get(reason, 0), (model, reason)
        assert m.value("nv_inference_pending_request_count", **at) == 0
        assert m.value("nv_model_load_duration_secs", **at) > 0
        for stage in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
            assert m.value(f"nv_inference_{stage}_duration_us", **at) > 0
    assert m.types["nv_inference_request_success"] == "counter"
    assert m.types["nv_inference_pending_request_count"] == "gauge"
    assert not m.find("nv_inference_request_success", model="nosuch")


def test_counters_agree_with_statistics(traffic: ServerProcess) -> None:
    m = scrape(traffic.metrics_url)
    stats = httpx.get(traffic.base_url + "/v2/models/simple/stats").json()["model_stats"][0]
    inference = stats["inference_stats"]
    at = {"model": "simple", "version": "1"}
    for metric, key in (
        ("nv_inference_request_duration_us", "success"),
        ("nv_inference_queue_duration_us", "queue"),
        ("nv_inference_compute_input_duration_us", "compute_input"),
        ("nv_inference_compute_infer_duration_us", "compute_infer"),
        ("nv_inference_compute_output_duration_us", "compute_output"),
    ):
        assert m.value(metric, **at) == pytest.approx(inference[key]["ns"] / 1e3)


def test_summaries_and_histograms(traffic: ServerProcess) -> None:
    m = scrape(traffic.metrics_url)
    at = {"model": "simple", "version": "1"}
    for stage in LATENCIES:
        name = f"nv_inference_{stage}_summary_us"
        assert m.types[name] == "summary"
        assert m.value(name + "_count", **at) == 8
        counter = "request_duration" if stage == "request" else f"{stage}_duration"
        assert m.value(name + "_sum", **at) == pytest.approx(
            m.value(f"nv_inference_{counter}_us", **at)
        )
        values = [m.value(name, **at, quantile=q) for q in QUANTILES]
        assert all(v > 0 for v in values), values
        assert values == sorted(values)  # quantiles are monotone
    assert m.value("ge_serve_request_duration_us_count", **at) == 8
    assert m.value("ge_serve_request_duration_us_bucket", **at, le="+Inf") == 8
    assert m.value("ge_serve_batch_size_count", **at) == 8
    assert m.value("ge_serve_batch_size_sum", **at) == 17
    assert m.value("ge_serve_batch_size_bucket", **at, le="1.0") == 5
    assert m.value("ge_serve_batch_size_bucket", **at, le="2.0") == 5
    assert m.value("ge_serve_batch_size_bucket", **at, le="4.0") == 8
    gather = {"model": "gather", "version": "1"}
    assert m.value("ge_serve_batch_size_count", **gather) == 2  # failed executions: none
    assert m.value("ge_serve_request_duration_us_count", **gather) == 2
    # Triton's first-response histogram: every response the model sent, its errors too
    # (not the requests refused before it); whole ms, Triton's buckets.
    first = "nv_inference_first_response_histogram_ms"
    assert m.types[first] == "histogram"
    assert m.value(first + "_count", **at) == 8
    assert m.value(first + "_count", **gather) == 5
    les = [labels["le"] for labels, _ in m.find(first + "_bucket", **at)]
    assert les == ["100.0", "500.0", "2000.0", "5000.0", "+Inf"]
    assert m.value(first + "_bucket", **at, le="+Inf") == 8


def test_cpu_metrics(traffic: ServerProcess) -> None:
    m = _wait_for_sample(traffic.metrics_url, "nv_cpu_memory_total_bytes")
    total = m.value("nv_cpu_memory_total_bytes")
    used = m.value("nv_cpu_memory_used_bytes")
    assert 0 < used < total
    assert 0.0 <= m.value("nv_cpu_utilization") <= 1.0
    # The default runtime here is one simulated NPU (no pyACL): it reports as sim0.
    for name in ("ge_serve_device_utilization", "ge_serve_device_memory_used_bytes"):
        assert m.types[name] == "gauge" and [labels for labels, _ in m.find(name)] == [
            {"device": "sim0"}
        ]
    assert m.value("ge_serve_device_memory_total_bytes", device="sim0") == 16 * 1024**3
    assert 0.0 <= m.value("ge_serve_device_utilization", device="sim0") <= 1.0


def test_metrics_port_serves_only_metrics(traffic: ServerProcess) -> None:
    base = f"http://127.0.0.1:{traffic.metrics_port}"
    missing = httpx.get(base + "/v2/health/ready")
    assert missing.status_code == 404 and "error" in missing.json()
    wrong = httpx.post(base + "/metrics")
    assert wrong.status_code == 405 and "error" in wrong.json()
    head = httpx.head(base + "/metrics")
    assert head.status_code == 200 and int(head.headers["content-length"]) > 0


# --- the statistics extension ----------------------------------------------------------

_DURATION = {"count", "ns"}
_INFERENCE_STATS = {
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
}
_MODEL_STAT = {
    "name",
    "version",
    "last_inference",
    "inference_count",
    "execution_count",
    "inference_stats",
    "response_stats",
    "batch_stats",
    "memory_usage",
}


def _check_schema(stat: dict[str, Any]) -> None:
    assert set(stat) == _MODEL_STAT
    assert isinstance(stat["name"], str) and isinstance(stat["version"], str)
    for key in ("last_inference", "inference_count", "execution_count"):
        assert type(stat[key]) is int, key
    assert set(stat["inference_stats"]) == _INFERENCE_STATS
    for value in stat["inference_stats"].values():
        assert set(value) == _DURATION and all(type(v) is int for v in value.values())
    for batch in stat["batch_stats"]:
        assert set(batch) == {"batch_size", "compute_input", "compute_infer", "compute_output"}
        assert type(batch["batch_size"]) is int
        for key in ("compute_input", "compute_infer", "compute_output"):
            assert set(batch[key]) == _DURATION
            assert all(type(v) is int for v in batch[key].values())
    assert stat["memory_usage"] == [] and stat["response_stats"] == {}


def test_statistics_exact(traffic: ServerProcess) -> None:
    started_ms = int(time.time() * 1000) - 600_000
    body = httpx.get(traffic.base_url + "/v2/models/stats").json()
    assert set(body) == {"model_stats"}
    stats = {s["name"]: s for s in body["model_stats"]}
    assert sorted(stats) == ["gather", "simple"]
    for stat in stats.values():
        _check_schema(stat)
        assert stat["version"] == "1"
        assert stat["last_inference"] > started_ms
    simple, gather = stats["simple"], stats["gather"]
    assert simple["inference_count"] == 17 and simple["execution_count"] == 8
    inference = simple["inference_stats"]
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert inference[key]["count"] == 8 and inference[key]["ns"] > 0, key
    # The wrong shapes were refused before the scheduler: not failures, as in Triton.
    assert inference["fail"] == {"count": 0, "ns": 0}
    assert inference["cache_hit"] == {"count": 0, "ns": 0}
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in simple["batch_stats"]] == [
        (1, 5),
        (4, 3),
    ]
    assert gather["inference_count"] == 4 and gather["execution_count"] == 2
    assert gather["inference_stats"]["success"]["count"] == 2
    assert gather["inference_stats"]["fail"]["count"] == 3
    assert [(b["batch_size"], b["compute_input"]["count"]) for b in gather["batch_stats"]] == [
        (2, 2)
    ]


def test_a_refused_request_is_not_printed_by_onnxruntime(traffic: ServerProcess) -> None:
    # The client is told and the failure counted; onnxruntime's own line for each (on
    # stderr, in its format) would let clients fill the server's log.
    assert "out of data bounds" not in traffic.log()


def test_statistics_routes(traffic: ServerProcess) -> None:
    base = traffic.base_url
    one = httpx.get(base + "/v2/models/simple/stats").json()["model_stats"]
    versioned = httpx.get(base + "/v2/models/simple/versions/1/stats").json()["model_stats"]
    assert [s["name"] for s in one] == ["simple"] and versioned == one
    # Triton's answers (core tritonserver.cc, TRITONSERVER_ServerModelStatistics).
    unknown = httpx.get(base + "/v2/models/nosuch/stats")
    assert unknown.status_code == 400
    assert unknown.json() == {"error": "requested model 'nosuch' is not available"}
    bad_version = httpx.get(base + "/v2/models/simple/versions/7/stats")
    assert bad_version.status_code == 400
    assert bad_version.json() == {
        "error": "requested model version is not available for model 'simple'"
    }
    # tritonclient reads the same document
    client = httpclient.InferenceServerClient(traffic.http_url)
    try:
        via_client = client.get_inference_statistics("simple")
        assert via_client["model_stats"][0]["execution_count"] == 8
        assert "statistics" in client.get_server_metadata()["extensions"]
        with pytest.raises(InferenceServerException, match="is not available"):
            client.get_inference_statistics("nosuch")
    finally:
        client.close()


def test_statistics_convert_to_grpc_message(traffic: ServerProcess) -> None:
    """The HTTP document uses grpc_service.proto's field names: it parses, unknown fields
    refused, as the ModelStatisticsResponse the gRPC front end sends."""
    from google.protobuf import json_format

    from ge_serve.protos import grpc_service_pb2

    body = httpx.get(traffic.base_url + "/v2/models/stats").json()
    message = json_format.ParseDict(body, grpc_service_pb2.ModelStatisticsResponse())
    by_name = {s.name: s for s in message.model_stats}
    assert by_name["simple"].inference_stats.success.count == 8
    assert by_name["simple"].batch_stats[1].batch_size == 4


# --- logging extension -----------------------------------------------------------------


def _log_has(server: ServerProcess, pattern: str, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, server.log()):
            return True
        time.sleep(0.05)
    return False


def test_logging_extension_changes_levels(traffic: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(traffic.http_url)
    try:
        initial = client.get_log_settings()
        assert initial == {
            "log_file": "",
            "log_info": True,
            "log_warning": True,
            "log_error": True,
            "log_verbose_level": 0,
            "log_format": "default",
        }
        # Verbose off: the scrape's debug line is not logged.
        scrape(traffic.metrics_url)
        assert "metrics rendered" not in traffic.log()
        settings = client.update_log_settings({"log_verbose_level": 1})
        assert settings == {**initial, "log_verbose_level": 1}
        scrape(traffic.metrics_url)
        # Triton's line: level letter I for verbose too, MMDD, µs, pid, file:line, and
        # the message as a JSON string.
        assert _log_has(
            traffic, r"(?m)^I\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ metrics\.py:\d+\] \"metrics rendered"
        )
        # Info off: the change itself (an info line) is no longer logged.
        client.update_log_settings({"log_verbose_level": 0, "log_info": False})
        client.update_log_settings({"log_format": "ISO8601"})
        assert "log settings changed: {'log_format'" not in traffic.log()
        settings = client.update_log_settings({"log_info": True})
        assert settings["log_format"] == "ISO8601" and settings["log_info"] is True
        assert _log_has(
            traffic,
            r"(?m)^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I \d+ logsettings\.py:\d+\] "
            r"\"log settings changed: \{'log_info'",
        )
        with pytest.raises(InferenceServerException, match="log file"):
            client.update_log_settings({"log_file": "x.log"})
        with pytest.raises(InferenceServerException, match="boolean"):
            client.update_log_settings({"log_info": "yes", "log_error": False})
        assert client.get_log_settings()["log_error"] is True  # a bad request changes nothing
        client.update_log_settings({"log_format": "default"})
        bad = httpx.post(traffic.base_url + "/v2/logging", content=b"[1]")
        assert bad.status_code == 400 and "error" in bad.json()
        assert "logging" in client.get_server_metadata()["extensions"]
    finally:
        client.close()


# --- configurations ----------------------------------------------------------------------


def test_summaries_off(repo: Path) -> None:
    with running_server([repo], ["--metrics-config", "summary_latencies=false"]) as server:
        run_traffic(server)
        m = scrape(server.metrics_url)
        assert not any("_summary_us" in name for name in m.names)
        assert m.value("nv_inference_request_success", model="simple", version="1") == 8
        assert m.value("ge_serve_request_duration_us_count", model="simple", version="1") == 8


def test_metrics_off(repo: Path) -> None:
    with running_server([repo], ["--allow-metrics=false"]) as server:
        run_traffic(server)
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.metrics_url, timeout=2)
        assert httpx.get(server.base_url + "/metrics").status_code == 404
        # Statistics stay on: perf_analyzer needs them whatever the metrics say.
        stats = httpx.get(server.base_url + "/v2/models/simple/stats").json()["model_stats"][0]
        assert stats["execution_count"] == 8


def test_bad_metrics_config_is_a_usage_error(repo: Path) -> None:
    expected = r"exited early \(2\)[\s\S]*unknown key 'nonsense'"
    with (
        pytest.raises(RuntimeError, match=expected),
        running_server([repo], ["--metrics-config", "nonsense=1"]),
    ):
        pass


# --- the Grafana dashboard queries only names the server exports ---------------------------


def test_promql_name_extraction() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, model) (rate(x_bucket{model=~"$model"}'
        '[$__rate_interval]))) / sum without (a) (y) + on (b) z{q="rate(w)"}'
    )
    assert promql_metric_names(expr) == {"x_bucket", "y", "z"}


def _dashboard_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    found: list[tuple[str, str]] = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found.append((panel["title"], target["expr"]))
    for variable in dashboard["templating"]["list"]:
        if variable.get("type") == "query":
            query = re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", variable["definition"])
            found.append((variable["name"], query))
    return found


def test_dashboard_has_the_panels() -> None:
    titles = " | ".join(p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]).lower()
    for words in (
        "requests per second",
        "batches",
        "samples",
        "p50 / p95 / p99",
        "queue time",
        "batch size distribution",
        "pending requests per priority",
        "device utilization",
        "device memory",
    ):
        assert words in titles, words


def test_dashboard_queries_only_exported_names(traffic: ServerProcess) -> None:
    exported = scrape(traffic.metrics_url).names
    exprs = _dashboard_exprs()
    assert len(exprs) > 10
    for where, expr in exprs:
        names = promql_metric_names(expr)
        assert names, (where, expr)
        missing = names - exported
        assert not missing, f"panel '{where}' queries {missing}, which ge-serve does not export"
