"""The onnxruntime backend's model parameters, read and refused as Triton's onnxruntime
backend reads them (onnxruntime.cc, backend_common.cc's ParseIntValue/ParseBoolValue), and
applied to the sessions (backends/ort_options.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from ge_helpers import EXAMPLES, SIMPLE_IO, make_model, params, spec_for
from google.protobuf import text_format

from ge_serve.backends.onnxruntime import OnnxRuntimeBackend, OrtExecutor
from ge_serve.backends.ort_options import (
    check_accelerators,
    parse_bool,
    parse_int,
    run_options,
    session_options,
)
from ge_serve.protos import model_config_pb2
from ge_serve.server.models import unhonoured

SIMPLE = EXAMPLES / "simple" / "1" / "model.onnx"
pytestmark = pytest.mark.timeout(120)


def config(body: str = "", **parameters: str) -> model_config_pb2.ModelConfig:
    text = 'name: "m"\nbackend: "onnxruntime"\n' + body + params(**parameters)
    return text_format.Parse(text, model_config_pb2.ModelConfig())


@pytest.mark.parametrize(
    ("text", "value"), [("true", True), ("ON", True), ("1", True), ("False", False), ("0", False)]
)
def test_booleans_are_tritons_spellings(text: str, value: bool) -> None:
    assert parse_bool(text) is value


@pytest.mark.parametrize("text", ["abc", "yes", " 1", ""])
def test_other_booleans_are_refused_in_tritons_words(text: str) -> None:
    with pytest.raises(ValueError, match=f"^failed to convert '{text}' to boolean$"):
        parse_bool(text)


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("12", 12), ("-1", -1), (" 3", 3)])
def test_integers_read_as_whole_numbers(text: str, value: int) -> None:
    assert parse_int(text) == value


@pytest.mark.parametrize("text", ["abc", "", "2abc", "1_0", "99999999999"])
def test_other_integers_are_refused_in_tritons_words(text: str) -> None:
    with pytest.raises(ValueError, match=f"^failed to convert '{text}' to integral number$"):
        parse_int(text)


@pytest.mark.parametrize(
    ("parameters", "refusal"),
    [
        (
            {"execution_mode": "2"},
            "Invalid configuration value provided. Expected values for  execution_mode are "
            "0 or 1 but got 2 .",
        ),
        ({"execution_mode": "x"}, "failed to convert 'x' to integral number"),
        ({"enable_mem_arena": "abc"}, "failed to convert 'abc' to boolean"),
        ({"enable_mem_pattern": "maybe"}, "failed to convert 'maybe' to boolean"),
        ({"inter_op_thread_count": "abc"}, "failed to convert 'abc' to integral number"),
        ({"intra_op_thread_count": "abc"}, "failed to convert 'abc' to integral number"),
    ],
)
def test_a_bad_parameter_is_refused_with_tritons_text(
    parameters: dict[str, str], refusal: str
) -> None:
    with pytest.raises(ValueError) as raised:
        session_options(config(**parameters), 1)
    assert str(raised.value) == refusal


def test_the_parameters_are_applied_to_the_session_options(
    caplog: pytest.LogCaptureFixture,
) -> None:
    asked = config(
        "optimization { graph { level: 1 } }",
        execution_mode="1",
        inter_op_thread_count="3",
        intra_op_thread_count="2",
        enable_mem_arena="0",
        enable_mem_pattern="off",
        session__dot__use_device_allocator_for_initializers="1",
    )
    with caplog.at_level(logging.DEBUG, logger="ge_serve.backends.ort_options"):
        options = session_options(asked, 1)
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert (options.inter_op_num_threads, options.intra_op_num_threads) == (3, 2)
    assert not options.enable_cpu_mem_arena and not options.enable_mem_pattern
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    key = "session.use_device_allocator_for_initializers"
    assert options.get_session_config_entry(key) == "1"
    # The lines Triton's qa (L0_onnx_optimization) looks for at --log-verbose=1.
    assert "Configuring enable_mem_arena to 0" in caplog.text
    assert "Configuring enable_mem_pattern to off" in caplog.text
    assert f"Configuring '{key}' to '1' for 'm'" in caplog.text


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (-1, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC),
        (1, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
        (2, ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
        (0, ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
        (3, ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
    ],
)
def test_the_graph_level_maps_as_in_triton(
    level: int, expected: ort.GraphOptimizationLevel
) -> None:
    options = session_options(config(f"optimization {{ graph {{ level: {level} }} }}"), 1)
    assert options.graph_optimization_level == expected


def test_the_defaults_are_sequential_with_the_slots_sharing_the_cores() -> None:
    options = session_options(config(intra_op_thread_count="0"), 1)
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.intra_op_num_threads >= 1
    assert options.enable_cpu_mem_arena and options.enable_mem_pattern
    quiet = run_options(config(), options)
    assert quiet.log_severity_level == 4
    with pytest.raises(RuntimeError, match="does not have configuration"):
        quiet.get_run_config_entry("memory.enable_memory_arena_shrinkage")


def test_an_unknown_cpu_accelerator_is_refused_and_openvino_is_accepted() -> None:
    accelerators = (
        "optimization {{ execution_accelerators {{ "
        'cpu_execution_accelerator [ {{ name: "{}" }} ] }} }}'
    )
    with pytest.raises(ValueError) as raised:
        check_accelerators(config(accelerators.format("unknown_cpu")))
    assert str(raised.value) == "unknown Execution Accelerator 'unknown_cpu' is requested"
    openvino = config(accelerators.format("openvino"))
    check_accelerators(openvino)
    # Accepted, not honoured: the load says so.
    (warning,) = unhonoured.check(openvino)
    assert "'optimization' is accepted and not honoured" in warning


def test_the_graph_level_is_honoured_on_onnxruntime_only() -> None:
    graph = "optimization { graph { level: 2 } }"
    assert unhonoured.check(config(graph)) == []
    on_ge = text_format.Parse(f'name: "m"\nbackend: "ge"\n{graph}', model_config_pb2.ModelConfig())
    (warning,) = unhonoured.check(on_ge)
    assert "graph level outside onnxruntime" in warning


def test_arena_shrinkage_is_a_run_option(caplog: pytest.LogCaptureFixture) -> None:
    asked = config(memory__dot__enable_memory_arena_shrinkage="cpu:0")
    with caplog.at_level(logging.DEBUG, logger="ge_serve.backends.ort_options"):
        options = run_options(asked, session_options(asked, 1))
    assert options is not None
    assert options.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
    assert "Configuring memory.enable_memory_arena_shrinkage to cpu:0" in caplog.text


@pytest.mark.parametrize(
    ("value", "arena"), [("gpu:0", "1"), ("abc", "1"), (";cpu:0", "1"), ("cpu:0", "0")]
)
def test_an_arena_shrinkage_that_would_fail_every_run_fails_the_load(
    value: str, arena: str
) -> None:
    asked = config(memory__dot__enable_memory_arena_shrinkage=value, enable_mem_arena=arena)
    with pytest.raises(ValueError, match="names an arena this host does not have"):
        run_options(asked, session_options(asked, 1))


def test_a_loaded_model_runs_with_its_run_options(tmp_path: Path) -> None:
    body = "max_batch_size: 8\n" + SIMPLE_IO
    body += params(memory__dot__enable_memory_arena_shrinkage="cpu:0", execution_mode="1")
    loaded = OnnxRuntimeBackend().load(spec_for(make_model(tmp_path, "shrinking", body, SIMPLE)))
    try:
        (executor,) = loaded.executors
        assert isinstance(executor, OrtExecutor)
        session = executor._session
        assert session is not None and session.run_options is not None
        inputs = {name: np.ones((2, 16), dtype=np.int32) for name in ("INPUT0", "INPUT1")}
        assert executor.execute(inputs)["OUTPUT0"].tolist() == [[2] * 16] * 2
    finally:
        loaded.close()
