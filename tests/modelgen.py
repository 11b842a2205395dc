"""Small ONNX models and model-repository folders built at test time with onnx.helper."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.server.app import make_scheduler
from ge_serve.server.models.lifecycle import LifecycleSettings, ModelLifecycle
from ge_serve.server.models.repository import ModelRepository

# Triton datatype name -> ONNX element type; every datatype ge-serve carries.
ONNX_TYPES: dict[str, int] = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
    "BF16": TensorProto.BFLOAT16,
}

Dim = int | str | None


def _model(graph: onnx.GraphProto, opset: int = 17, check: bool = True) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    if check:
        onnx.checker.check_model(model)
    return model


def identity_model(
    elem_type: int,
    dims: Sequence[Dim] = ("batch", None),
    input_name: str = "INPUT",
    output_name: str = "OUTPUT",
) -> onnx.ModelProto:
    """OUTPUT = INPUT, for any element type; `None` or a string makes a dim dynamic."""
    graph = helper.make_graph(
        [helper.make_node("Identity", [input_name], [output_name])],
        "identity",
        [helper.make_tensor_value_info(input_name, elem_type, list(dims))],
        [helper.make_tensor_value_info(output_name, elem_type, list(dims))],
    )
    return _model(graph)


def simple_sequence_model() -> onnx.ModelProto:
    """Triton's docs example `simple_sequence` (docs/examples/model_repository): INT32
    INPUT, START and READY, each [N, 1]; OUTPUT = READY * (INPUT + START)."""
    nodes = [
        helper.make_node("Add", ["INPUT", "START"], ["sum"]),
        helper.make_node("Mul", ["READY", "sum"], ["OUTPUT"]),
    ]
    graph = helper.make_graph(
        nodes,
        "simple_sequence",
        [
            helper.make_tensor_value_info(n, TensorProto.INT32, ["N", 1])
            for n in ("INPUT", "START", "READY")
        ],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, ["N", 1])],
    )
    return _model(graph)


SIMPLE_SEQUENCE_CONFIG = """
name: "simple_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""


def accumulator_model() -> onnx.ModelProto:
    """The accumulator of Triton's implicit-state docs: OUTPUT = OUTPUT_STATE = INPUT if
    START else INPUT + INPUT_STATE (INT32 [N, 1]); serve it with ACCUMULATOR_CONFIG."""
    nodes = [
        helper.make_node("Add", ["INPUT", "INPUT_STATE"], ["sum"]),
        helper.make_node("Cast", ["START"], ["start"], to=TensorProto.BOOL),
        helper.make_node("Where", ["start", "INPUT", "sum"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["OUTPUT_STATE"]),
    ]
    graph = helper.make_graph(
        nodes,
        "accumulator",
        [
            helper.make_tensor_value_info(n, TensorProto.INT32, ["N", 1])
            for n in ("INPUT", "START", "INPUT_STATE")
        ],
        [
            helper.make_tensor_value_info(n, TensorProto.INT32, ["N", 1])
            for n in ("OUTPUT", "OUTPUT_STATE")
        ],
    )
    return _model(graph)


# The accumulator's config (name and `platform:` / `backend:` line to fill in): the sum
# over a sequence is its implicit state, with `oldest` batching of up to 4 sequences.
ACCUMULATOR_CONFIG = """
name: "{name}"
{platform}
max_batch_size: 4
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  oldest {{ max_candidate_sequences: 4 }}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }}
  ]
  state [
    {{
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ 1 ]
      initial_state: {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zeros" }}
    }}
  ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""


def add_sub_model(
    dims: Sequence[Dim] = ("batch", 4), elem_type: int = TensorProto.FLOAT
) -> onnx.ModelProto:
    """Two inputs, two outputs: SUM = A + B, DIFF = A - B."""
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["A", "B"], ["SUM"]),
            helper.make_node("Sub", ["A", "B"], ["DIFF"]),
        ],
        "add_sub",
        [
            helper.make_tensor_value_info("A", elem_type, list(dims)),
            helper.make_tensor_value_info("B", elem_type, list(dims)),
        ],
        [
            helper.make_tensor_value_info("SUM", elem_type, list(dims)),
            helper.make_tensor_value_info("DIFF", elem_type, list(dims)),
        ],
    )
    return _model(graph)


def slow_model(width: int = 256) -> onnx.ModelProto:
    """Y = tanh(X @ W) applied ITERS[0] times, so a request's cost is chosen by the client.

    X is FP32 [rows, width]; ITERS is INT64 [1]. No batching (max_batch_size 0).
    """
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["y_in", "W"], ["xw"]),
            helper.make_node("Tanh", ["xw"], ["y_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("y_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("y_out", TensorProto.FLOAT, None),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Squeeze", ["ITERS"], ["trips"]),
            helper.make_node("Loop", ["trips", "cond", "X"], ["Y"], body=body),
        ],
        "slow",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, width]),
            helper.make_tensor_value_info("ITERS", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, width])],
        initializer=[
            numpy_helper.from_array(weight, "W"),
            numpy_helper.from_array(np.array(True), "cond"),
        ],
    )
    return _model(graph)


def gather_model() -> onnx.ModelProto:
    """OUT = GatherElements(DATA, INDEX, axis=1): an out-of-range index fails at run time."""
    graph = helper.make_graph(
        [helper.make_node("GatherElements", ["DATA", "INDEX"], ["OUT"], axis=1)],
        "gather",
        [
            helper.make_tensor_value_info("DATA", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("INDEX", TensorProto.INT64, ["batch", 1]),
        ],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["batch", 1])],
    )
    return _model(graph, check=False)


def lookup_model() -> onnx.ModelProto:
    """VALUE = TABLE[INDEX]; onnxruntime fails at run time for an index outside 0..3."""
    table = numpy_helper.from_array(np.array([1.5, 2.5, 3.5, 4.5], dtype=np.float32), "TABLE")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["TABLE", "INDEX"], ["VALUE"], axis=0)],
        "gather",
        [helper.make_tensor_value_info("INDEX", TensorProto.INT64, ["batch", 1])],
        [helper.make_tensor_value_info("VALUE", TensorProto.FLOAT, ["batch", 1])],
        [table],
    )
    return _model(graph, opset=13, check=False)


def weights_model(megabytes: int) -> onnx.ModelProto:
    """Y = X + W with a large constant W (an initializer of `megabytes` MiB)."""
    count = megabytes * 1024 * 1024 // 4
    weight = helper.make_tensor(
        "W", TensorProto.FLOAT, [count], np.zeros(count, np.float32).tobytes(), raw=True
    )
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "W"], ["Y"])],
        "weights",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", count])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", count])],
        initializer=[weight],
    )
    return _model(graph, check=False)


def add_const_model(constant: float, width: int = 4) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + constant, FP32 [batch, width]."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "K"], ["OUTPUT0"])],
        "add_const",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", width])],
        initializer=[numpy_helper.from_array(np.full([width], constant, np.float32), "K")],
    )
    return _model(graph)


def mixed_batch_model() -> onnx.ModelProto:
    """X has a dynamic first dim, Y a fixed one: not batchable."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["X"], ["Y"], keepdims=1)],
        "mixed",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 1])],
    )
    return _model(graph, check=False)


