"""The bench tooling: CSV parsing, input data, generated models and repos, raw onnxruntime,
and perf_analyzer against the real server (skipped where perf_analyzer is not set up)."""

from __future__ import annotations

import base64
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from serverproc import REPO_ROOT, ServerProcess

from bench.lib import inputs, loadgen, models, perfa, raw_ort, report, sweep
from bench.lib import server as bench_server
from ge_serve.protos import model_config_pb2

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
    # The server must allow client shared memory, off by default (as in Triton).
    assert perfa.server_flags("system") == ["--allow-client-shm=true"]
    assert perfa.server_flags("none") == []


# --- the bench package: one entry point, its suites, its results ------------------------------


def test_bench_list_names_every_suite(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import main
    from bench.suites import SUITES

    assert main(["list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [s.name for s in SUITES]
    for name in ("protocols", "batching", "slots", "metrics-overhead", "scheduler-overhead",
                 "soak", "shutdown"):  # fmt: skip
        assert name in listed


def _own_suites() -> list[str]:
    from bench.suites import SUITES

    return [s.name for s in SUITES if s.module.startswith("bench.suites.")]


@pytest.mark.parametrize("name", _own_suites())
def test_every_suite_answers_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["run", name, "--help"])
    assert info.value.code == 0
    assert f"python -m bench run {name}" in capsys.readouterr().out


def test_a_suite_whose_module_is_absent_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.suites import SUITES, Suite, SuiteMissing, entry, find

    assert find("soak").module == "bench.soak"
    assert find("shutdown").module == "bench.shutdown_under_load"
    with pytest.raises(SuiteMissing, match=r"bench/no_such_suite\.py is not in this checkout"):
        entry(Suite("gone", "bench.no_such_suite", ""))
    with pytest.raises(KeyError, match="no suite 'nope'"):
        find("nope")
    assert len({s.name for s in SUITES}) == len(SUITES)


def test_python_m_bench_runs_from_the_repository_root() -> None:
    import subprocess

    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "run", "batching", "--help"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "--from-slices" in proc.stdout


RESULTS = REPO_ROOT / "bench" / "results"


def test_results_md_lists_exactly_the_stored_results() -> None:
    # A stored result is listed as `bench/results/NAME` (commands and git paths aside).
    text = (REPO_ROOT / "bench" / "RESULTS.md").read_text()
    listed = set(re.findall(r"`bench/results/([\w.-]+)`", text))
    stored = {p.name for p in RESULTS.iterdir() if p.is_file()}
    assert listed - stored == set(), "RESULTS.md lists results that are not stored"
    assert stored - listed == set(), "stored results that RESULTS.md does not list"
    for name in stored:  # each with the command that writes it
        prefix = re.sub(r"(_slices|_raw)?\.(md|json|png)$", "", name)
        assert re.search(rf"--out bench/results/{re.escape(prefix)}\s", text), name


def test_no_bench_docstring_names_an_issue() -> None:
    found = [
        f"{path.relative_to(REPO_ROOT)}: {match.group(0)}"
        for path in (REPO_ROOT / "bench").rglob("*.py")
        for match in re.finditer(r"(?i)\bissues? \d+|#\d{1,4}\b", path.read_text())
    ]
    assert found == []
