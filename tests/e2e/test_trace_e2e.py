"""The trace extension: settings read and changed at run time with tritonclient (HTTP, gRPC
and both aio clients), Triton's trace file with its timestamps in order, ensemble steps and
a Python model's BLS calls linked to their ensemble or caller, and OpenTelemetry spans
exported over OTLP/HTTP to a receiver the test runs, honouring the client's W3C
traceparent."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pymodels
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as http_aio
from ensemblerepo import write_pipelines
from polling import poll
from serverproc import ServerProcess, free_ports, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ORDER = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]
# A client's request over HTTP: Triton's front-end timestamps around the core's, in the
# order Triton writes them (its trace_summary.py keeps only traces with HTTP_RECV_START
# or GRPC_WAITREAD_START).
HTTP_ORDER = [
    "HTTP_RECV_START",
    "HTTP_RECV_END",
    *ORDER,
    "INFER_RESPONSE_COMPLETE",
    "HTTP_SEND_START",
    "HTTP_SEND_END",
]
# Over gRPC Triton keeps the front end's timestamps until the call is done, so they
# follow REQUEST_END in its file.
GRPC_MARKS = [
    "GRPC_WAITREAD_START",
    "GRPC_WAITREAD_END",
    "INFER_RESPONSE_COMPLETE",
    "GRPC_SEND_START",
    "GRPC_SEND_END",
]


def chain_input(module: Any) -> list[Any]:
    tensor = module.InferInput("IN", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    return [tensor]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = write_pipelines(tmp_path_factory.mktemp("models"))
    return pymodels.write(repo, "add_sub_copy", "bls_traced")


def bls_input(module: Any = httpclient) -> list[Any]:
    """bls_traced's request: it calls add_sub_copy (Python) with INPUT0 and INPUT1."""
    name = module.InferInput("MODEL_NAME", [1], "BYTES")
    name.set_data_from_numpy(np.array([b"add_sub_copy"], dtype=object))
    tensors = [name]
    for key in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(key, [4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        tensors.append(tensor)
    return tensors


def written(folder: Path) -> list[dict[str, Any]]:
    """Every record of the trace files written so far."""
    records: list[dict[str, Any]] = []
    for path in sorted(folder.glob("trace.json.*")):
        records += json.loads(path.read_text())
    return records


@pytest.fixture(scope="module")
def traced(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("traces")
    flags = [
        f"--trace-config=triton,file={folder / 'trace.json'}",
        "--trace-config=triton,log-frequency=1",
        "--trace-config=rate=1",
        "--trace-config=level=OFF",
    ]
    with running_server([repo], flags) as proc:
        proc.trace_folder = folder  # type: ignore[attr-defined]
        yield proc


def test_settings_over_http_and_grpc(traced: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(traced.http_url)
    grpc = grpcclient.InferenceServerClient(traced.grpc_url)
    assert "trace" in http.get_server_metadata()["extensions"]
    start = http.get_trace_settings()
    assert start["trace_level"] == ["OFF"] and start["trace_rate"] == "1"
    assert start["log_frequency"] == "1" and start["trace_mode"] == "triton"
    assert start["trace_file"].endswith("trace.json")

    updated = http.update_trace_settings(settings={"trace_rate": "5", "trace_count": "10"})
    assert (updated["trace_rate"], updated["trace_count"]) == ("5", "10")
    seen = grpc.get_trace_settings(as_json=True)["settings"]
    assert seen["trace_rate"]["value"] == ["5"] and seen["trace_count"]["value"] == ["10"]

    model = grpc.update_trace_settings("add1", {"trace_rate": "2"}, as_json=True)["settings"]
    assert model["trace_rate"]["value"] == ["2"] and model["trace_count"]["value"] == ["10"]
    assert http.get_trace_settings("add1")["trace_rate"] == "2"
    assert http.get_trace_settings()["trace_rate"] == "5", "the global rate is unchanged"
    cleared = http.update_trace_settings("add1", {"trace_rate": None})
    assert cleared["trace_rate"] == "5", "back to the global setting"
    restored = grpc.update_trace_settings(settings={"trace_rate": "1", "trace_count": "-1"})
    assert restored is not None

    with pytest.raises(Exception, match="trace file location can not be updated"):
        http.update_trace_settings(settings={"trace_file": "/tmp/elsewhere"})
    with pytest.raises(Exception, match="Expect only one trace level 'OFF' is specified"):
        grpc.update_trace_settings(settings={"trace_level": ["OFF", "TIMESTAMPS"]})
    with pytest.raises(Exception, match="Unable to parse 'trace_rate', got: often"):
        http.update_trace_settings(settings={"trace_rate": "often"})
    with pytest.raises(Exception, match="Request for unknown model : nope"):
        grpc.get_trace_settings("nope")
    http.close()
    grpc.close()


def test_settings_with_the_aio_clients(traced: ServerProcess) -> None:
    async def both() -> tuple[Any, Any]:
        http = http_aio.InferenceServerClient(traced.http_url)
        grpc = grpc_aio.InferenceServerClient(traced.grpc_url)
        try:
            await http.update_trace_settings(settings={"trace_count": "7"})
            got_http = await http.get_trace_settings()
            got_grpc = await grpc.get_trace_settings(as_json=True)
            await grpc.update_trace_settings(settings={"trace_count": "-1"})
            return got_http, got_grpc
        finally:
            await http.close()
            await grpc.close()

    got_http, got_grpc = asyncio.run(both())
    assert got_http["trace_count"] == "7"
    assert got_grpc["settings"]["trace_count"]["value"] == ["7"]


def test_traced_requests_write_tritons_trace_file(traced: ServerProcess) -> None:
    folder: Path = traced.trace_folder  # type: ignore[attr-defined]
    http = httpclient.InferenceServerClient(traced.http_url)
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    try:
        result = http.infer("chain", chain_input(httpclient), request_id="req-1")
        np.testing.assert_array_equal(
            result.as_numpy("OUT"), np.arange(4, dtype=np.float32).reshape(1, 4) + 11
        )
    finally:
        http.update_trace_settings(settings={"trace_level": ["OFF"]})
        http.close()

    poll(lambda: any(r.get("model_name") == "chain" for r in written(folder)), 20, "trace file")
    records = written(folder)
    heads = {r["id"]: r for r in records if "model_name" in r}
    (ensemble,) = [h for h in heads.values() if h["model_name"] == "chain"]
    assert ensemble["request_id"] == "req-1" and ensemble["model_version"] == 1
    steps = [h for h in heads.values() if h.get("parent_id") == ensemble["id"]]
    assert sorted(h["model_name"] for h in steps) == ["add1", "add10"]
    for head in [ensemble, *steps]:
        stamps = [
            t
            for r in records
            if r["id"] == head["id"] and "timestamps" in r
            for t in r["timestamps"]
        ]
        expected = HTTP_ORDER if head is ensemble else ORDER
        assert [t["name"] for t in stamps] == expected, head
        times = [t["ns"] for t in stamps]
        assert times == sorted(times), stamps


def test_a_bls_call_is_traced_as_its_callers_child(traced: ServerProcess) -> None:
    folder: Path = traced.trace_folder  # type: ignore[attr-defined]
    http = httpclient.InferenceServerClient(traced.http_url)
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    try:
        result = http.infer("bls_traced", bls_input(), request_id="bls-1")
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), np.arange(4) * 2)
    finally:
        http.update_trace_settings(settings={"trace_level": ["OFF"]})
        http.close()

    def heads() -> list[dict[str, Any]]:
        return [r for r in written(folder) if "model_name" in r]

    def child_written() -> bool:
        callers = [h for h in heads() if h.get("request_id") == "bls-1"]
        return bool(callers) and any(h.get("parent_id") == callers[0]["id"] for h in heads())

    poll(child_written, 20, "the BLS call's trace")
    (caller,) = [h for h in heads() if h.get("request_id") == "bls-1"]
    assert caller["model_name"] == "bls_traced" and "parent_id" not in caller
    (child,) = [h for h in heads() if h.get("parent_id") == caller["id"]]
    assert child["model_name"] == "add_sub_copy"
    records = written(folder)

    def stamps(trace_id: int) -> dict[str, int]:
        found = [t for r in records if r["id"] == trace_id for t in r.get("timestamps", [])]
        return {t["name"]: t["ns"] for t in found}

    outer, inner = stamps(caller["id"]), stamps(child["id"])
    assert list(inner) == ORDER
    assert list(outer) == HTTP_ORDER
    # The call ran inside the caller's execution.
    assert outer["COMPUTE_START"] <= inner["REQUEST_START"] <= inner["REQUEST_END"]
    assert inner["REQUEST_END"] <= outer["COMPUTE_END"]


def stamps_of(records: list[dict[str, Any]], trace_id: int) -> list[tuple[str, int]]:
    return [
        (t["name"], t["ns"])
        for r in records
        if r["id"] == trace_id
        for t in r.get("timestamps", [])
    ]


def test_grpc_requests_carry_tritons_grpc_timestamps(traced: ServerProcess) -> None:
    """ModelInfer and ModelStreamInfer traces have GRPC_WAITREAD_START/END,
    INFER_RESPONSE_COMPLETE and GRPC_SEND_START/END, which Triton's trace_summary.py
    needs to find a gRPC trace at all."""
    folder: Path = traced.trace_folder  # type: ignore[attr-defined]
    http = httpclient.InferenceServerClient(traced.http_url)
    grpc = grpcclient.InferenceServerClient(traced.grpc_url)
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    try:
        grpc.infer("add1", chain_input_named(grpcclient), request_id="unary-1")
        answers: list[Any] = []
        done = threading.Event()

        def collect(result: Any, error: Any) -> None:
            answers.append((result, error))
            done.set()

        grpc.start_stream(callback=collect)
        grpc.async_stream_infer("add1", chain_input_named(grpcclient), request_id="stream-1")
        assert done.wait(30) and answers[0][1] is None
        grpc.stop_stream()
    finally:
        http.update_trace_settings(settings={"trace_level": ["OFF"]})
        http.close()
        grpc.close()

    def heads() -> dict[str, dict[str, Any]]:
        return {r["request_id"]: r for r in written(folder) if r.get("request_id")}

    poll(lambda: {"unary-1", "stream-1"} <= set(heads()), 20, "the gRPC traces")
    records = written(folder)
    for request_id in ("unary-1", "stream-1"):
        stamps = stamps_of(records, heads()[request_id]["id"])
        assert [name for name, _ in stamps] == ORDER + GRPC_MARKS, request_id
        at = dict(stamps)
        assert at["GRPC_WAITREAD_START"] <= at["GRPC_WAITREAD_END"] <= at["REQUEST_START"]
        assert at["REQUEST_END"] <= at["INFER_RESPONSE_COMPLETE"] <= at["GRPC_SEND_START"]
        assert at["GRPC_SEND_START"] <= at["GRPC_SEND_END"]


def test_a_bls_call_is_never_sampled_on_its_own(traced: ServerProcess) -> None:
    """As in Triton only a client's request is sampled: with every second request traced,
    the untraced caller's BLS call is not counted as a request to sample, and the traced
    caller's call is its child."""
    folder: Path = traced.trace_folder  # type: ignore[attr-defined]
    http = httpclient.InferenceServerClient(traced.http_url)
    # One sampling count for both models (global settings), as in qa's L0_trace.
    http.update_trace_settings(settings={"trace_rate": "2", "trace_level": ["TIMESTAMPS"]})
    try:
        for index in range(2):
            http.infer("bls_traced", bls_input(), request_id=f"sampled-{index}")
    finally:
        http.update_trace_settings(settings={"trace_rate": "1", "trace_level": ["OFF"]})
        http.close()

    def heads() -> list[dict[str, Any]]:
        return [r for r in written(folder) if "model_name" in r]

    def callers() -> list[dict[str, Any]]:
        return [h for h in heads() if str(h.get("request_id", "")).startswith("sampled-")]

    poll(lambda: any(h.get("parent_id") == c["id"] for c in callers() for h in heads()), 20, "BLS")
    (caller,) = callers()
    assert caller["request_id"] == "sampled-1"
    called = [h for h in heads() if h["model_name"] == "add_sub_copy"]
    assert [h for h in called if "parent_id" not in h] == [], "no BLS call traced alone"
    assert [h for h in called if h["parent_id"] == caller["id"]]


class Receiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP collector for one test: it keeps every export's body (protobuf)."""

    exports: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", 0))
        body = self.rfile.read(length)
        type(self).exports.append(
            {"path": self.path, "type": self.headers.get("content-type"), "body": body}
        )
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        return None


def test_opentelemetry_spans_reach_an_otlp_receiver(repo: Path) -> None:
    (port,) = free_ports(1)
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", port), Receiver)
    Receiver.exports = []
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent_span = "00f067aa0ba902b7"
    flags = [
        "--trace-config=mode=opentelemetry",
        f"--trace-config=opentelemetry,url=http://127.0.0.1:{port}/v1/traces",
        "--trace-config=opentelemetry,bsp_schedule_delay=50",
        "--trace-config=opentelemetry,resource=service.name=ge-serve-test",
        "--trace-config=rate=0",  # only requests that bring a trace context
        "--trace-config=level=TIMESTAMPS",
    ]
    try:
        with running_server([repo], flags) as server:
            client = httpclient.InferenceServerClient(server.http_url)
            settings = client.get_trace_settings()
            assert settings["trace_mode"] == "opentelemetry"
            headers = {"traceparent": f"00-{trace_id}-{parent_span}-01"}
            client.infer("add1", chain_input_named(), headers=headers)
            client.infer("add1", chain_input_named())  # no context, rate 0: not traced
            bls_trace = "a3ce929d0e0e47364bf92f3577b34da6"
            bls_headers = {"traceparent": f"00-{bls_trace}-{parent_span}-01"}
            client.infer("bls_traced", bls_input(), headers=bls_headers)
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            grpc_trace = "0af7651916cd43dd8448eb211c80319c"
            metadata = {"traceparent": f"00-{grpc_trace}-b7ad6b7169203331-01"}
            grpc.infer("add1", chain_input_named(grpcclient), headers=metadata)
            stream_trace = "5b8efff798038103d269b633813fc60c"
            answers: list[Any] = []
            done = threading.Event()

            def collect(result: Any, error: Any) -> None:
                answers.append((result, error))
                done.set()

            stream_headers = {"traceparent": f"00-{stream_trace}-eee19b7ec3c1b174-01"}
            grpc.start_stream(callback=collect, headers=stream_headers)
            grpc.async_stream_infer("add1", chain_input_named(grpcclient))
            assert done.wait(30) and answers[0][1] is None
            grpc.stop_stream()
            grpc.close()
            client.close()

            def spans() -> list[dict[str, Any]]:
                found = []
                for export in Receiver.exports:
                    for resource in otlp_document(export["body"]).get("resourceSpans", []):
                        for scope in resource.get("scopeSpans", []):
                            found += scope.get("spans", [])
                return found

            poll(lambda: len(spans()) >= 14, 30, "OTLP export")
        export = Receiver.exports[0]
        assert export["path"] == "/v1/traces"
        assert export["type"].startswith("application/x-protobuf")
        found = spans()
        by_trace: dict[str, list[dict[str, Any]]] = {}
        for span in found:
            by_trace.setdefault(span["traceId"].lower(), []).append(span)
        expected = {trace_id, grpc_trace, stream_trace, bls_trace}
        assert set(by_trace) == expected, "untraced one left out"
        http_spans = {s["name"]: s for s in by_trace[trace_id]}
        assert set(http_spans) == {"InferRequest", "add1", "compute"}
        assert http_spans["InferRequest"]["parentSpanId"].lower() == parent_span
        assert http_spans["add1"]["parentSpanId"] == http_spans["InferRequest"]["spanId"]
        assert http_spans["compute"]["parentSpanId"] == http_spans["add1"]["spanId"]
        # The BLS call's model span sits inside its caller's model span.
        bls_spans = by_trace[bls_trace]
        (caller,) = [s for s in bls_spans if s["name"] == "bls_traced"]
        (called,) = [s for s in bls_spans if s["name"] == "add_sub_copy"]
        assert called["parentSpanId"] == caller["spanId"]
        assert sorted(s["name"] for s in bls_spans) == [
            "InferRequest",
            "add_sub_copy",
            "bls_traced",
            "compute",
            "compute",
        ]
        events = [e["name"] for e in http_spans["add1"]["events"]]
        assert events == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        resource = otlp_document(Receiver.exports[0]["body"])["resourceSpans"][0]["resource"]
        names = {a["key"]: a["value"] for a in resource["attributes"]}
        assert names["service.name"] == {"stringValue": "ge-serve-test"}
    finally:
        receiver.shutdown()
        receiver.server_close()


def otlp_document(body: bytes) -> dict[str, Any]:
    """An OTLP/HTTP protobuf export as OTLP's JSON form (ids as lower-case hex)."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest.FromString(body)
    document: dict[str, Any] = json_format.MessageToDict(request)
    for resource in document.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return document


def chain_input_named(module: Any = httpclient) -> list[Any]:
    tensor = module.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    return [tensor]


def test_trace_setting_routes_answer_json(traced: ServerProcess) -> None:
    response = httpx.post(f"{traced.base_url}/v2/models/add1/trace/setting", json={}, timeout=10)
    assert response.status_code == 200
    assert response.json()["trace_rate"] == "1"