def batch_probe_model(width: int | str = 4) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 (FP32 [N, width]); BATCH = the executed batch size, on every row.
    A `width` given as a name is a variable-size dim."""
    nodes = [
        helper.make_node("Slice", ["INPUT0", "zero", "one", "one"], ["first"]),
        helper.make_node("Mul", ["first", "f0"], ["zeros"]),
        helper.make_node("Add", ["zeros", "f1"], ["ones"]),
        helper.make_node("ReduceSum", ["ones", "zero"], ["count"], keepdims=1),
        helper.make_node("Mul", ["ones", "count"], ["BATCH"]),
        helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"]),
    ]
    inits = [
        helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
        helper.make_tensor("one", TensorProto.INT64, [1], [1]),
        helper.make_tensor("f0", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("f1", TensorProto.FLOAT, [], [1.0]),
    ]
    graph = helper.make_graph(
        nodes,
        "probe",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["N", width])],
        [
            helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["N", width]),
            helper.make_tensor_value_info("BATCH", TensorProto.FLOAT, ["N", 1]),
        ],
        inits,
    )
    return _model(graph)


def encoder_model(vocab: int = 64, hidden: int = 16) -> onnx.ModelProto:
    """A MiniLM-shaped stand-in: INPUT_IDS and ATTENTION_MASK INT64 [batch, seq] ->
    LAST_HIDDEN FP32 [batch, seq, hidden] (embedding lookup, masked) and EMBEDDING FP32
    [batch, hidden] (masked mean over seq), with the encoder's dynamic dims."""
    rng = np.random.default_rng(1)
    table = rng.standard_normal((vocab, hidden)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["TABLE", "INPUT_IDS"], ["emb"]),
            helper.make_node("Cast", ["ATTENTION_MASK"], ["maskf"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),
            helper.make_node("Mul", ["emb", "mask3"], ["LAST_HIDDEN"]),
            helper.make_node("ReduceSum", ["LAST_HIDDEN", "axis1"], ["total"], keepdims=0),
            helper.make_node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),
            helper.make_node("Max", ["count", "one"], ["safe"]),
            helper.make_node("Div", ["total", "safe"], ["EMBEDDING"]),
        ],
        "encoder",
        [
            helper.make_tensor_value_info("INPUT_IDS", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("ATTENTION_MASK", TensorProto.INT64, ["batch", "seq"]),
        ],
        [
            helper.make_tensor_value_info(
                "LAST_HIDDEN", TensorProto.FLOAT, ["batch", "seq", hidden]
            ),
            helper.make_tensor_value_info("EMBEDDING", TensorProto.FLOAT, ["batch", hidden]),
        ],
        [
            numpy_helper.from_array(table, "TABLE"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
            numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"),
        ],
    )
    return _model(graph)


def ocr_rec_model(classes: int = 12) -> onnx.ModelProto:
    """An OCR-recognition stand-in: X FP32 [batch, 3, 32, width] -> PROBS FP32
    [batch, width / 4, classes] (a 32x4 stride-4 conv, one column per 4 pixels, softmax)."""
    rng = np.random.default_rng(2)
    conv = (rng.standard_normal((8, 3, 32, 4)) / 20).astype(np.float32)
    head = rng.standard_normal((8, classes)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["X", "W"], ["c"], strides=[32, 4]),
            helper.make_node("Squeeze", ["c", "axis2"], ["s"]),
            helper.make_node("Transpose", ["s"], ["t"], perm=[0, 2, 1]),
            helper.make_node("MatMul", ["t", "HEAD"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["PROBS"], axis=-1),
        ],
        "ocr_rec",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 3, 32, "width"])],
        [helper.make_tensor_value_info("PROBS", TensorProto.FLOAT, ["batch", "steps", classes])],
        [
            numpy_helper.from_array(conv, "W"),
            numpy_helper.from_array(head, "HEAD"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
        ],
    )
    return _model(graph)


