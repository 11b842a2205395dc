"""bench/soak's pure parts: its requests and answer checks against the server's own
codecs, the invalid-request catalogue, and the report arithmetic. The soak itself is not run."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench.soak import calls, cli, invalid, outcomes, traffic
from bench.soak import report as soak_report
from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc
from ge_serve.server.grpc import codec as grpc_codec
from ge_serve.server.http import codec as http_codec
from ge_serve.server.inference.types import DataType, InferRequest, InferResponse, Tensor
from ge_serve.server.inference.wire import object_array


def _operands(model: str, batch: int = 2) -> Any:
    rng = np.random.default_rng(3)
    a = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    return calls.Expected(model, a, b)


def _inputs_as_ints(request: InferRequest) -> list[np.ndarray[Any, Any]]:
    out = []
    for tensor in request.inputs:
        data = tensor.data
        if tensor.datatype is DataType.BYTES:
            data = np.array([int(bytes(v)) for v in data.flat]).reshape(data.shape)
        out.append(np.asarray(data))
    return out


def _answer(request: InferRequest, wrong: bool = False) -> InferResponse:
    """What `simple` / `simple_string` compute, as the server's core would hand it back."""
    a, b = _inputs_as_ints(request)
    total, difference = a + b, a - b
    if wrong:
        total = total + 1
    outputs = []
    for name, values in (("OUTPUT0", total), ("OUTPUT1", difference)):
        if request.model_name == "simple_string":
            items = [str(int(v)).encode() for v in values.flat]
            data = object_array(items).reshape(values.shape)
            outputs.append(Tensor(name, DataType.BYTES, values.shape, data))
        else:
            outputs.append(Tensor(name, DataType.INT32, values.shape, values.astype(np.int32)))
    return InferResponse(request.model_name, "1", outputs=outputs)


@pytest.mark.parametrize("model", ["simple", "simple_string"])
@pytest.mark.parametrize("binary", [False, True])
def test_http_valid_request_round_trips_through_the_server_codec(model: str, binary: bool) -> None:
    expected = _operands(model)
    call = (calls.http_binary_call if binary else calls.http_json_call)(expected)
    headers = dict(call.headers)
    length = headers.get(calls.HEADER_LENGTH)
    request = http_codec.decode_infer_request(
        model, "", call.body, None if length is None else int(length)
    )
    a, b = _inputs_as_ints(request)
    np.testing.assert_array_equal(a, expected.a)
    np.testing.assert_array_equal(b, expected.b)

    for wrong in (False, True):
        body, json_length = http_codec.encode_infer_response(_answer(request, wrong), request)
        answer_headers = {} if json_length is None else {calls.HEADER_LENGTH: str(json_length)}
        assert (json_length is not None) == binary
        problem = calls.check_http_answer(expected, 200, answer_headers, body)
        if wrong:
            assert problem is not None and "OUTPUT0 has wrong values" in problem
        else:
            assert problem is None


@pytest.mark.parametrize("model", ["simple", "simple_string"])
@pytest.mark.parametrize("typed", [False, True])
def test_grpc_valid_request_round_trips_through_the_server_codec(model: str, typed: bool) -> None:
    expected = _operands(model)
    message = calls.grpc_infer_request(expected, typed)
    assert bool(message.raw_input_contents) is not typed
    request = grpc_codec.decode_infer_request(message).request
    a, b = _inputs_as_ints(request)
    np.testing.assert_array_equal(a, expected.a)
    np.testing.assert_array_equal(b, expected.b)
    good = grpc_codec.encode_infer_response(_answer(request))
    bad = grpc_codec.encode_infer_response(_answer(request, wrong=True))
    assert calls.check_grpc_answer(expected, good) is None
    assert "OUTPUT0 has wrong values" in (calls.check_grpc_answer(expected, bad) or "")


def test_answer_checks_name_what_is_wrong() -> None:
    expected = _operands("simple", batch=1)
    assert "HTTP 503" in (calls.check_http_answer(expected, 503, {}, b'{"error": "x"}') or "")
    assert "unreadable" in (calls.check_http_answer(expected, 200, {}, b"not json") or "")
    assert "no OUTPUT0" in (calls.check_http_answer(expected, 200, {}, b'{"outputs": []}') or "")
    short = pb.ModelInferResponse()
    short.outputs.add(name="OUTPUT0", datatype="INT32", shape=[1, 16])
    short.raw_output_contents.append(b"\0" * 60)
    assert "unreadable" in (calls.check_grpc_answer(expected, short) or "")


