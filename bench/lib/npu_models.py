"""Models and repositories of the npu-sim suite (bench/suites/npu_sim.py), built with the
onnx helper API (random weights, nothing downloaded).

- `cnn_stub`: ResNet's classification interface at a tenth of the pixels, FP32
  [-1, 3, 64, 64] -> [-1, 1000]: a 4x4 stride-4 conv (16 channels), ReLU, global average
  pooling, a linear head. Cheap on purpose: the cost model supplies ResNet-50's timing,
  onnxruntime only has to stay inside it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CNN = "cnn_stub"


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
