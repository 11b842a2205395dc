"""onnxruntime's run failures that the request's data caused are answered as its fault,
with the op and the reason a client can act on; the others stay the server's."""

from __future__ import annotations

import gc
import logging
import weakref
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ge_serve.backends.base import DataRejected, SlotInfo
from ge_serve.backends.onnxruntime import OrtExecutor, OrtSession
from ge_serve.backends.ort_failures import refused_data
from ge_serve.server.errors import ErrorCode, FailureReason, execution_failure

pytestmark = pytest.mark.timeout(60)

_PREFIX = "the model could not run on this request's data: "


def _graph(
    op: str, inputs: list[tuple[str, int]], out: int, name: str = "", **attrs: int
) -> onnx.ModelProto:
    node = helper.make_node(op, [n for n, _ in inputs], ["OUT"], name=name)
    node.attribute.extend(helper.make_attribute(key, value) for key, value in attrs.items())
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
        [helper.make_tensor_value_info("OUT", out, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _gather_in_a_branch() -> onnx.ModelProto:
    """An If whose branch gathers from a 3-row table: onnxruntime fails the If with the
    Gather's failure inside its message."""
    table = helper.make_tensor("T", TensorProto.FLOAT, [3], [0.0, 1.0, 2.0])
    gather = helper.make_node("Gather", ["T", "I"], ["G"], name="inner")
    then = helper.make_graph(
        [gather], "then", [], [helper.make_tensor_value_info("G", TensorProto.FLOAT, None)]
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["T"], ["E"])],
        "else",
        [],
        [helper.make_tensor_value_info("E", TensorProto.FLOAT, None)],
    )
    branch = helper.make_node(
        "If", ["C"], ["OUT"], name="branch", then_branch=then, else_branch=other
    )
    graph = helper.make_graph(
        [branch],
        "g",
        [
            helper.make_tensor_value_info("C", TensorProto.BOOL, []),
            helper.make_tensor_value_info("I", TensorProto.INT64, None),
        ],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, None)],
        [table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _failure(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> Exception:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), options)
    with pytest.raises(Exception) as raised:
        session.run(None, feed)
    assert isinstance(raised.value, Exception)
    return raised.value


F, I64 = TensorProto.FLOAT, TensorProto.INT64
# Failures on the values a request holds: its fault whatever dims its config fixes.
VALUES = [
    pytest.param(
        _graph("Gather", [("T", F), ("I", I64)], F, name="embed"),
        {"T": np.zeros((3, 2), np.float32), "I": np.array([7])},
        "Gather node 'embed': indices element out of data bounds, idx=7 must be within "
        "the inclusive range [-3,2]",
        id="index-past-the-table",
    ),
    pytest.param(
        _gather_in_a_branch(),
        {"C": np.array(True), "I": np.array([9])},
        "Gather node 'inner': indices element out of data bounds, idx=9 must be within "
        "the inclusive range [-3,2]",
        id="the-innermost-op-of-a-subgraph",
    ),
    pytest.param(
        _graph("Cast", [("S", TensorProto.STRING)], I64, to=I64),
        {"S": np.array(["12", "x"], dtype=object)},
        "Cast node: a string it reads as a number is not one (stoll)",
        id="string-that-is-no-number",
    ),
    pytest.param(
        _graph("Div", [("A", TensorProto.INT32), ("B", TensorProto.INT32)], TensorProto.INT32),
        {"A": np.ones(2, np.int32), "B": np.array([1, 0], np.int32)},
        "Div node: Integer division by zero",
        id="integer-division-by-zero",
    ),
    pytest.param(
        _graph("GatherElements", [("A", F), ("I", I64)], F),
        {"A": np.zeros(3, np.float32), "I": np.array([7])},
        "GatherElements node: GatherElements op: Out of range value in index tensor",
        id="function-signature-left-out",
    ),
]
# Failures on dims: the request's only where its config lets the client choose a dim.
DIMS = [
    pytest.param(
        _graph("Reshape", [("A", F), ("S", I64)], F),
        {"A": np.zeros(6, np.float32), "S": np.array([4, 2])},
        "Reshape node: The input tensor cannot be reshaped to the requested shape. "
        "Input shape:{6}, requested shape:{4,2}",
        id="enforced-condition-left-out",
    ),
    pytest.param(
        _graph("Concat", [("A", F), ("B", F)], F, axis=0),
        {"A": np.zeros((2, 3), np.float32), "B": np.zeros((3, 2), np.float32)},
        "Concat node: Non concat axis dimensions must match: Axis 1 has mismatched "
        "dimensions of 2 and 3",
        id="source-line-left-out",
    ),
    pytest.param(
        _graph("ConstantOfShape", [("S", I64)], F),
        {"S": np.array([-2])},
        "ConstantOfShape node: Tensor shape.Size() must be >= 0",
        id="nested-status-left-out",
    ),
]