def exported_rec_model(classes: int = 12) -> onnx.ModelProto:
    """`ocr_rec_model` as paddle2onnx writes PP-OCR's recogniser: opset 12, the weights in
    Constant nodes, not initializers, and the conv's output flattened by a Reshape whose
    target is computed (Shape -> Slice -> Concat of Constant nodes), which ONNX's own shape
    inference cannot follow at that opset.
    X FP32 [batch, 3, 32, width] -> PROBS FP32 [batch, width / 4, classes]."""
    rng = np.random.default_rng(5)
    conv = (rng.standard_normal((8, 3, 32, 4)) / 20).astype(np.float32)
    head = rng.standard_normal((8, classes)).astype(np.float32)

    def const(name: str, array: np.ndarray[Any, Any]) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array))

    def i64(value: int) -> np.ndarray[Any, Any]:
        return np.array([value], dtype=np.int64)

    graph = helper.make_graph(
        [
            const("W", conv),
            const("HEAD", head),
            const("start", i64(0)),
            const("stop", i64(2)),
            const("axis0", i64(0)),
            const("rest", i64(-1)),
            helper.make_node("Conv", ["X", "W"], ["c"], strides=[32, 4]),
            helper.make_node("Shape", ["c"], ["shape"]),
            helper.make_node("Slice", ["shape", "start", "stop", "axis0"], ["lead"]),
            helper.make_node("Concat", ["lead", "rest"], ["flat"], axis=0),
            helper.make_node("Reshape", ["c", "flat"], ["r"]),
            helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
            helper.make_node("MatMul", ["t", "HEAD"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["PROBS"], axis=-1),
        ],
        "exported_rec",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 3, 32, "width"])],
        [helper.make_tensor_value_info("PROBS", TensorProto.FLOAT, ["batch", "steps", classes])],
    )
    return _model(graph, opset=12)


def ocr_det_model() -> onnx.ModelProto:
    """An OCR-detection stand-in: X FP32 [batch, 3, height, width] -> MAP FP32
    [batch, 1, height, width] (a 3x3 conv and a sigmoid: a text-probability map)."""
    rng = np.random.default_rng(3)
    conv = (rng.standard_normal((1, 3, 3, 3)) / 5).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["X", "W"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Sigmoid", ["c"], ["MAP"]),
        ],
        "ocr_det",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 3, "h", "w"])],
        [helper.make_tensor_value_info("MAP", TensorProto.FLOAT, ["batch", 1, "h", "w"])],
        [numpy_helper.from_array(conv, "W")],
    )
    return _model(graph)


def write_model(
    repo: Path,
    name: str,
    model: onnx.ModelProto | bytes | None,
    config: str | None = None,
    versions: Sequence[int | str] = (1,),
    filename: str = "model.onnx",
) -> Path:
    """Write `<repo>/<name>/config.pbtxt` (when given) and the model file in each version."""
    folder = repo / name
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.pbtxt").write_text(config, encoding="utf-8")
    for version in versions:
        version_dir = folder / str(version)
        version_dir.mkdir(exist_ok=True)
        if model is None:
            continue
        data = model if isinstance(model, bytes) else model.SerializeToString()
        (version_dir / filename).write_bytes(data)
    return folder


def make_lifecycle(repo: Path, autocomplete: bool = True) -> ModelLifecycle:
    """The lifecycle the server builds, over one repository, without a network."""
    return ModelLifecycle(
        ModelRepository([repo]),
        {"onnxruntime": OnnxRuntimeBackend()},
        make_scheduler,
        LifecycleSettings(autocomplete=autocomplete, unload_timeout_s=5.0),
    )
