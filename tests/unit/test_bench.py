"""The bench tooling: CSV parsing, input data, generated models and repos, raw onnxruntime,
and perf_analyzer against the real server (skipped where perf_analyzer is not set up)."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from serverproc import REPO_ROOT, ServerProcess

from ge_serve.protos import model_config_pb2

sys.path.insert(0, str(REPO_ROOT / "bench"))

import abba
import adaptive_vs_static
import inputs
import loadgen
import models
import perfa
import raw_ort
import report
import sweep

import server as bench_server

SIMPLE = REPO_ROOT / "examples" / "models" / "simple"


def test_parse_csv_with_server_statistics() -> None:
    text = (
        "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
        "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
        "p50 latency,p90 latency,p95 latency,p99 latency,Avg latency\n"
        "4,84.2,279,1604,33669,233,11731,18,1,47045,56545,59225,64886,47000\n"
        "\n"
        "Metrics block,ignored\n"
    )
    rows = perfa.parse_csv(text)
    assert len(rows) == 1
    row = rows[0]
    assert row["concurrency"] == 4
    assert row["throughput"] == pytest.approx(84.2)
    assert row["server_queue_us"] == 33669
    assert row["server_compute_input_us"] == 233
    assert row["server_compute_infer_us"] == 11731
    assert row["server_compute_output_us"] == 18
    assert (row["p50_us"], row["p90_us"], row["p95_us"], row["p99_us"]) == (
        47045,
        56545,
        59225,
        64886,
    )


def test_parse_csv_without_server_statistics() -> None:
    text = (
        "Concurrency,Inferences/Second,Client Send,Client Recv,p50 latency,p90 latency,"
        "p95 latency,p99 latency,Avg latency,request/response,response wait\n"
        "1,2107.68,39,0,447,577,638,756,471,39,427\n"
    )
    (row,) = perfa.parse_csv(text)
    assert row["throughput"] == pytest.approx(2107.68)
    assert row["response_wait_us"] == 427
    assert "server_queue_us" not in row


def test_input_json_is_valid_and_deterministic(tmp_path: Path) -> None:
    specs = [
        inputs.InputSpec("image", "FP32", (3, 32, 32)),
        inputs.InputSpec("ids", "INT64", (-1,)),
        inputs.InputSpec("text", "BYTES", (2,)),
    ]
    first = inputs.make_sample(specs, seed=3, int_high=10, variable_dim=5)
    again = inputs.make_sample(specs, seed=3, int_high=10, variable_dim=5)
    assert all(np.array_equal(first[k], again[k]) for k in ("image", "ids"))
    assert np.isfinite(first["image"]).all()
    assert first["ids"].shape == (5,) and first["ids"].min() >= 0 and first["ids"].max() < 10
    path = inputs.write_json(first, tmp_path / "data.json", b64_threshold=100)
    entry = json.loads(path.read_text())["data"][0]
    image = np.frombuffer(base64.b64decode(entry["image"]["b64"]), dtype=np.float32)
    assert np.array_equal(image.reshape(3, 32, 32), first["image"])
    assert entry["image"]["shape"] == [3, 32, 32]
    assert entry["ids"]["content"] == first["ids"].tolist()
    assert len(entry["text"]["content"]) == 2


def test_specs_from_config_reads_simple() -> None:
    specs = inputs.specs_from_config(SIMPLE)
    assert specs == [
        inputs.InputSpec("INPUT0", "INT32", (16,)),
        inputs.InputSpec("INPUT1", "INT32", (16,)),
    ]


def test_make_repo_writes_the_requested_config(tmp_path: Path) -> None:
    repo = models.make_repo(
        tmp_path,
        "simple",
        name="simple_dyn",
        max_batch_size=4,
        batching=models.Batching(max_queue_delay_us=300, preferred=[2, 4]),
        instances=2,
        params={"intra_op_thread_count": "1"},
    )
    config = model_config_pb2.ModelConfig()
    text_format.Parse((repo / "simple_dyn" / "config.pbtxt").read_text(), config)
    assert config.name == "simple_dyn"
    assert config.max_batch_size == 4
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4]
    assert config.dynamic_batching.max_queue_delay_microseconds == 300
    assert config.instance_group[0].count == 2
    assert config.parameters["intra_op_thread_count"].string_value == "1"
    assert (repo / "simple_dyn" / "1" / "model.onnx").read_bytes() == (
        SIMPLE / "1" / "model.onnx"
    ).read_bytes()
    no_batching = models.config_text("m", models.ensure_model("simple"), models.RepoOptions())
    assert "dynamic_batching" not in no_batching


def test_resnet18_like_has_resnet18_size_and_runs(tmp_path: Path) -> None:
    model = models.build_resnet18_like()
    assert 11_500_000 < models.parameter_count(model) < 11_800_000
    path = tmp_path / "cnn.onnx"
    path.write_bytes(model.SerializeToString())
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    (logits,) = session.run(["logits"], {"input": x})
    assert logits.shape == (2, 1000)
    assert np.isfinite(logits).all()


def test_raw_ort_reports_each_batch_size_and_the_best() -> None:
    result = raw_ort.measure_raw(SIMPLE, batch_sizes=(1, 4), seconds_per_size=0.05)
    assert [r["batch_size"] for r in result["rows"]] == [1, 4]
    assert all(r["calls"] > 0 and r["samples_per_s"] > 0 for r in result["rows"])
    assert result["best"] == max(result["rows"], key=lambda r: r["samples_per_s"])
    assert result["slots"] == 1 and result["intra_op_threads"] >= 1


def test_report_table_has_a_row_per_result() -> None:
    rows = [{"model": "m", "concurrency": 1, "throughput": 10.0}, {"model": "m", "throughput": 5.5}]
    report.add_ratio(rows, 20.0)
    table = report.markdown_table(rows)
    lines = table.strip().splitlines()
    assert len(lines) == 4
    assert lines[2].split("|")[-2].strip() == "0.500"


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_make_repo_variant_serves(tmp_path: Path) -> None:
    repo = models.make_repo(
        tmp_path, "simple", batching=models.Batching(preferred=[2]), instances=2
    )
    with bench_server.serve(repo, timeout=60) as srv:
        client = httpclient.InferenceServerClient(srv.http_url)
        config = client.get_model_config("simple")
        assert config["instance_group"][0]["count"] == 2
        assert config["dynamic_batching"]["preferred_batch_size"] == [2]
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.ones((1, 16), dtype=np.int32)
        in0 = httpclient.InferInput("INPUT0", [1, 16], "INT32")
        in1 = httpclient.InferInput("INPUT1", [1, 16], "INT32")
        in0.set_data_from_numpy(a)
        in1.set_data_from_numpy(b)
        result = client.infer("simple", [in0, in1])
        assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
        client.close()


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_perf_analyzer_runs_against_the_server(
    server: ServerProcess, tmp_path: Path, perf_analyzer: tuple[str, dict[str, str]]
) -> None:
    pa = perf_analyzer
    data = inputs.input_json_for(SIMPLE, tmp_path / "simple.json")
    row = perfa.run_perf_analyzer(
        "simple",
        server.http_url,
        "http",
        1,
        data,
        measurement_interval_ms=300,
        max_trials=3,
        stability_percentage=100,
        perf_analyzer=pa,
    )
    assert float(row["throughput"]) > 0
    assert float(row["p99_us"]) >= float(row["p50_us"]) > 0
    with pytest.raises(perfa.PerfAnalyzerError, match="unknown model"):
        perfa.run_perf_analyzer("no_such_model", server.http_url, "http", 1, perf_analyzer=pa)


def test_loadgen_parses_classes() -> None:
    cls = loadgen.parse_class("high:rate=20.5:priority=1:timeout_us=5000")
    assert (cls.name, cls.rate, cls.priority, cls.timeout_us) == ("high", 20.5, 1, 5000)
    with pytest.raises(ValueError, match="unknown load class key"):
        loadgen.parse_class("low:speed=3")


@pytest.mark.e2e
@pytest.mark.timeout(60)
def test_loadgen_runs_two_classes(server: ServerProcess) -> None:
    sample = loadgen.batched(inputs.make_sample(inputs.specs_from_config(SIMPLE)))
    classes = [
        loadgen.LoadClass("high", rate=20, priority=1),
        loadgen.LoadClass("low", concurrency=2, priority=2),
    ]
    rows = loadgen.run_load(server.http_url, "http", "simple", sample, classes, 0.5, 0.2)
    assert [r["class"] for r in rows] == ["high", "low"]
    for row in rows:
        assert row["errors"] == 0, row.get("first_error")
        assert row["ok"] > 0 and row["p99_us"] >= row["p50_us"] > 0
    bad = [loadgen.LoadClass("bad", concurrency=1)]
    (row,) = loadgen.run_load(server.http_url, "http", "no_such_model", sample, bad, 0.2, 0.0)
    assert row["ok"] == 0 and row["errors"] > 0 and "no_such_model" in row["first_error"]


def test_sweep_parses_variants() -> None:
    off = sweep.parse_variant(["off", "model=simple", "batching=off"])
    assert off.model == "simple" and off.options.batching is None
    assert "--disable-auto-complete-config" in off.flags
    dyn = sweep.parse_variant(
        ["dyn", "delay_us=2000", "preferred=8,16", "instances=2", "param.k=v", 'flags=--a "b c"']
    )
    assert dyn.options.batching is not None
    assert dyn.options.batching.max_queue_delay_us == 2000
    assert list(dyn.options.batching.preferred) == [8, 16]
    assert dyn.options.instances == 2 and dyn.options.params == {"k": "v"}
    assert list(dyn.flags) == ["--a", "b c"]
    with pytest.raises(ValueError, match="unknown variant key"):
        sweep.parse_variant(["x", "colour=red"])


def test_shared_memory_option_reaches_perf_analyzer(tmp_path: Path) -> None:
    def command(**options: object) -> list[str]:
        return perfa.build_command(
            "pa",
            "simple",
            "h:1",
            "grpc",
            4,
            tmp_path / "o.csv",
            **options,  # type: ignore[arg-type]
        )

    assert "--shared-memory" not in command()
    system = command(shared_memory="system")
    assert system[system.index("--shared-memory") + 1] == "system"
    assert "--output-shared-memory-size" not in system
    sized = command(shared_memory="system", output_shared_memory_size=4096)
    assert sized[sized.index("--output-shared-memory-size") + 1] == "4096"
    with pytest.raises(ValueError, match="shared_memory"):
        command(shared_memory="cuda")
    variant = sweep.parse_variant(["shm", "model=simple", "shm=system"])
    assert variant.shared_memory == "system"
    assert sweep.parse_variant(["plain", "model=simple"]).shared_memory == "none"
    with pytest.raises(ValueError, match="shm must be one of"):
        sweep.parse_variant(["x", "shm=cuda"])


def test_raw_figures_take_the_best_median_not_the_best_round() -> None:
    measurements = [
        {8: 80.0, 16: 95.0},  # one lucky measurement at 16
        {8: 90.0, 16: 84.0},
        {8: 89.0, 16: 85.0},
    ]
    assert adaptive_vs_static.raw_figures(measurements) == (8, 89.0, 80.0, 90.0)


def test_a_throughput_measurement_is_divided_by_the_raw_figures_around_it() -> None:
    row = {
        "grpc raw before": {8: 40.0, 16: 44.0},
        "grpc c32 infer/s": 42.0,
        "grpc raw after": {8: 36.0, 16: 40.0},  # the machine slowed during the measurement
    }
    # At the run's best size (16), to the mean of 44 and 40: not to the figure before
    # (42/44), the one after (42/40), or those at size 8 (42/38).
    assert adaptive_vs_static.bracketed_ratio(row, "grpc", "grpc c32 infer/s", 16) == 1.0


def test_the_rotation_is_abba_for_two_and_rotates_for_more() -> None:
    orders = ["".join(abba.rotation(["a", "b"], index)) for index in range(4)]
    assert orders == ["ab", "ba", "ba", "ab"]
    three = [abba.rotation(["a", "b", "c"], index) for index in range(6)]
    assert [order[0] for order in three[:3]] == ["a", "b", "c"]  # each goes first once
    assert three[3:] == [order[::-1] for order in three[:3]]  # then the same, reversed


def test_the_summary_counts_a_raw_measurement_shared_by_two_protocols_once() -> None:
    def server(before: float, between: float, after: float, http: float) -> list[dict]:
        # As measure() takes them: HTTP's "raw after" is gRPC's "raw before".
        return [{
            "http raw before": {"8": before}, "http c32 infer/s": http,
            "http raw after": {"8": between}, "grpc raw before": {"8": between},
            "grpc c32 infer/s": 1.0, "grpc raw after": {"8": after},
        }]  # fmt: skip

    saved = {  # as OUT_rounds.json holds them: batch sizes as strings
        "m static0": server(10.0, 80.0, 20.0, http=45.0),
        "m adaptive": server(30.0, 90.0, 40.0, http=60.0),
        "m off c1": [{"http c1 p50": 400.0}],
        "m adaptive c1": [{"http c1 p50": 404.0}],
    }
    rows = {r["config"]: r for r in adaptive_vs_static.resummarize(saved, ["http"], False)}
    # Raw at b8: 10, 20, 30, 40, 80, 90 (80 and 90 once each): median 35, not 60.
    assert rows["adaptive"]["raw best"] == 35.0
    assert rows["adaptive"]["÷ raw ORT"] == 1.0  # 60 ÷ the mean of 30 and 90
    assert rows["adaptive"]["÷ best static"] == 60.0 / 45.0
    assert rows["adaptive"]["c1 p50 ÷ off"] == 404.0 / 400.0