@pytest.mark.parametrize(("model", "feed", "said"), VALUES + DIMS)
def test_a_failure_the_data_caused_is_the_requests(
    model: onnx.ModelProto, feed: dict[str, np.ndarray], said: str
) -> None:
    refused = refused_data(_failure(model, feed), dims_chosen=True)
    assert isinstance(refused, DataRejected)
    assert str(refused) == _PREFIX + said
    # As a client sees it: invalid input, counted as the backend's failure (Triton's
    # reason for what failed in the model's execution).
    error = execution_failure(refused, FailureReason.BACKEND)
    assert (error.code, error.reason) == (ErrorCode.INVALID_ARG, FailureReason.BACKEND)
    assert error.message == _PREFIX + said


@pytest.mark.parametrize(("model", "feed", "said"), VALUES)
def test_a_failure_on_values_is_the_requests_whatever_its_dims(
    model: onnx.ModelProto, feed: dict[str, np.ndarray], said: str
) -> None:
    assert str(refused_data(_failure(model, feed), dims_chosen=False)) == _PREFIX + said


@pytest.mark.parametrize(("model", "feed", "said"), DIMS)
def test_a_failure_on_dims_the_config_fixes_is_the_models(
    model: onnx.ModelProto, feed: dict[str, np.ndarray], said: str
) -> None:
    # Every request with those dims fails so: the model cannot run what its config says.
    failure = _failure(model, feed)
    assert refused_data(failure, dims_chosen=False) is None
    assert execution_failure(failure, FailureReason.BACKEND).code is ErrorCode.INTERNAL


def test_running_out_of_memory_and_failures_that_name_no_op_stay_the_servers() -> None:
    huge = _graph("ConstantOfShape", [("S", I64)], F)
    memory = _failure(huge, {"S": np.array([10**7, 10**7])})
    assert "allocate" in str(memory).lower()
    assert refused_data(memory, dims_chosen=True) is None
    # The session's own check of what it was fed, before any op ran: the config's checks
    # let through what they should have refused, the server's fault.
    add = _graph("Add", [("A", F), ("B", F)], F)
    no_op = _failure(add, {"A": np.zeros(3, np.int32), "B": np.zeros(3, np.float32)})
    assert "INVALID_ARGUMENT" in str(no_op) and "running" not in str(no_op)
    assert refused_data(no_op, dims_chosen=True) is None
    stray = RuntimeError("Non-zero status code returned while running X")
    assert refused_data(stray, dims_chosen=True) is None
    assert execution_failure(memory, FailureReason.BACKEND).code is ErrorCode.INTERNAL


def _executor(tmp_path: Path) -> OrtExecutor:
    path = tmp_path / "gather.onnx"
    onnx.save(_graph("Gather", [("T", F), ("I", I64)], F), str(path))
    session = OrtSession(path, ort.SessionOptions())
    return OrtExecutor(SlotInfo(name="gather_1_cpu_0", device="cpu"), session)


def test_the_executor_raises_it_holding_nothing_of_the_batch(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    table = np.zeros((3, 2), np.float32)
    np.testing.assert_array_equal(
        executor.execute({"T": table, "I": np.array([2])})["OUT"], [[0.0, 0.0]]
    )
    kept = weakref.ref(table)
    collecting = gc.isenabled()
    gc.disable()  # what the refusal holds must go with it, not wait for the collector
    try:
        with pytest.raises(DataRejected) as raised:
            executor.execute({"T": table, "I": np.array([3])})
        assert raised.value.__cause__ is None and raised.value.__context__ is None
        assert "Gather node: indices element out of data bounds" in str(raised.value)
        del raised, table
        assert kept() is None
    finally:
        if collecting:
            gc.enable()


def test_the_servers_log_says_what_failed_where_onnxruntimes_is_quiet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    executor = _executor(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="ge_serve.backends.onnxruntime"):
        with pytest.raises(DataRejected):
            executor.execute({"T": np.zeros((3, 2), np.float32), "I": np.array([3])})
        with pytest.raises(Exception, match="Unexpected input data type"):
            executor.execute({"T": np.zeros((3, 2), np.int32), "I": np.array([0])})
    (refused, failed) = caplog.records
    assert (refused.levelno, failed.levelno) == (logging.DEBUG, logging.ERROR)
    assert refused.getMessage().startswith("gather_1_cpu_0: " + _PREFIX)
    assert failed.getMessage().startswith("gather_1_cpu_0: the model's execution failed: ")
