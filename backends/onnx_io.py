"""Reading an ONNX file's inputs and outputs, and filling a ModelConfig from them.

Shared by every backend that consumes ONNX (onnxruntime on the host, GE on the NPU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ge_serve.protos import model_config_pb2

from .scheduled_io import fed_inputs, kept_outputs


def max_intra_op_threads() -> int:
    """The most `intra_op_thread_count` may ask for. onnxruntime starts every intra-op
    thread when a session is made, per slot: thousands run the process out of threads
    and the load hangs. Past the cores they only add contention, so 4 per core (at least
    64, harmless anywhere) leaves room to oversubscribe and refuses the mistakes."""
    return max(64, 4 * (os.cpu_count() or 1))


def within_thread_bound(count: int) -> int:
    """`count` intra-op threads, or ValueError past max_intra_op_threads()."""
    bound = max_intra_op_threads()
    if count > bound:
        raise ValueError(
            f"parameter intra_op_thread_count {count} is more threads than this host can "
            f"use (at most {bound}: 4 per core, at least 64)"
        )
    return count


_ONNX_TO_CONFIG: dict[int, int] = {
    onnx.TensorProto.BOOL: model_config_pb2.TYPE_BOOL,
    onnx.TensorProto.UINT8: model_config_pb2.TYPE_UINT8,
    onnx.TensorProto.UINT16: model_config_pb2.TYPE_UINT16,
    onnx.TensorProto.UINT32: model_config_pb2.TYPE_UINT32,
    onnx.TensorProto.UINT64: model_config_pb2.TYPE_UINT64,
    onnx.TensorProto.INT8: model_config_pb2.TYPE_INT8,
    onnx.TensorProto.INT16: model_config_pb2.TYPE_INT16,
    onnx.TensorProto.INT32: model_config_pb2.TYPE_INT32,
    onnx.TensorProto.INT64: model_config_pb2.TYPE_INT64,
    onnx.TensorProto.FLOAT16: model_config_pb2.TYPE_FP16,
    onnx.TensorProto.FLOAT: model_config_pb2.TYPE_FP32,
    onnx.TensorProto.DOUBLE: model_config_pb2.TYPE_FP64,
    onnx.TensorProto.STRING: model_config_pb2.TYPE_STRING,
    onnx.TensorProto.BFLOAT16: model_config_pb2.TYPE_BF16,
}

# Config data types to numpy, for the host and the NPU alike. STRING is an object array of
# bytes; BF16 is left out (numpy has no bfloat16 without ml_dtypes, and NPUs take it raw).
CONFIG_NUMPY: dict[int, np.dtype[Any]] = {
    model_config_pb2.TYPE_BOOL: np.dtype(np.bool_),
    model_config_pb2.TYPE_UINT8: np.dtype(np.uint8),
    model_config_pb2.TYPE_UINT16: np.dtype(np.uint16),
    model_config_pb2.TYPE_UINT32: np.dtype(np.uint32),
    model_config_pb2.TYPE_UINT64: np.dtype(np.uint64),
    model_config_pb2.TYPE_INT8: np.dtype(np.int8),
    model_config_pb2.TYPE_INT16: np.dtype(np.int16),
    model_config_pb2.TYPE_INT32: np.dtype(np.int32),
    model_config_pb2.TYPE_INT64: np.dtype(np.int64),
    model_config_pb2.TYPE_FP16: np.dtype(np.float16),
    model_config_pb2.TYPE_FP32: np.dtype(np.float32),
    model_config_pb2.TYPE_FP64: np.dtype(np.float64),
    model_config_pb2.TYPE_STRING: np.dtype(np.object_),
}

DEFAULT_MAX_BATCH_SIZE = 4


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    data_type: int  # model_config_pb2.DataType
    dims: tuple[int, ...]  # -1 for symbolic or unknown dimensions


def read_onnx_io(path: Path, any_type: bool = False) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """Return the graph's real inputs (initializers excluded) and outputs. A tensor of a
    type with no config datatype is a ValueError, or with `any_type` TYPE_INVALID."""
    inputs, outputs, _ = read_onnx_tensors(path, any_type)
    return inputs, outputs


def read_onnx_tensors(
    path: Path, any_type: bool = False
) -> tuple[list[TensorInfo], list[TensorInfo], list[TensorInfo]]:
    """`read_onnx_io`'s inputs and outputs, and the graph inputs that are initializers
    too: onnxruntime's overridable initializers, which a request may replace."""
    return onnx_tensors(load_onnx(path), any_type)


def load_onnx(path: Path) -> onnx.ModelProto:
    """The file's model, without external data; a file onnx cannot parse is a ValueError."""
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises several unrelated types for a bad file
        raise ValueError(f"failed to parse ONNX file '{path}': {exc}") from exc


