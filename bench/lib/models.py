"""Bench models with random weights (onnx helper API + numpy; nothing downloaded) and Triton
model repositories around them.

Models (ONNX files cached under bench/.cache/models/onnx/, rebuilt only when missing):
- `resnet18_like`: a ResNet-18-shaped CNN, BN folded into conv biases: 7x7/2 stem, max-pool,
  4 stages x 2 basic residual blocks (64, 128, 256, 512 channels), global average pool, FC.
  ~11.7M parameters, ~47 MB. Input `input` FP32 [-1, 3, 224, 224], output `logits` FP32
  [-1, 1000] (dynamic batch).
- `simple`: examples/models/simple (INT32 [-1,16] x2 -> sum and difference).

Repositories:
    repo = make_repo(CACHE / "repos" / "cnn_dyn", "resnet18_like",
                     batching=Batching(max_queue_delay_us=500, preferred=[8, 16]),
                     instances=2, max_batch_size=32)
    # -> repo/resnet18_like/{config.pbtxt, 1/model.onnx}; serve with --model-repository repo
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

BENCH = Path(__file__).resolve().parent.parent
REPO_ROOT = BENCH.parent
CACHE = BENCH / ".cache"
MODEL_CACHE = CACHE / "models"
ONNX_CACHE = MODEL_CACHE / "onnx"
EXAMPLES = REPO_ROOT / "examples" / "models"

RESNET_STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))  # (channels, first stride)
MODELS = ("resnet18_like", "simple")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str  # Triton config spelling: "TYPE_FP32", "TYPE_INT32", ...
    dims: tuple[int, ...]  # without the batch dimension


@dataclass(frozen=True)
class ModelInfo:
    """What make_repo needs to write a config for a generated model."""

    onnx_path: Path
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    default_max_batch_size: int


@dataclass
class Batching:
    """`dynamic_batching { ... }`. Empty values leave Triton's defaults."""

    max_queue_delay_us: int = 0
    preferred: Sequence[int] = ()
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    extra: str = ""  # raw pbtxt lines placed inside the block (e.g. queue policies)


@dataclass
class RepoOptions:
    """Everything make_repo can vary, as one value other scripts can pass around."""

    max_batch_size: int | None = None
    batching: Batching | None = None
    instances: int = 1
    kind: str = "KIND_CPU"  # KIND_CPU (host onnxruntime), KIND_GPU / KIND_MODEL for devices
    backend: str = "onnxruntime"
    params: Mapping[str, str] = field(default_factory=dict)
    extra: str = ""  # raw pbtxt appended at the end of config.pbtxt
    model_filename: str = "model.onnx"  # file name in the version folder


# ---------------------------------------------------------------------------------------------
# ResNet-18-like CNN


class _GraphBuilder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def _name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def _weight(self, name: str, array: npt.NDArray[np.float64]) -> str:
        self.inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv(self, x: str, c_in: int, c_out: int, k: int, stride: int, gain: float = 1.0) -> str:
        """Conv with a bias: a conv followed by BatchNorm, with the BN folded in."""
        name = self._name("conv")
        std = gain * np.sqrt(2.0 / (c_in * k * k))  # He init keeps activations O(1)
        w = self._weight(f"{name}.w", self.rng.standard_normal((c_out, c_in, k, k)) * std)
        b = self._weight(f"{name}.b", self.rng.standard_normal(c_out) * 0.01)
        pad = k // 2
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, w, b],
                [name],
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[pad, pad, pad, pad],
            )
        )
        return name

    def op(self, op_type: str, inputs: Sequence[str], **attrs: Any) -> str:
        name = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], **attrs))
        return name

    def basic_block(self, x: str, c_in: int, c_out: int, stride: int) -> str:
        y = self.op("Relu", [self.conv(x, c_in, c_out, 3, stride)])
        y = self.conv(y, c_out, c_out, 3, 1, gain=0.5)
        shortcut = x if stride == 1 and c_in == c_out else self.conv(x, c_in, c_out, 1, stride)
        return self.op("Relu", [self.op("Add", [y, shortcut])])


