"""Checking requests against the model config, and shaping responses (no backend, no network)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from google.protobuf import text_format

from ge_serve.backends.base import LoadedModel
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.work import Array, WorkItem
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.inference.model import ModelVersion, tensor_specs
from ge_serve.server.inference.types import DataType, InferRequest, RequestedOutput, Tensor
from ge_serve.server.inference.validation import build_response, prepare


class NoScheduler:
    """prepare() and build_response() never touch the scheduler."""

    pending = 0

    async def submit(self, item: WorkItem) -> dict[str, Array]:
        raise AssertionError("not used")

    async def close(self, drain_timeout_s: float) -> None:
        return None


def model_of(text: str, labels: dict[str, list[str]] | None = None) -> ModelVersion:
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    return ModelVersion(
        name=config.name,
        version=1,
        config=config,
        backend="onnxruntime",
        model_dir=Path("."),
        inputs=tensor_specs(list(config.input)),
        outputs=tensor_specs(list(config.output)),
        loaded=LoadedModel(executors=[]),
        scheduler=NoScheduler(),
        labels=labels or {},
    )


SIMPLE = model_of("""
name: "simple"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
""")

NOBATCH = model_of("""
name: "nobatch"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]
""")


def tensor(name: str, data: npt.NDArray[Any], datatype: DataType | None = None) -> Tensor:
    dt = datatype or DataType.from_numpy(data.dtype)
    return Tensor(name, dt, tuple(data.shape), data)


def simple_request(batch: int = 1, **overrides: Tensor | None) -> InferRequest:
    tensors = {
        "INPUT0": tensor("INPUT0", np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)),
        "INPUT1": tensor("INPUT1", np.ones((batch, 16), dtype=np.int32)),
    }
    for name, value in overrides.items():
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value
    return InferRequest("simple", inputs=list(tensors.values()))


def refused(request: InferRequest, model: ModelVersion = SIMPLE) -> str:
    with pytest.raises(ServerError) as info:
        prepare(request, model)
    assert info.value.code is ErrorCode.INVALID_ARG
    return info.value.message


# --- accepted requests -------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_valid_batched_request(batch: int) -> None:
    request = simple_request(batch)
    item = prepare(request, SIMPLE)
    assert item.batch_size == batch
    assert sorted(item.inputs) == ["INPUT0", "INPUT1"]
    assert item.inputs["INPUT0"].shape == (batch, 16)
    assert item.inputs["INPUT0"].dtype == np.int32


def test_priority_and_timeout_reach_the_work_item() -> None:
    request = simple_request()
    request.priority, request.timeout_us = 2, 5000
    item = prepare(request, SIMPLE)
    assert (item.priority, item.timeout_us) == (2, 5000)


def test_variable_dims_accept_any_size_without_batching() -> None:
    for width in (1, 5):
        item = prepare(
            InferRequest("nobatch", inputs=[tensor("X", np.zeros((2, width), np.float32))]),
            NOBATCH,
        )
        assert item.batch_size == 1
        assert item.inputs["X"].shape == (2, width)


def test_flat_data_is_shaped_by_the_tensor_shape() -> None:
    flat = Tensor("INPUT0", DataType.INT32, (2, 16), np.arange(32, dtype=np.int32))
    item = prepare(simple_request(2, INPUT0=flat), SIMPLE)
    assert item.inputs["INPUT0"].shape == (2, 16)


# --- refused requests, with Triton's wording where clients match on it ---------------------

TAG = "[request id: <id_unknown>] "
BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension "
    "to be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


def test_unknown_input_name() -> None:
    extra = tensor("INPUT9", np.zeros((1, 16), np.int32))
    assert refused(simple_request(INPUT9=extra)) == (
        f"{TAG}unexpected inference input 'INPUT9' for model 'simple'"
    )


def test_input_given_twice() -> None:
    request = simple_request()
    request.inputs.append(request.inputs[0])
    assert refused(request) == f"{TAG}input 'INPUT0' already exists in request"


def test_wrong_datatype() -> None:
    wrong = tensor("INPUT0", np.zeros((1, 16), np.float32))
    assert refused(simple_request(INPUT0=wrong)) == (
        f"{TAG}inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'"
    )


def test_wrong_shape() -> None:
    wrong = tensor("INPUT0", np.zeros((1, 8), np.int32))
    assert refused(simple_request(INPUT0=wrong)) == (
        f"{TAG}unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got "
        f"[1,8]. {BATCH_NOTE}"
    )


def test_wrong_rank_without_batching() -> None:
    request = InferRequest("nobatch", inputs=[tensor("X", np.zeros((2, 3, 1), np.float32))])
    assert refused(request, NOBATCH) == (
        f"{TAG}unexpected shape for input 'X' for model 'nobatch'. Expected [2,-1], got [2,3,1]. "
    )


def test_batch_over_the_maximum() -> None:
    assert (
        refused(simple_request(9)) == f"{TAG}inference request batch-size must be <= 8 for 'simple'"
    )


def test_batch_of_zero() -> None:
    assert (
        refused(simple_request(0)) == f"{TAG}inference request batch-size must be >= 1 for 'simple'"
    )


def test_batching_model_needs_a_batch_dim() -> None:
    scalar = Tensor("INPUT0", DataType.INT32, (), np.zeros((), np.int32))
    assert refused(simple_request(INPUT0=scalar)) == (
        f"{TAG}input 'INPUT0' has no shape but model requires batch dimension for 'simple'"
    )


def test_inputs_must_agree_on_the_batch_size() -> None:
    other = tensor("INPUT1", np.ones((2, 16), np.int32))
    assert refused(simple_request(1, INPUT1=other)) == (
        f"{TAG}input 'INPUT1' batch size does not match other inputs for 'simple'"
    )


def test_missing_required_input() -> None:
    message = refused(simple_request(INPUT1=None))
    assert message == (
        f"{TAG}expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], "
        "but missing required input(s) ['INPUT1']. Please provide all required input(s)."
    )


def test_element_count_must_match_the_shape() -> None:
    short = Tensor("INPUT0", DataType.INT32, (1, 16), np.arange(15, dtype=np.int32))
    assert refused(simple_request(INPUT0=short)) == (
        f"{TAG}input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60"
    )


def test_data_must_hold_the_declared_datatype() -> None:
    lying = Tensor("INPUT0", DataType.INT32, (1, 16), np.zeros((1, 16), np.float64))
    assert "holds float64 data, not INT32" in refused(simple_request(INPUT0=lying))


# --- optional inputs and reshape ----------------------------------------------------------------

OPTIONAL = model_of("""
name: "opt"
max_batch_size: 4
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 3 ] optional: true }
]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]
""")


def test_optional_input_may_be_left_out() -> None:
    a = tensor("A", np.zeros((2, 3), np.float32))
    item = prepare(InferRequest("opt", inputs=[a]), OPTIONAL)
    assert list(item.inputs) == ["A"]
    b = tensor("B", np.ones((2, 3), np.float32))
    item = prepare(InferRequest("opt", inputs=[a, b]), OPTIONAL)
    assert sorted(item.inputs) == ["A", "B"]


def test_required_input_is_still_required_next_to_an_optional_one() -> None:
    b = tensor("B", np.ones((2, 3), np.float32))
    message = refused(InferRequest("opt", inputs=[b]), OPTIONAL)
    assert "expected number of inputs between 1 and 2 but got 1 inputs" in message
    assert "missing required input(s) ['A']" in message


RESHAPED = model_of("""
name: "reshaped"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
""")


def test_reshape_gives_the_model_its_own_shape_and_the_client_the_config_shape() -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    request = InferRequest("reshaped", inputs=[tensor("IN", data)])
    item = prepare(request, RESHAPED)
    assert item.inputs["IN"].shape == (3, 2, 2)
    # The model answers in its own shape; the client sees the config's.
    response = build_response(request, RESHAPED, {"OUT": item.inputs["IN"] * 2}, item.batch_size)
    (out,) = response.outputs
    assert out.shape == (3, 4)
    np.testing.assert_array_equal(out.data, data * 2)


def test_reshape_without_batching() -> None:
    model = model_of("""
        name: "r"
        input [ { name: "IN" data_type: TYPE_INT8 dims: [ 1 ] reshape: { shape: [ ] } } ]
        output [ { name: "OUT" data_type: TYPE_INT8 dims: [ 1 ] } ]
    """)
    item = prepare(InferRequest("r", inputs=[tensor("IN", np.array([7], np.int8))]), model)
    assert item.inputs["IN"].shape == ()


# --- outputs -----------------------------------------------------------------------------------


def run_simple(request: InferRequest) -> dict[str, Tensor]:
    item = prepare(request, SIMPLE)
    a, b = item.inputs["INPUT0"], item.inputs["INPUT1"]
    outputs = {"OUTPUT0": a + b, "OUTPUT1": a - b}
    response = build_response(request, SIMPLE, outputs, item.batch_size)
    assert (response.model_name, response.model_version) == ("simple", "1")
    return {t.name: t for t in response.outputs}


def test_every_output_when_none_is_requested() -> None:
    outputs = run_simple(simple_request(2))
    assert list(outputs) == ["OUTPUT0", "OUTPUT1"]
    assert outputs["OUTPUT0"].datatype is DataType.INT32
    assert outputs["OUTPUT0"].shape == (2, 16)


def test_a_subset_of_outputs_in_the_requested_order() -> None:
    request = simple_request()
    request.outputs = [RequestedOutput("OUTPUT1", parameters={"binary_data": True})]
    outputs = run_simple(request)
    assert list(outputs) == ["OUTPUT1"]
    # The request's output parameters are not echoed back (Triton's response has none).
    assert outputs["OUTPUT1"].parameters == {}
    np.testing.assert_array_equal(outputs["OUTPUT1"].data[0], np.arange(16) - 1)


def test_unknown_output() -> None:
    request = simple_request()
    request.outputs = [RequestedOutput("OUTPUT7")]
    # Without the request-id tag, as Triton's core says it (Model::GetOutput).
    assert refused(request) == "unexpected inference output 'OUTPUT7' for model 'simple'"


def test_response_keeps_the_request_id() -> None:
    request = simple_request()
    request.id = "req-42"
    item = prepare(request, SIMPLE)
    arrays = {"OUTPUT0": item.inputs["INPUT0"], "OUTPUT1": item.inputs["INPUT1"]}
    assert build_response(request, SIMPLE, arrays, 1).id == "req-42"


def test_output_is_cast_to_its_config_datatype() -> None:
    request = simple_request()
    wide = np.zeros((1, 16), np.int64)
    response = build_response(request, SIMPLE, {"OUTPUT0": wide, "OUTPUT1": wide}, 1)
    assert response.outputs[0].data.dtype == np.int32


def test_an_output_the_config_type_cannot_hold_is_an_error_not_truncated() -> None:
    # FP64 1.5 for an INT32 output used to answer 200 with 1.
    ints = np.zeros((1, 16), np.int32)
    for produced, what in (
        (np.full((1, 16), 1.5, np.float64), "float64"),
        (np.full((1, 16), 2**40, np.int64), "int64"),
    ):
        with pytest.raises(ServerError) as info:
            build_response(simple_request(), SIMPLE, {"OUTPUT0": produced, "OUTPUT1": ints}, 1)
        assert info.value.code is ErrorCode.INTERNAL
        assert info.value.message == (
            f"model 'simple' produced output 'OUTPUT0' as numpy {what}, with values its "
            "config's INT32 cannot hold"
        )
    # Values the datatype holds are converted, whatever numpy type they came in.
    whole = np.full((1, 16), 3.0, np.float64)
    response = build_response(simple_request(), SIMPLE, {"OUTPUT0": whole, "OUTPUT1": ints}, 1)
    assert response.outputs[0].data.dtype == np.int32 and response.outputs[0].data[0, 0] == 3


def test_a_requested_output_the_model_did_not_produce_is_left_out() -> None:
    # Triton's Python backend and ensembles answer with the outputs they have.
    response = build_response(simple_request(), SIMPLE, {"OUTPUT0": np.zeros((1, 16), np.int32)}, 1)
    assert [tensor.name for tensor in response.outputs] == ["OUTPUT0"]


# --- classification --------------------------------------------------------------------------

CLASSIFIER = model_of(
    """
    name: "clf"
    max_batch_size: 4
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "PROB" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
    """,
    labels={"PROB": ["cat", "dog", "bird", "fish"]},
)


def classify(scores: npt.NDArray[np.float32], k: int, model: ModelVersion = CLASSIFIER) -> Any:
    request = InferRequest("clf", inputs=[tensor("IN", scores)])
    request.outputs = [RequestedOutput("PROB", classification=k)]
    item = prepare(request, model)
    (out,) = build_response(request, model, {"PROB": scores}, item.batch_size).outputs
    assert out.datatype is DataType.BYTES
    return out.data.tolist()


def test_classification_with_labels_per_batch_item() -> None:
    scores = np.array([[0.1, 0.7, 0.15, 0.05], [0.5, 0.0, 0.2, 0.3]], np.float32)
    assert classify(scores, 2) == [
        [b"0.700000:1:dog", b"0.150000:2:bird"],
        [b"0.500000:0:cat", b"0.300000:3:fish"],
    ]


def test_classification_count_larger_than_the_classes() -> None:
    top = classify(np.array([[0.1, 0.2, 0.3, 0.4]], np.float32), 10)
    assert [entry.split(b":")[1] for entry in top[0]] == [b"3", b"2", b"1", b"0"]


def test_classification_without_labels() -> None:
    bare = model_of(str(CLASSIFIER.config))
    assert classify(np.array([[0.0, 1.0, 0.5, 0.2]], np.float32), 1, bare) == [[b"1.000000:1"]]


def test_classification_of_a_bytes_output_is_refused() -> None:
    model = model_of("""
        name: "s"
        input [ { name: "IN" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
    """)
    data = np.array([b"x"], dtype=object)
    request = InferRequest("s", inputs=[Tensor("IN", DataType.BYTES, (1,), data)])
    request.outputs = [RequestedOutput("OUT", classification=1)]
    message = "class result not available for output due to unsupported type 'BYTES'"
    assert message in refused(request, model)


@pytest.mark.parametrize("config_type", ["TYPE_BOOL", "TYPE_FP16", "TYPE_BF16"])
def test_classification_of_a_type_triton_cannot_rank_is_refused(config_type: str) -> None:
    # Triton's TopkClassifications ranks integers, FP32 and FP64 only.
    model = model_of(f"""
        name: "t"
        input [ {{ name: "IN" data_type: {config_type} dims: [ 4 ] }} ]
        output [ {{ name: "OUT" data_type: {config_type} dims: [ 4 ] }} ]
    """)
    datatype = model.inputs["IN"].datatype
    data = np.zeros(4, dtype=datatype.numpy)
    request = InferRequest("t", inputs=[Tensor("IN", datatype, (4,), data)])
    request.outputs = [RequestedOutput("OUT", classification=1)]
    message = f"class result not available for output due to unsupported type '{datatype.value}'"
    assert refused(request, model) == message


@pytest.mark.parametrize(
    ("config_type", "values", "top"),
    [
        # Through float64 all three would be one number, ranked in index order. Equal ones
        # keep index order, as they do in floats.
        ("TYPE_INT64", [2**60, 2**60 + 3, 2**60 + 3], [1, 2]),
        ("TYPE_UINT64", [2**64 - 2, 2**64 - 1, 1], [1, 0]),
    ],
)
def test_classification_ranks_integers_in_their_own_type(
    config_type: str, values: list[int], top: list[int]
) -> None:
    model = model_of(f"""
        name: "i"
        input [ {{ name: "IN" data_type: {config_type} dims: [ 3 ] }} ]
        output [ {{ name: "OUT" data_type: {config_type} dims: [ 3 ] }} ]
    """)
    datatype = model.outputs["OUT"].datatype
    data = np.array(values, dtype=datatype.numpy)
    request = InferRequest("i", inputs=[Tensor("IN", datatype, (3,), data)])
    request.outputs = [RequestedOutput("OUT", classification=2)]
    item = prepare(request, model)
    (out,) = build_response(request, model, {"OUT": data}, item.batch_size).outputs
    assert out.data.tolist() == [f"{values[i]}:{i}".encode() for i in top]


def test_an_empty_label_adds_nothing() -> None:
    # Triton appends ":label" only for a non-empty label (core infer_response.cc).
    model = model_of(str(CLASSIFIER.config), labels={"PROB": ["cat", ""]})
    top = classify(np.array([[0.2, 0.7, 0.1, 0.0]], np.float32), 2, model)
    assert top == [[b"0.700000:1", b"0.200000:0:cat"]]


# --- raw binary requests ------------------------------------------------------------------------


def raw(body: bytes) -> InferRequest:
    data = np.frombuffer(body, dtype=np.uint8)
    placeholder = Tensor("", DataType.UINT8, (len(body),), data, {"raw_binary": True})
    return InferRequest("m", inputs=[placeholder])


def test_raw_binary_is_the_single_input_as_batch_one() -> None:
    values = np.arange(4, dtype=np.float32)
    item = prepare(raw(values.tobytes()), RESHAPED)
    assert item.batch_size == 1
    # Batch 1, then the config's reshape to the model's [2, 2].
    assert item.inputs["IN"].shape == (1, 2, 2)
    np.testing.assert_array_equal(item.inputs["IN"].reshape(-1), values)


def test_raw_binary_fills_a_variable_dim() -> None:
    model = model_of("""
        name: "v"
        max_batch_size: 2
        input [ { name: "IN" data_type: TYPE_INT16 dims: [ -1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT16 dims: [ -1 ] } ]
    """)
    item = prepare(raw(np.arange(5, dtype=np.int16).tobytes()), model)
    assert item.inputs["IN"].shape == (1, 5)


def test_raw_binary_for_a_bytes_input() -> None:
    model = model_of("""
        name: "s"
        input [ { name: "IN" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
    """)
    item = prepare(raw(b"hello"), model)
    assert item.inputs["IN"].tolist() == [b"hello"]


def test_raw_binary_refused_for_two_inputs() -> None:
    assert refused(raw(b"\0" * 64)) == (
        f"{TAG}Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in "
        "'simple' model configuration"
    )


def test_raw_binary_of_the_wrong_size() -> None:
    mismatch = f"{TAG}input byte size mismatch for input 'IN' for model 'reshaped'. Expected 16"
    assert refused(raw(b"\0" * 20), RESHAPED) == mismatch + ", got 20"
    assert refused(raw(b"\0" * 6), RESHAPED) == mismatch + ", got 6"