def test_random_operands_stay_in_simple_limits() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        expected = calls.random_operands(rng, "simple")
        assert expected.a.dtype == np.int32 and expected.a.shape == expected.b.shape
        assert 1 <= expected.a.shape[0] <= 8 and expected.a.shape[1] == 16
        # No int32 wrap-around, so the expected outputs are the true sums.
        wide = expected.a.astype(np.int64) + expected.b.astype(np.int64)
        np.testing.assert_array_equal(expected.outputs()["OUTPUT0"], wide)


def test_http_invalid_catalogue_is_well_formed() -> None:
    cases = invalid.http_invalid_cases()
    brief = {"unknown_model", "unknown_version", "wrong_shape", "wrong_dtype", "bad_json"}
    brief |= {"truncated_binary", "oversized_shape", "oversized_body", "bytes_prefix_overrun"}
    assert brief <= set(cases)
    for name, call in cases.items():
        assert call.method in ("GET", "POST"), name
        assert call.path.startswith("/v2/"), name
        assert isinstance(call.body, bytes), name
        for key, value in call.headers:
            assert isinstance(key, str) and isinstance(value, str), name
    assert len(cases["oversized_body"].body) > invalid.HTTP_MAX_INPUT
    bomb = cases["gzip_bomb"].body
    assert len(bomb) < invalid.HTTP_MAX_INPUT
    # The binary cases differ from a request the codec accepts only in their one fault.
    good, length = invalid._binary_body(
        [
            ("INPUT0", "INT32", [1, 16], np.arange(16, dtype="<i4").tobytes()),
            ("INPUT1", "INT32", [1, 16], np.arange(16, dtype="<i4").tobytes()),
        ]
    )
    http_codec.decode_infer_request("simple", "", good, length)
    assert cases["truncated_binary"].body == good[:-10]


def test_grpc_invalid_catalogue_is_well_formed() -> None:
    cases = invalid.grpc_invalid_cases()
    brief = {"unknown_model", "unknown_version", "wrong_shape", "wrong_dtype"}
    brief |= {"raw_wrong_size", "oversized_shape", "bytes_prefix_overrun", "contents_and_raw"}
    assert brief <= set(cases)
    for name, call in cases.items():
        assert hasattr(pb_grpc.GRPCInferenceServiceServicer, call.rpc), name
        wanted = pb.ModelInferRequest if call.rpc == "ModelInfer" else pb.ModelMetadataRequest
        assert isinstance(call.request, wanted), name
        again = wanted.FromString(call.request.SerializeToString())
        assert again == call.request, name


def test_outcomes_of_invalid_requests() -> None:
    assert [outcomes.classify_http(s) for s in (400, 404, 413)] == [outcomes.EXPECTED] * 3
    assert [outcomes.classify_http(s) for s in (500, 503)] == [outcomes.SERVER_ERROR] * 2
    assert outcomes.classify_http(200) == outcomes.UNEXPECTED
    assert outcomes.classify_grpc("INVALID_ARGUMENT") == outcomes.EXPECTED
    assert outcomes.classify_grpc("NOT_FOUND") == outcomes.EXPECTED
    assert outcomes.classify_grpc("INTERNAL") == outcomes.SERVER_ERROR
    assert outcomes.classify_grpc("UNKNOWN") == outcomes.SERVER_ERROR
    assert outcomes.classify_grpc("UNAVAILABLE") == outcomes.UNEXPECTED
    assert outcomes.classify_grpc("OK") == outcomes.UNEXPECTED


