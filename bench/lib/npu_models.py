"""Models and repositories of the npu-sim suite (bench/suites/npu_sim.py), built with the
onnx helper API (random weights, nothing downloaded).

- `cnn_stub`: ResNet's classification interface at a tenth of the pixels, FP32
  [-1, 3, 64, 64] -> [-1, 1000]: a 4x4 stride-4 conv (16 channels), ReLU, global average
  pooling, a linear head. Cheap on purpose: the cost model supplies ResNet-50's timing,
  onnxruntime only has to stay inside it.
- `encoder_stub`: MiniLM's interface, INT64 INPUT_IDS and ATTENTION_MASK [-1, -1] ->
  EMBEDDING FP32 [-1, 32] (an embedding lookup and a masked mean).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CNN = "cnn_stub"
ENCODER = "encoder_stub"
BATCH_GEARS = (1, 8, 32)
SEQ_GEARS = (16, 32, 64)


def _save(model: onnx.ModelProto, path: Path) -> None:
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def cnn_stub() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    conv = (rng.standard_normal((16, 3, 4, 4)) * 0.2).astype(np.float32)
    head = (rng.standard_normal((16, 1000)) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["input", "W"], ["c"], strides=[4, 4]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("GlobalAveragePool", ["r"], ["g"]),
            helper.make_node("Flatten", ["g"], ["f"]),
            helper.make_node("MatMul", ["f", "HEAD"], ["logits"]),
        ],
        CNN,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 64, 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 1000])],
        [numpy_helper.from_array(conv, "W"), numpy_helper.from_array(head, "HEAD")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def encoder_stub(vocab: int = 1000, hidden: int = 32) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    table = rng.standard_normal((vocab, hidden)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["TABLE", "INPUT_IDS"], ["emb"]),
            helper.make_node("Cast", ["ATTENTION_MASK"], ["m"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["m", "axis2"], ["m3"]),
            helper.make_node("Mul", ["emb", "m3"], ["masked"]),
            helper.make_node("ReduceSum", ["masked", "axis1"], ["total"], keepdims=0),
            helper.make_node("ReduceSum", ["m3", "axis1"], ["count"], keepdims=0),
            helper.make_node("Max", ["count", "one"], ["safe"]),
            helper.make_node("Div", ["total", "safe"], ["EMBEDDING"]),
        ],
        ENCODER,
        [
            helper.make_tensor_value_info("INPUT_IDS", TensorProto.INT64, ["N", "S"]),
            helper.make_tensor_value_info("ATTENTION_MASK", TensorProto.INT64, ["N", "S"]),
        ],
        [helper.make_tensor_value_info("EMBEDDING", TensorProto.FLOAT, ["N", hidden])],
        [
            numpy_helper.from_array(table, "TABLE"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
            numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _batching(config: str) -> str:
    if config == "off":
        return ""
    if config == "static":
        return "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
    return "dynamic_batching { }\n"


def write_cnn_repo(repo: Path, config: str) -> Path:
    """`cnn_stub` with `config` off / static / adaptive (the server adds the flag)."""
    _save(cnn_stub(), repo / CNN / "1" / "model.onnx")
    text = f"""name: "{CNN}"
backend: "npu_ge"
max_batch_size: 32
input [ {{ name: "input" data_type: TYPE_FP32 dims: [ 3, 64, 64 ] }} ]
output [ {{ name: "logits" data_type: TYPE_FP32 dims: [ 1000 ] }} ]
instance_group [ {{ kind: KIND_GPU count: 1 }} ]
parameters [ {{ key: "device_exec_blocks" value: {{ string_value: "2" }} }},
  {{ key: "graph.ge.dynamicDims" value: {{ string_value: "1;2;4;8;16;32" }} }} ]
{_batching(config)}"""
    (repo / CNN / "config.pbtxt").write_text(text)
    return repo


def write_encoder_repo(repo: Path, mode: str) -> Path:
    """`encoder_stub` with ND gears (`nd_gears`) or one compiled shape, seq 64 (`exact`).
    Batching is off: the requests arrive at gear shapes (batch 1) and no scheduler pads
    here; the comparison is the execution cost of a seq-16 request at its own gear against
    the same request padded to 64."""
    _save(encoder_stub(), repo / ENCODER / "1" / "model.onnx")
    if mode == "nd_gears":
        gears = ";".join(f"{s},{s}" for s in SEQ_GEARS)
        shape, seq = "INPUT_IDS:1,-1;ATTENTION_MASK:1,-1", -1
    else:
        gears, shape, seq = "", "INPUT_IDS:1,64;ATTENTION_MASK:1,64", 64
    params = [f'{{ key: "graph.ge.inputShape" value: {{ string_value: "{shape}" }} }}']
    if gears:
        params.append(f'{{ key: "graph.ge.dynamicDims" value: {{ string_value: "{gears}" }} }}')
    text = f"""name: "{ENCODER}"
backend: "npu_ge"
max_batch_size: 0
input [ {{ name: "INPUT_IDS" data_type: TYPE_INT64 dims: [ 1, {seq} ] }},
        {{ name: "ATTENTION_MASK" data_type: TYPE_INT64 dims: [ 1, {seq} ] }} ]
output [ {{ name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 1, 32 ] }} ]
instance_group [ {{ kind: KIND_GPU count: 1 }} ]
parameters [ {", ".join(params)} ]
"""
    (repo / ENCODER / "config.pbtxt").write_text(text)
    return repo