def onnx_tensors(
    model: onnx.ModelProto, any_type: bool = False
) -> tuple[list[TensorInfo], list[TensorInfo], list[TensorInfo]]:
    """`read_onnx_tensors` of a model already read."""
    graph = model.graph
    initializers = {init.name for init in graph.initializer}
    inputs = [_info(vi, any_type) for vi in graph.input if vi.name not in initializers]
    outputs = [_info(vi, any_type) for vi in graph.output]
    overridable = [_info(vi, any_type) for vi in graph.input if vi.name in initializers]
    return inputs, outputs, overridable


def _info(value: onnx.ValueInfoProto, any_type: bool) -> TensorInfo:
    tensor_type = value.type.tensor_type
    data_type = _ONNX_TO_CONFIG.get(tensor_type.elem_type)
    if data_type is None and any_type:
        data_type = model_config_pb2.TYPE_INVALID
    if data_type is None:
        raise ValueError(
            f"tensor '{value.name}' has an ONNX element type ({tensor_type.elem_type}) "
            "that ge-serve does not support"
        )
    dims = tuple(
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1
        for d in tensor_type.shape.dim
    )
    return TensorInfo(value.name, data_type, dims)


def autocomplete_from_onnx(
    config: model_config_pb2.ModelConfig,
    path: Path,
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
) -> None:
    """Fill inputs, outputs and max_batch_size from the ONNX file, keeping what is set.

    Follows Triton's onnxruntime backend: a side (inputs, batch inputs counting as inputs;
    outputs) that the config lists gets no tensors added, so a config that leaves out a
    model input fails the load's check as Triton's does, rather than being completed; with
    both sides listed max_batch_size is left as written too. Otherwise, when every input
    and output has a dynamic first dimension and the config names no batch size,
    max_batch_size becomes `default_max_batch_size` (`--backend-config=
    default-max-batch-size`, 4 unless set) and, unless that is 0, the first dimension is
    the batch dimension; such a model batching more than 1 with no scheduler in its config
    gets `dynamic_batching {}`. Listed tensors without dims or datatype get the model's.
    """
    inputs, outputs = read_onnx_io(path)
    listed_inputs = bool(config.input) or bool(config.batch_input)
    listed_outputs = bool(config.output)
    everything = inputs + outputs
    can_batch = bool(everything) and all(t.dims and t.dims[0] == -1 for t in everything)
    # Triton skips its whole auto-complete when both sides are listed.
    completing = not (listed_inputs and listed_outputs)
    if (
        completing
        and config.max_batch_size == 0
        and can_batch
        and _config_dims_leave_batch(config, inputs)
    ):
        config.max_batch_size = default_max_batch_size
    no_scheduler = config.WhichOneof("scheduling_choice") is None
    if completing and can_batch and config.max_batch_size > 1 and no_scheduler:
        config.dynamic_batching.SetInParent()
    strip = 1 if config.max_batch_size > 0 else 0
    # What the scheduler feeds or keeps is not the client's to send or see.
    fed, kept = fed_inputs(config), kept_outputs(config)
    _fill(config.input, [t for t in inputs if t.name not in fed], strip, listed_inputs)
    _fill(config.output, [t for t in outputs if t.name not in kept], strip, listed_outputs)


def _config_dims_leave_batch(
    config: model_config_pb2.ModelConfig, inputs: list[TensorInfo]
) -> bool:
    """False when the user wrote full-rank dims (batch included), i.e. meant no batching."""
    by_name = {t.name: t for t in inputs}
    for cfg in config.input:
        info = by_name.get(cfg.name)
        if info is not None and len(cfg.dims) > 0 and len(cfg.dims) == len(info.dims):
            return False
    return True


def _fill(configured: Any, found: list[TensorInfo], strip: int, listed: bool) -> None:
    """`configured` is the repeated ModelInput or ModelOutput field; `listed`: add none."""
    by_name = {c.name: c for c in configured}
    for info in found:
        entry = by_name.get(info.name)
        if entry is None and listed:
            continue
        if entry is None:
            entry = configured.add()
            entry.name = info.name
        if entry.data_type == model_config_pb2.TYPE_INVALID:
            entry.data_type = info.data_type  # type: ignore[assignment]
        if len(entry.dims) == 0 and not entry.HasField("reshape"):
            entry.dims.extend(info.dims[strip:])
            if not entry.dims and strip:
                # Only the batch dim (an [N] output): Triton's onnxruntime backend writes
                # dims [1] with an empty reshape, as config dims may not be empty.
                entry.dims.append(1)
                entry.reshape.SetInParent()