def build_resnet18_like(num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    g = _GraphBuilder(seed)
    x = g.op("Relu", [g.conv("input", 3, 64, 7, 2)])
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for c_out, stride in RESNET_STAGES:
        x = g.basic_block(x, c_in, c_out, stride)
        x = g.basic_block(x, c_out, c_out, 1)
        c_in = c_out
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    fc_w = g._weight("fc.w", g.rng.standard_normal((c_in, num_classes)) * np.sqrt(1.0 / c_in))
    fc_b = g._weight("fc.b", np.zeros(num_classes))
    g.nodes.append(helper.make_node("Gemm", [x, fc_w, fc_b], ["logits"]))
    graph = helper.make_graph(
        g.nodes,
        "resnet18_like",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", num_classes])],
        initializer=g.inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ge-serve-bench"
    )
    model.ir_version = 8  # readable by onnxruntime >= 1.14
    onnx.checker.check_model(model)
    return model


def parameter_count(model: onnx.ModelProto) -> int:
    return sum(int(np.prod(t.dims)) for t in model.graph.initializer)


def _save_atomic(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    onnx.save(model, str(tmp))
    tmp.replace(path)


def ensure_model(name: str, rebuild: bool = False) -> ModelInfo:
    """Build (once) and describe a bench model."""
    if name == "resnet18_like":
        path = ONNX_CACHE / "resnet18_like.onnx"
        if rebuild or not path.exists():
            _save_atomic(build_resnet18_like(), path)
        return ModelInfo(
            path,
            (TensorSpec("input", "TYPE_FP32", (3, 224, 224)),),
            (TensorSpec("logits", "TYPE_FP32", (1000,)),),
            default_max_batch_size=32,
        )
    if name == "simple":
        return ModelInfo(
            EXAMPLES / "simple" / "1" / "model.onnx",
            (TensorSpec("INPUT0", "TYPE_INT32", (16,)), TensorSpec("INPUT1", "TYPE_INT32", (16,))),
            (
                TensorSpec("OUTPUT0", "TYPE_INT32", (16,)),
                TensorSpec("OUTPUT1", "TYPE_INT32", (16,)),
            ),
            default_max_batch_size=8,
        )
    raise ValueError(f"unknown bench model {name!r}; known: {', '.join(MODELS)}")


# ---------------------------------------------------------------------------------------------
# config.pbtxt


def _tensors(kind: str, specs: Sequence[TensorSpec]) -> str:
    items = []
    for s in specs:
        dims = ", ".join(str(d) for d in s.dims)
        items.append(
            f'  {{\n    name: "{s.name}"\n    data_type: {s.data_type}\n    dims: [ {dims} ]\n  }}'
        )
    return f"{kind} [\n" + ",\n".join(items) + "\n]\n"


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_text(name: str, info: ModelInfo, options: RepoOptions) -> str:
    """A complete Triton config.pbtxt (inputs and outputs listed, so it also serves with
    --disable-auto-complete-config)."""
    mbs = info.default_max_batch_size if options.max_batch_size is None else options.max_batch_size
    text = f'name: "{name}"\n'
    if options.backend:
        text += f'backend: "{options.backend}"\n'
    text += f"max_batch_size: {mbs}\n"
    if options.model_filename != "model.onnx":
        text += f"default_model_filename: {_quote(options.model_filename)}\n"
    text += _tensors("input", info.inputs) + _tensors("output", info.outputs)
    text += (
        f"instance_group [\n  {{\n    count: {options.instances}\n    kind: {options.kind}\n"
        "  }\n]\n"
    )
    b = options.batching
    if b is not None:
        text += "dynamic_batching {\n"
        if b.preferred:
            text += f"  preferred_batch_size: [ {', '.join(str(p) for p in b.preferred)} ]\n"
        if b.max_queue_delay_us:
            text += f"  max_queue_delay_microseconds: {b.max_queue_delay_us}\n"
        if b.preserve_ordering:
            text += "  preserve_ordering: true\n"
        if b.priority_levels:
            text += f"  priority_levels: {b.priority_levels}\n"
        if b.default_priority_level:
            text += f"  default_priority_level: {b.default_priority_level}\n"
        if b.extra:
            text += "".join(f"  {line}\n" for line in b.extra.strip().splitlines())
        text += "}\n"
    for key, value in options.params.items():
        text += (
            f"parameters {{\n  key: {_quote(key)}\n"
            f"  value: {{ string_value: {_quote(str(value))} }}\n}}\n"
        )
    if options.extra:
        text += options.extra.rstrip() + "\n"
    return text


def validate_config(text: str) -> None:
    """Parse with the Triton ModelConfig proto, so a bad option fails here, not in the server."""
    from google.protobuf import text_format

    from ge_serve.protos import model_config_pb2

    text_format.Parse(text, model_config_pb2.ModelConfig())


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard link big files (no 47 MB copy per variant) when on one filesystem, else copy.
    Small files are copied, so that no link ever reaches a file tracked in git."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() or dst.is_symlink():
        if dst.is_file() and os.path.samefile(src, dst):
            return
        dst.unlink()
    if src.stat().st_size >= 1 << 20:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copyfile(src, dst)


def make_repo(
    path: Path,
    model: str = "resnet18_like",
    *,
    name: str | None = None,
    max_batch_size: int | None = None,
    batching: Batching | None = None,
    instances: int = 1,
    kind: str = "KIND_CPU",
    backend: str = "onnxruntime",
    params: Mapping[str, str] | None = None,
    extra: str = "",
    model_filename: str = "model.onnx",
    options: RepoOptions | None = None,
) -> Path:
    """Write (or overwrite) one model into repository `path`: path/<name>/config.pbtxt and
    path/<name>/1/model.onnx. Returns `path` (pass it as --model-repository). Call again with
    the same path and another name to put several models in one repository.

    batching=None writes no dynamic_batching block. Note: with auto-complete on, ge-serve (like
    its autocomplete.py says) adds dynamic_batching to a model with max_batch_size > 1 that has
    none; start the server with --disable-auto-complete-config to measure batching off.
    `options`, when given, replaces the keyword options."""
    opts = options or RepoOptions(
        max_batch_size=max_batch_size,
        batching=batching,
        instances=instances,
        kind=kind,
        backend=backend,
        params=dict(params or {}),
        extra=extra,
        model_filename=model_filename,
    )
    info = ensure_model(model)
    model_name = name or model
    text = config_text(model_name, info, opts)
    validate_config(text)
    model_dir = path / model_name
    _link_or_copy(info.onnx_path, model_dir / "1" / opts.model_filename)
    (model_dir / "config.pbtxt").write_text(text)
    return path
