"""Ragged batching: requests whose ragged inputs differ in shape batch together unpadded.

An input with `allow_ragged_batch` is left out of the shape check that decides which
requests may share a batch. In the batch it is every request's data, flattened and
concatenated into one 1-D tensor, as Triton's backends hand ragged inputs to a model. The
model learns where each request's data lies from `batch_input` tensors the scheduler
computes for the batch (each kind as Triton's model_config.proto defines it, from the
first `source_input`):

- BATCH_ELEMENT_COUNT: each request's element count, shape [requests];
- BATCH_ACCUMULATED_ELEMENT_COUNT: the running total of those, shape [requests];
- BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO: the same after a leading 0, [requests + 1];
- BATCH_MAX_ELEMENT_COUNT_AS_SHAPE: shape [largest element count] (zeros: only its
  shape says anything);
- BATCH_ITEM_SHAPE: each batch item's shape without the batch dim, [items, rank - 1];
- BATCH_ITEM_SHAPE_FLATTEN: the same, flattened, [items * (rank - 1)].

A `batch_output` of kind BATCH_SCATTER_WITH_INPUT_SHAPE is split back by its source
input: each request gets, in order, as many elements as its output shape holds, that
shape being the output's config shape with each variable dim taken from the request's
source input. Other outputs split along the batch dim as usual.

Pure functions of the requests; the slot thread calls `merge` and `split`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ge_serve.protos import model_config_pb2
from ge_serve.server.errors import invalid_arg

from .work import Array, WorkItem

Kind = model_config_pb2.BatchInput.Kind


@dataclass(frozen=True, slots=True)
class BatchInputSpec:
    kind: int
    targets: tuple[str, ...]
    source: str
    dtype: type


@dataclass(frozen=True, slots=True)
class BatchOutputSpec:
    targets: tuple[str, ...]
    source: str
    # The output's shape with the batch dim first, -1 where it varies.
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RaggedBatching:
    ragged: frozenset[str]
    batch_inputs: tuple[BatchInputSpec, ...] = ()
    batch_outputs: tuple[BatchOutputSpec, ...] = ()

    def assign(self, item: WorkItem) -> int:
        return 0

    @property
    def closes_on_shape_change(self) -> bool:
        return True  # Triton's rule, for the inputs that are not ragged

    def max_batch(self, bucket: int) -> int:
        return 0

    def key(self, item: WorkItem, bucket: int) -> tuple[object, ...]:
        """Requests batch when every input that is not ragged agrees in shape and dtype."""
        return tuple(
            (name, array.dtype.str, None if name in self.ragged else array.shape[1:])
            for name, array in sorted(item.inputs.items())
        )

    def merge(
        self, items: Sequence[WorkItem], bucket: int, total: int, padded: int
    ) -> dict[str, Array]:
        merged: dict[str, Array] = {}
        for name in items[0].inputs:
            parts = [item.inputs[name] for item in items]
            if name in self.ragged:
                merged[name] = np.concatenate([p.reshape(-1) for p in parts])
            else:
                merged[name] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        for spec in self.batch_inputs:
            value = batch_input(spec, items)
            for target in spec.targets:
                merged[target] = value
        return merged

    def split(
        self, items: Sequence[WorkItem], bucket: int, outputs: dict[str, Array]
    ) -> list[dict[str, Array]]:
        results: list[dict[str, Array]] = [{} for _ in items]
        scattered: set[str] = set()
        for spec in self.batch_outputs:
            for target in spec.targets:
                value = outputs.get(target)
                if value is None:
                    continue
                scattered.add(target)
                flat = value.reshape(-1)
                offset = 0
                for result, item in zip(results, items, strict=True):
                    source = item.inputs[spec.source].shape
                    shape = tuple(
                        source[i] if d == -1 and i < len(source) else d
                        for i, d in enumerate(spec.shape)
                    )
                    count = math.prod(shape)
                    result[target] = flat[offset : offset + count].reshape(shape)
                    offset += count
        offset = 0
        for result, item in zip(results, items, strict=True):
            end = offset + item.batch_size
            for name, value in outputs.items():
                if name not in scattered:
                    result[name] = value[offset:end]
            offset = end
        return results


def batch_input(spec: BatchInputSpec, items: Sequence[WorkItem]) -> Array:
    """One batch input's tensor for the batch of `items`."""
    shapes = [item.inputs[spec.source].shape for item in items]
    counts = [math.prod(shape) for shape in shapes]
    kind = spec.kind
    if kind == Kind.BATCH_ELEMENT_COUNT:
        values: list[int] | Array = counts
    elif kind == Kind.BATCH_ACCUMULATED_ELEMENT_COUNT:
        values = list(np.cumsum(counts))
    elif kind == Kind.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
        values = [0, *np.cumsum(counts)]
    elif kind == Kind.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE:
        return np.zeros(max(counts), dtype=spec.dtype)
    else:
        rows = [list(shape[1:]) for shape in shapes for _ in range(shape[0])]
        array: Array = np.array(rows, dtype=spec.dtype).reshape(len(rows), -1)
        return array.reshape(-1) if kind == Kind.BATCH_ITEM_SHAPE_FLATTEN else array
    return np.array(values, dtype=spec.dtype)


