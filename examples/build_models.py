#!/usr/bin/env python3
"""Build the bundled example model repository deterministically.

Writes a Triton model repository (default: ``examples/models`` next to this script):

* ``simple``: INPUT0/INPUT1 INT32 [16] -> OUTPUT0 = sum, OUTPUT1 = difference.
* ``simple_string``: the same on decimal strings (STRING in, STRING out).
* ``image_classifier``: a small CNN, FP32 ``image`` [3, 64, 64] -> ``probabilities`` [10],
  with ``labels.txt`` for the classification extension.

Every run produces byte-identical files: fixed producer fields, no timestamps, fixed
random seed (``numpy.random.RandomState``, whose stream numpy keeps stable across versions).

Usage::

    python3 examples/build_models.py [--out examples/models]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
PRODUCER_NAME = "ge-serve-examples"
PRODUCER_VERSION = "1.0"
SEED = 20240601

DEFAULT_OUT = Path(__file__).resolve().parent / "models"

LABELS: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)

SIMPLE_CONFIG = """\
name: "simple"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
"""

SIMPLE_STRING_CONFIG = """\
name: "simple_string"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_STRING
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_STRING
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_STRING
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_STRING
    dims: [ 16 ]
  }
]
"""

IMAGE_CLASSIFIER_CONFIG = """\
name: "image_classifier"
max_batch_size: 8
input [
  {
    name: "image"
    data_type: TYPE_FP32
    dims: [ 3, 64, 64 ]
  }
]
output [
  {
    name: "probabilities"
    data_type: TYPE_FP32
    dims: [ 10 ]
    label_filename: "labels.txt"
  }
]
dynamic_batching {
  max_queue_delay_microseconds: 500
}
"""


def _finish(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    """Wrap a graph in a model with fixed metadata and validate it."""
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name=PRODUCER_NAME,
        producer_version=PRODUCER_VERSION,
        doc_string=doc,
    )
    model.ir_version = IR_VERSION
    model.model_version = 1
    onnx.checker.check_model(model, full_check=True)
    return model


def build_simple() -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 on INT32 [batch, 16]."""
    shape: list[str | int] = ["batch", 16]
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.INT32, shape) for n in ("INPUT0", "INPUT1")
    ]
    outputs = [
        helper.make_tensor_value_info(n, TensorProto.INT32, shape) for n in ("OUTPUT0", "OUTPUT1")
    ]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
    ]
    graph = helper.make_graph(nodes, "simple", inputs, outputs)
    return _finish(graph, "Triton's simple model: element-wise sum and difference of INT32 [16].")


def build_simple_string() -> onnx.ModelProto:
    """The simple model on decimal-integer strings: Cast to INT32, Add/Sub, Cast back."""
    shape: list[str | int] = ["batch", 16]
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.STRING, shape) for n in ("INPUT0", "INPUT1")
    ]
    outputs = [
        helper.make_tensor_value_info(n, TensorProto.STRING, shape) for n in ("OUTPUT0", "OUTPUT1")
    ]
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["in0_i32"], name="cast_in0", to=TensorProto.INT32),
        helper.make_node("Cast", ["INPUT1"], ["in1_i32"], name="cast_in1", to=TensorProto.INT32),
        helper.make_node("Add", ["in0_i32", "in1_i32"], ["sum_i32"], name="add"),
        helper.make_node("Sub", ["in0_i32", "in1_i32"], ["diff_i32"], name="sub"),
        helper.make_node("Cast", ["sum_i32"], ["OUTPUT0"], name="cast_out0", to=TensorProto.STRING),
        helper.make_node(
            "Cast", ["diff_i32"], ["OUTPUT1"], name="cast_out1", to=TensorProto.STRING
        ),
    ]
    graph = helper.make_graph(nodes, "simple_string", inputs, outputs)
    return _finish(
        graph, "Triton's simple_string model: sum and difference of decimal-integer strings."
    )


def _he_normal(
    rng: np.random.RandomState, shape: Sequence[int], fan_in: int
) -> npt.NDArray[np.float32]:
    """He-normal initialised weights, as float32."""
    std = float(np.sqrt(2.0 / fan_in))
    weights: npt.NDArray[np.float32] = (rng.standard_normal(size=tuple(shape)) * std).astype(
        np.float32
    )
    return weights


def build_image_classifier() -> onnx.ModelProto:
    """Three Conv+Relu+MaxPool stages, GlobalAveragePool, Flatten, Gemm, Softmax."""
    rng = np.random.RandomState(SEED)
    initializers: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    current = "image"
    channels_in = 3
    for stage, channels_out in enumerate((16, 32, 64), start=1):
        w_name, b_name = f"conv{stage}.weight", f"conv{stage}.bias"
        weight = _he_normal(rng, (channels_out, channels_in, 3, 3), fan_in=channels_in * 9)
        bias = np.zeros((channels_out,), dtype=np.float32)
        initializers += [
            numpy_helper.from_array(weight, w_name),
            numpy_helper.from_array(bias, b_name),
        ]
        conv, relu, pool = f"conv{stage}", f"relu{stage}", f"pool{stage}"
        nodes += [
            helper.make_node(
                "Conv",
                [current, w_name, b_name],
                [conv],
                name=conv,
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[1, 1],
            ),
            helper.make_node("Relu", [conv], [relu], name=relu),
            helper.make_node(
                "MaxPool", [relu], [pool], name=pool, kernel_shape=[2, 2], strides=[2, 2]
            ),
        ]
        current = pool
        channels_in = channels_out

    fc_weight = _he_normal(rng, (channels_in, len(LABELS)), fan_in=channels_in)
    fc_bias = (rng.standard_normal(size=(len(LABELS),)) * 0.1).astype(np.float32)
    initializers += [
        numpy_helper.from_array(fc_weight, "fc.weight"),
        numpy_helper.from_array(fc_bias, "fc.bias"),
    ]
    nodes += [
        helper.make_node("GlobalAveragePool", [current], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["features"], name="flatten", axis=1),
        helper.make_node("Gemm", ["features", "fc.weight", "fc.bias"], ["logits"], name="fc"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=1),
    ]

    graph = helper.make_graph(
        nodes,
        "image_classifier",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 64, 64])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", len(LABELS)])],
        initializer=initializers,
    )
    return _finish(graph, "A small random-weight CNN classifier over 10 CIFAR-style labels.")


def _write_model(out: Path, name: str, model: onnx.ModelProto, config: str) -> list[Path]:
    model_dir = out / name
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    config_path = model_dir / "config.pbtxt"
    onnx_path = version_dir / "model.onnx"
    config_path.write_text(config, encoding="utf-8")
    onnx_path.write_bytes(model.SerializeToString())
    return [config_path, onnx_path]


def build_all(out: Path) -> list[Path]:
    """Write the whole example repository under ``out``; return the files written."""
    written = _write_model(out, "simple", build_simple(), SIMPLE_CONFIG)
    written += _write_model(out, "simple_string", build_simple_string(), SIMPLE_STRING_CONFIG)
    written += _write_model(
        out, "image_classifier", build_image_classifier(), IMAGE_CLASSIFIER_CONFIG
    )
    labels_path = out / "image_classifier" / "labels.txt"
    labels_path.write_text("".join(f"{label}\n" for label in LABELS), encoding="utf-8")
    written.append(labels_path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"model repository directory to write (default: {DEFAULT_OUT})",
    )
    args = parser.parse_args(argv)
    out: Path = args.out
    for path in build_all(out):
        print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