def test_tally_percentiles_and_failure_samples() -> None:
    tally = outcomes.Tally()
    for ms in range(1, 101):
        tally.ok(ms / 10.0, ms / 1000.0)
    for i in range(outcomes.MAX_FAILURE_SAMPLES + 5):
        tally.failed(float(i), "boom", during_reload=i % 2 == 0)
    tally.answered("bad_json", "400", outcomes.EXPECTED)
    tally.answered("bad_json", "500", outcomes.SERVER_ERROR)
    tally.answered("oversized_body", "transport: ReadError", outcomes.UNEXPECTED)
    summary = soak_report.ProtocolSummary.of("http", tally)
    assert summary.valid_ok == 100 and summary.valid_failed == 25
    assert summary.failed_during_reload == 13
    assert summary.p50_ms == pytest.approx(50.5)
    assert summary.p99_ms == pytest.approx(99.01)
    assert summary.max_ms == pytest.approx(100.0)
    assert len(summary.failures) == outcomes.MAX_FAILURE_SAMPLES
    assert summary.failures[0] == "t=0.0s (during a reload): boom"
    assert (summary.invalid_expected, summary.invalid_server_error) == (1, 1)
    assert summary.invalid_unexpected == 1
    assert summary.cases["bad_json"] == {"400": 1, "500": 1}
    assert summary.sent == 128
    # Latency grows with time here, so the last 5 s window (t=10 s, 100 ms) is the worst.
    assert [w.ok for w in summary.timeline] == [49, 50, 1]
    worst = summary.worst_window()
    assert worst is not None and worst.start_s == 10.0 and worst.max_ms == pytest.approx(100.0)
    assert soak_report.ProtocolSummary.of("grpc", outcomes.Tally()).p99_ms is None


def test_timeline_windows_latency_by_finish_time() -> None:
    finished = [0.5, 1.5, 1.6, 4.2]
    latencies = [0.010, 0.020, 0.900, 0.030]
    windows = soak_report.timeline(finished, latencies, 2.0)
    assert [(w.start_s, w.ok) for w in windows] == [(0.0, 3), (2.0, 0), (4.0, 1)]
    assert windows[0].max_ms == pytest.approx(900.0)
    assert windows[1].p99_ms is None
    assert soak_report.timeline([], [], 2.0) == []
    by_client = soak_report.timeline(finished, latencies, 2.0, [3, 3, 4, 3])
    assert [w.clients for w in by_client] == [2, 0, 1]
    assert soak_report.longest_silence(finished) == pytest.approx(2.6)
    assert soak_report.longest_silence([]) is None


def test_rss_windows_follow_the_run_length() -> None:
    assert soak_report.rss_windows(600.0, 2.0) == (20.0, 20.0)
    assert soak_report.rss_windows(30.0, 2.0) == (3.0, 4.0)


def test_rss_growth_compares_window_medians() -> None:
    mib = 2**20
    # Warm-up climb to 100 MiB, a spike, then a slow rise to 104 MiB at the end.
    samples = [(0.0, 10 * mib), (2.0, 80 * mib)]
    samples += [(t, 100 * mib) for t in (20.0, 22.0, 24.0)]
    samples += [(30.0, 300 * mib), (40.0, 102 * mib)]
    samples += [(t, 104 * mib) for t in (56.0, 58.0, 60.0)]
    rss = soak_report.summarise_rss(samples, warmup_s=20.0, window_s=5.0)
    assert (rss.start_bytes, rss.end_bytes) == (100 * mib, 104 * mib)
    assert rss.peak_bytes == 300 * mib
    assert rss.growth_pct == pytest.approx(4.0)
    assert rss.samples == len(samples)
    empty = soak_report.summarise_rss(samples[:2], warmup_s=20.0, window_s=5.0)
    assert empty.growth_pct is None and empty.start_bytes is None


def _report(**changes: Any) -> Any:
    http, grpc = outcomes.Tally(), outcomes.Tally()
    http.ok(1.0, 0.002)
    http.answered("bad_json", "400", outcomes.EXPECTED)
    grpc.ok(1.0, 0.002)
    grpc.answered("wrong_dtype", "INVALID_ARGUMENT", outcomes.EXPECTED)
    fields: dict[str, Any] = {
        "duration_s": 10.0,
        "http_clients": 2,
        "grpc_clients": 2,
        "invalid_fraction": 0.1,
        "reload_every_s": 2.5,
        "protocols": [
            soak_report.ProtocolSummary.of("http", http),
            soak_report.ProtocolSummary.of("grpc", grpc),
        ],
        "reloads": soak_report.ReloadSummary(done=3, failed=0, max_s=0.4, failures=[]),
        "rss": soak_report.RssSummary(100 * 2**20, 102 * 2**20, 103 * 2**20, 2.0, 6),
        "server_exit_code": 0,
    }
    fields.update(changes)
    return soak_report.SoakReport(**fields)


