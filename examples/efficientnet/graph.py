"""EfficientNet-Lite0 as an ONNX graph, written with ``onnx.helper`` from its weights.

The network is the one Google's ``efficientnet/lite`` defines and the converted PyTorch
weights (``_conv_stem``, ``_blocks.N``, ``_conv_head``, ``_fc``, as in
efficientnet_pytorch) hold:

* stem: 3x3 conv, stride 2, 32 channels, BN, ReLU6;
* 16 MBConv blocks in seven stages (``STAGES``: kernel, stride, expansion, output
  channels, repeats); a block is an optional 1x1 expansion conv (BN, ReLU6), a depthwise
  conv (BN, ReLU6) and a 1x1 projection conv (BN, no activation), with the input added
  back where the stride is 1 and the channels match. Lite has no squeeze-excite and uses
  ReLU6 instead of swish;
* head: 1x1 conv to 1280 channels, BN, ReLU6, global average pool, fully connected 1000.

Each batch norm is folded into the conv before it (``w * g / sqrt(v + eps)``, bias
``b - m * g / sqrt(v + eps)``), so the graph is only Conv, Clip, Add,
GlobalAveragePool, Flatten and Gemm: what ATC compiles for an NPU without fusion passes.

Padding is TensorFlow's SAME, as the weights were trained with: for a stride-2 conv the
odd pixel of padding goes at the bottom and right. The input size is fixed (224), so the
pads are computed here and written out explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

IMAGE_SIZE = 224
CLASSES = 1000
BN_EPS = 1e-3  # the TensorFlow checkpoints' batch_norm_epsilon
OPSET = 13


@dataclass(frozen=True, slots=True)
class Stage:
    kernel: int
    stride: int
    expand: int
    out: int
    repeats: int


# efficientnet-lite0: width and depth multipliers 1.0, so the base EfficientNet-B0 stages.
STAGES = (
    Stage(3, 1, 1, 16, 1),
    Stage(3, 2, 6, 24, 2),
    Stage(5, 2, 6, 40, 2),
    Stage(3, 2, 6, 80, 3),
    Stage(5, 1, 6, 112, 3),
    Stage(5, 2, 6, 192, 4),
    Stage(3, 1, 6, 320, 1),
)
STEM = 32
HEAD = 1280

F32 = npt.NDArray[np.float32]


def same_pads(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow SAME padding of one axis: (before, after), the odd pixel after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class _Writer:
    def __init__(self, weights: Mapping[str, npt.NDArray[Any]]) -> None:
        self.weights = weights
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.used: set[str] = set()
        self._init("relu6.min", np.array(0.0, np.float32))
        self._init("relu6.max", np.array(6.0, np.float32))

    def _w(self, name: str) -> F32:
        self.used.add(name)
        return np.asarray(self.weights[name], dtype=np.float32)

    def _init(self, name: str, array: F32) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def _folded(self, conv: str, bn: str) -> tuple[F32, F32]:
        w = self._w(f"{conv}.weight")
        gamma, beta = self._w(f"{bn}.weight"), self._w(f"{bn}.bias")
        mean, var = self._w(f"{bn}.running_mean"), self._w(f"{bn}.running_var")
        self.used.add(f"{bn}.num_batches_tracked")
        scale = gamma / np.sqrt(var + BN_EPS)
        return w * scale[:, None, None, None], beta - mean * scale

    def conv_bn(
        self, x: str, size: int, conv: str, bn: str, stride: int = 1, relu6: bool = True
    ) -> tuple[str, int]:
        """Conv with its BN folded in (and ReLU6): the output name and its spatial size."""
        w, b = self._folded(conv, bn)
        kernel = w.shape[-1]
        groups = w.shape[0] if w.shape[1] == 1 and kernel > 1 else 1
        before, after = same_pads(size, kernel, stride)
        out = f"{conv}.out"
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, self._init(f"{conv}.w", w), self._init(f"{conv}.b", b)],
                [out],
                name=conv,
                kernel_shape=[kernel, kernel],
                strides=[stride, stride],
                pads=[before, before, after, after],
                group=groups,
            )
        )
        if relu6:
            self.nodes.append(
                helper.make_node(
                    "Clip",
                    [out, "relu6.min", "relu6.max"],
                    [f"{conv}.relu6"],
                    name=f"{conv}.relu6",
                )
            )
            out = f"{conv}.relu6"
        return out, -(-size // stride)

    def block(self, x: str, size: int, index: int, stage: Stage, stride: int) -> tuple[str, int]:
        prefix = f"_blocks.{index}"
        h = x
        if stage.expand != 1:
            h, _ = self.conv_bn(h, size, f"{prefix}._expand_conv", f"{prefix}._bn0")
        h, out_size = self.conv_bn(h, size, f"{prefix}._depthwise_conv", f"{prefix}._bn1", stride)
        h, _ = self.conv_bn(h, out_size, f"{prefix}._project_conv", f"{prefix}._bn2", relu6=False)
        return h, out_size

    def network(self) -> onnx.GraphProto:
        x, size = self.conv_bn("x", IMAGE_SIZE, "_conv_stem", "_bn0", stride=2)
        channels = STEM
        index = 0
        for stage in STAGES:
            for repeat in range(stage.repeats):
                stride = stage.stride if repeat == 0 else 1
                out, size_out = self.block(x, size, index, stage, stride)
                if stride == 1 and channels == stage.out:
                    added = f"_blocks.{index}.add"
                    self.nodes.append(helper.make_node("Add", [out, x], [added], name=added))
                    out = added
                x, size, channels = out, size_out, stage.out
                index += 1
        x, _ = self.conv_bn(x, size, "_conv_head", "_bn1")
        self.nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="pool"))
        self.nodes.append(helper.make_node("Flatten", ["pool"], ["features"], name="flatten"))
        fc_w = self._init("_fc.w", self._w("_fc.weight"))
        fc_b = self._init("_fc.b", self._w("_fc.bias"))
        self.nodes.append(
            helper.make_node("Gemm", ["features", fc_w, fc_b], ["logits"], name="_fc", transB=1)
        )
        unused = set(self.weights) - self.used
        if unused:
            raise ValueError(f"weights the graph does not use: {sorted(unused)[:5]}")
        batch = "batch"
        return helper.make_graph(
            self.nodes,
            "efficientnet_lite0",
            [
                helper.make_tensor_value_info(
                    "x", TensorProto.FLOAT, [batch, 3, IMAGE_SIZE, IMAGE_SIZE]
                )
            ],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, CLASSES])],
            self.inits,
        )


def efficientnet_lite0(weights: Mapping[str, npt.NDArray[Any]]) -> onnx.ModelProto:
    """The ONNX model: FP32 `x` [N, 3, 224, 224] (normalised RGB) -> `logits` [N, 1000]."""
    expected = 1 + sum(s.repeats for s in STAGES)
    blocks = {k.split(".")[1] for k in weights if k.startswith("_blocks.")}
    if len(blocks) != expected - 1:
        raise ValueError(f"the weights have {len(blocks)} blocks, Lite0 has {expected - 1}")
    model = helper.make_model(
        _Writer(weights).network(),
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="ge-serve examples/efficientnet",
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