def ragged_for(config: model_config_pb2.ModelConfig) -> RaggedBatching | None:
    """The model's ragged inputs, batch inputs and batch outputs; None without any.
    Raises INVALID_ARG, naming what cannot work, at load."""
    name = config.name
    ragged = frozenset(i.name for i in config.input if i.allow_ragged_batch)
    if not ragged and not config.batch_input and not config.batch_output:
        return None
    if config.max_batch_size <= 0:
        raise invalid_arg(
            f"model '{name}': allow_ragged_batch, batch_input and batch_output need "
            "max_batch_size > 0"
        )
    inputs = {i.name for i in config.input}
    outputs = {o.name: o for o in config.output}
    batch_inputs = []
    # Triton's messages and order (ValidateBatchIO, model_config_utils.cc, which ends each
    # with " for <model>"), since they are what its users search for.
    for entry in config.batch_input:
        kind_name = model_config_pb2.BatchInput.Kind.Name(entry.kind)
        if len(entry.source_input) != 1:
            raise invalid_arg(
                f"batch input kind '{kind_name}' expects 1 source input, got "
                f"{len(entry.source_input)} for {name}"
            )
        if entry.data_type not in (model_config_pb2.TYPE_INT32, model_config_pb2.TYPE_FP32):
            raise invalid_arg(f"batch input data type must be TYPE_INT32 or TYPE_FP32 for {name}")
        if entry.source_input[0] not in inputs:
            raise invalid_arg(f"unknown source input name '{entry.source_input[0]}' for {name}")
        if not entry.target_name or any(t in inputs for t in entry.target_name):
            raise invalid_arg(
                f"model '{name}': batch input {kind_name} needs target names that are not "
                "request inputs"
            )
        dtype = np.int32 if entry.data_type == model_config_pb2.TYPE_INT32 else np.float32
        batch_inputs.append(
            BatchInputSpec(entry.kind, tuple(entry.target_name), entry.source_input[0], dtype)
        )
    batch_outputs = []
    for output in config.batch_output:
        if len(output.source_input) != 1:
            kind_name = model_config_pb2.BatchOutput.Kind.Name(output.kind)
            raise invalid_arg(
                f"batch output kind '{kind_name}' expects 1 source input, got "
                f"{len(output.source_input)} for {name}"
            )
        if output.source_input[0] not in inputs:
            raise invalid_arg(f"unknown source input name '{output.source_input[0]}' for {name}")
        for target in output.target_name:
            if target not in outputs:
                raise invalid_arg(f"unknown target output name '{target}' for {name}")
        if not output.target_name:
            raise invalid_arg(f"model '{name}': batch output needs at least one target_name")
        shapes = {tuple(outputs[t].dims) for t in output.target_name}
        if len(shapes) != 1:
            raise invalid_arg(f"model '{name}': batch output targets must share one shape")
        shape = (-1, *(int(d) for d in next(iter(shapes))))
        batch_outputs.append(
            BatchOutputSpec(tuple(output.target_name), output.source_input[0], shape)
        )
    return RaggedBatching(ragged, tuple(batch_inputs), tuple(batch_outputs))