def test_verdict_and_markdown_of_a_clean_run() -> None:
    report = _report()
    assert soak_report.verdict(report, 5.0) == []
    assert report.requests_per_s == pytest.approx(0.4)
    text = soak_report.markdown(report, [])
    assert "| http | 1 | 0 | 2.0 | 2.0 | 2.0 | 1 | 0 | 0 |" in text
    assert "| RSS growth | +2.00 % |" in text
    assert "| verdict | PASS |" in text
    assert "| worst window p99 | http 2.0 ms at t=0 s, grpc 2.0 ms at t=0 s |" in text
    assert "| longest time without a valid answer | http 1.0 s, grpc 1.0 s |" in text
    assert "invalid case" not in text  # every invalid answer was an expected one
    assert report.to_json()["requests_per_s"] == pytest.approx(0.4)


def test_verdict_names_every_failure() -> None:
    tally = outcomes.Tally()
    tally.failed(1.0, "json: HTTP 500", during_reload=True)
    tally.answered("bad_json", "500", outcomes.SERVER_ERROR)
    tally.answered("oversized_body", "transport: ReadError", outcomes.UNEXPECTED)
    report = _report(
        protocols=[soak_report.ProtocolSummary.of("http", tally)],
        reloads=soak_report.ReloadSummary(
            done=1, failed=1, max_s=0.5, failures=["t=5.0s: HTTP 400"]
        ),
        rss=soak_report.RssSummary(100, 110, 120, 10.0, 6),
    )
    problems = soak_report.verdict(report, 5.0)
    assert problems == [
        "1 valid request(s) failed",
        "1 invalid request(s) got a 5xx / INTERNAL answer",
        "1 reload(s) failed",
        "RSS grew 10.0 % (limit 5 %)",
    ]
    assert soak_report.verdict(report, 15.0)[-1] == "1 reload(s) failed"
    text = soak_report.markdown(report, problems)
    assert "| verdict | FAIL: 1 valid request(s) failed;" in text
    assert "| http | bad_json | 500 x1 |" in text
    assert "| http | oversized_body | transport: ReadError x1 |" in text
    assert "- http: t=1.0s (during a reload): json: HTTP 500" in text
    assert "- reload: t=5.0s: HTTP 400" in text
    no_rss = _report(rss=soak_report.RssSummary(None, None, None, None, 0))
    assert soak_report.verdict(no_rss, 5.0) == ["no RSS samples after the warm-up"]


def test_plan_reloads_every_30_s_or_four_times_a_short_run() -> None:
    parser = cli.build_parser()
    assert cli.plan_from(parser.parse_args([])).reload_every_s == 30.0
    assert cli.plan_from(parser.parse_args([])).duration_s == 600.0
    assert cli.plan_from(parser.parse_args(["--minutes", "0.5"])).reload_every_s == 7.5
    plan = cli.plan_from(parser.parse_args(["--minutes", "0.5", "--reload-every", "5"]))
    assert plan.reload_every_s == 5.0


def test_a_reload_in_flight_marks_an_overlapping_request() -> None:
    plan = traffic.Plan(duration_s=1.0)
    run = traffic.Run(plan, started=0.0, deadline=1.0)
    mark = run.reload_mark()
    assert not run.overlapped(mark)
    run.reloads_started += 1  # a reload began and ended while the request was out
    assert run.overlapped(mark)
    run.reloading = True
    assert run.overlapped(run.reload_mark())


def test_retired_versions_are_counted_before_shutdown() -> None:
    unloaded = "lifecycle.py:300] \"successfully unloaded '{}' version 1\""
    log = "\n".join(
        [
            "I1206 08:27:59.929123 7 " + unloaded.format("simple"),
            "I1206 08:28:00.000001 7 " + unloaded.format("simple_string"),
            "I1206 08:28:01.000001 7 " + unloaded.format("simple"),
            'I1206 08:28:02.000001 7 app.py:440] "signal received: stopping (waiting up to 30s)"',
            "I1206 08:28:03.000001 7 " + unloaded.format("simple"),
        ]
    )
    assert cli.retired_by_reloads(log) == 2
