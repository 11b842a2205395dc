"""What the simulated NPU says about a model: the description `atc` would give its OM, and
the device memory loading it takes (`query_size`).

- Batch gears: a -1 batch dimension and `ascend_mbatch_shape_data` with two or more gears,
  a fixed batch with one; buffers sized at the largest gear.
- ND and image-size gears: -1 where a dim varies, `ascend_mbatch_shape_data`, each gear's
  full input shapes, and buffer sizes at the largest gear, outputs included (their shapes
  per gear come from ONNX shape inference).
- Shape ranges: -1 where a dim varies, the ranges, and sizes of 0, as pyACL reports for a
  range OM (the executor sizes its buffers for the ranges' maxima).

Memory: the weights are the bytes of the ONNX initializers and Constant nodes; the work
space is the most bytes of intermediate tensors alive at once at the largest shapes (the
largest batch gear, the largest ND or image-size gear, or the ranges' maxima), each freed
after its last reader, as GE's memory planning reuses space.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ge_serve.backends.onnx_io import read_onnx_io

from .acl import (
    ACL_ERROR_RT_INTERNAL_ERROR,
    DYNAMIC_BATCH_INPUT,
    AclError,
    ModelDesc,
    ModelSource,
    TensorDesc,
    TensorPlan,
)
from .options import numpy_dtype
from .shape_infer import infer_output_shapes, inference_model, inferred_model, lighten
from .shapes import (
    DESCRIBED,
    DYNAMIC,
    RANGE,
    Shape,
    max_shape,
)

_ONNX_ITEMSIZE: dict[int, int] = {
    onnx.TensorProto.FLOAT: 4,
    onnx.TensorProto.FLOAT16: 2,
    onnx.TensorProto.DOUBLE: 8,
    onnx.TensorProto.INT8: 1,
    onnx.TensorProto.UINT8: 1,
    onnx.TensorProto.INT16: 2,
    onnx.TensorProto.UINT16: 2,
    onnx.TensorProto.INT32: 4,
    onnx.TensorProto.UINT32: 4,
    onnx.TensorProto.INT64: 8,
    onnx.TensorProto.UINT64: 8,
    onnx.TensorProto.BOOL: 1,
}


def planned_desc(source: ModelSource) -> ModelDesc:
    """The description `atc` gives an OM compiled from `source`'s ONNX file."""
    plan = source.shapes
    if plan is not None and (plan.gears or plan.kind in DESCRIBED):
        return _shaped_desc(source)
    found_inputs, found_outputs = read_onnx_io(source.path)
    gears = source.gears
    dynamic = source.batching and len(gears) > 1
    lead: tuple[int, ...] = ()
    rows = 1
    if source.batching:
        if not gears:
            raise ValueError("a batching model needs at least one batch gear")
        lead = (-1,) if dynamic else (gears[0],)
        rows = gears[-1]

    def describe(
        index: int,
        name: str,
        found_type: int,
        found_dims: tuple[int, ...],
        plans: tuple[TensorPlan, ...],
    ) -> TensorDesc:
        plan = next((p for p in plans if p.name == name), None)
        dims = plan.dims if plan is not None else found_dims[1 if source.batching else 0 :]
        if any(d < 0 for d in dims):
            raise ValueError(
                f"tensor '{name}' has dims {list(dims)}; give its dims in config.pbtxt, or "
                "compile its varying dims as gears or ranges (graph.ge.dynamicDims, "
                "graph.ge.dynamicImageSize, graph.ge.inputShape)"
            )
        dtype = numpy_dtype(found_type)
        size = math.prod(dims) * dtype.itemsize * rows
        return TensorDesc(index, name, dtype, lead + dims, max(size, 1))

    inputs = [
        describe(i, t.name, t.data_type, t.dims, source.inputs) for i, t in enumerate(found_inputs)
    ]
    outputs = [
        describe(i, t.name, t.data_type, t.dims, source.outputs)
        for i, t in enumerate(found_outputs)
    ]
    dynamic_index = None
    if dynamic:
        dynamic_index = len(inputs)
        inputs.append(TensorDesc(dynamic_index, DYNAMIC_BATCH_INPUT, np.dtype(np.int64), (1,), 8))
    return ModelDesc(tuple(inputs), tuple(outputs), gears if dynamic else (), dynamic_index)


def _varying(shapes: Sequence[Shape]) -> Shape:
    """Dims that all shapes share, -1 where they differ."""
    first = shapes[0]
    return tuple(d if all(s[i] == d for s in shapes) else -1 for i, d in enumerate(first))


def _probe(ranges: Sequence[tuple[int, int]], step: int) -> Shape:
    """The ranges' maxima, or `step` past the minimum where a dim has no upper bound."""
    return tuple(high if high >= 0 else low + step for low, high in ranges)


def _shaped_desc(source: ModelSource) -> ModelDesc:
    plan = source.shapes
    found_inputs, found_outputs = read_onnx_io(source.path)
    named = {s.name: s for s in plan.inputs}
    unknown = set(named) - {t.name for t in found_inputs}
    if unknown:
        raise ValueError(f"graph.ge.inputShape names {sorted(unknown)}, not inputs of the model")

    def fixed(name: str, dims: tuple[int, ...]) -> Shape:
        if any(d < 0 for d in dims):
            raise ValueError(
                f"input '{name}' has dims {list(dims)} and is not in graph.ge.inputShape"
            )
        return dims

    order = [t.name for t in found_inputs]
    if plan.kind in DESCRIBED:
        ranges = tuple(
            named[n].ranges if n in named else tuple((d, d) for d in fixed(n, t.dims))
            for n, t in zip(order, found_inputs, strict=True)
        )
        # GE dynamic shape has no maximum: shapes past the minimum tell which output
        # dims follow the inputs (two, as a strided dim may not move by one).
        at_min = [tuple(max(low, 1) for low, _ in r) for r in ranges]
        samples: list[list[Shape]] = [at_min] + [
            [_probe(r, step) for r in ranges]
            for step in ((1, 64) if plan.kind == DYNAMIC else (0,))
        ]
        input_dims = [_varying([s[i] for s in samples]) for i in range(len(order))]
        gears: tuple[tuple[Shape, ...], ...] = ()
    else:
        index = {s.name: i for i, s in enumerate(plan.inputs)}
        gears = tuple(
            tuple(
                gear[index[n]] if n in named else fixed(n, t.dims)
                for n, t in zip(order, found_inputs, strict=True)
            )
            for gear in plan.gears
        )
        samples = [list(g) for g in gears]
        input_dims = [_varying([g[i] for g in gears]) for i in range(len(order))]
        ranges = ()
    model = inference_model(source.path)
    per_sample = [infer_output_shapes(model, dict(zip(order, s, strict=True))) for s in samples]
    sized = plan.kind not in DESCRIBED
    inputs = []
    for i, found in enumerate(found_inputs):
        dtype = numpy_dtype(found.data_type)
        size = max(math.prod(s[i]) for s in samples) * dtype.itemsize if sized else 0
        inputs.append(TensorDesc(i, found.name, dtype, input_dims[i], size))
    outputs = []
    for i, found in enumerate(found_outputs):
        dtype = numpy_dtype(found.data_type)
        shapes = [o[found.name] for o in per_sample]
        size = max(math.prod(s) for s in shapes) * dtype.itemsize if sized else 0
        outputs.append(TensorDesc(i, found.name, dtype, _varying(shapes), size))
    dynamic_index = None
    if gears:
        dynamic_index = len(inputs)
        width = sum(len(s) for s in gears[0])
        inputs.append(
            TensorDesc(dynamic_index, DYNAMIC_BATCH_INPUT, np.dtype(np.int64), (width,), 8 * width)
        )
    return ModelDesc(
        tuple(inputs),
        tuple(outputs),
        (),
        dynamic_index,
        shape_kind=plan.kind,
        shape_gears=gears,
        ranges=ranges,
    )


def query_size(path: Path, desc: ModelDesc) -> tuple[int, int]:
    """(work, weight) bytes, as `acl.mdl.query_size` reports them for an OM."""
    model = onnx.load(str(path), load_external_data=False)
    # Exporters such as paddle2onnx keep the weights in Constant nodes, not initializers.
    weight = sum(_tensor_bytes(t) for t in model.graph.initializer) + sum(
        _tensor_bytes(a.t)
        for node in model.graph.node
        if node.op_type == "Constant"
        for a in node.attribute
        if a.name == "value"
    )
    largest = _largest_inputs(desc)
    try:
        light = lighten(model)
        inferred: Any = (
            inferred_model(light, largest) if largest else onnx.shape_inference.infer_shapes(light)
        )
        work = _peak_work(inferred, _rows(desc))
    except Exception:
        work = 0  # shape inference failed: only the weights are known
    return max(work, 0), max(weight, 1)


def _peak_work(model: onnx.ModelProto, rows: int) -> int:
    """The most bytes of intermediate tensors alive at once when the nodes run in order,
    each freed after its last reader, as a memory planner that reuses space holds them.
    Graph inputs and outputs live in the I/O buffers and constants are weights, so
    neither counts. A symbolic dim counts as `rows`, the largest batch."""
    graph = model.graph
    skip = {v.name for v in graph.input} | {v.name for v in graph.output}
    skip |= {t.name for t in graph.initializer}
    skip |= {o for node in graph.node if node.op_type == "Constant" for o in node.output}
    sizes: dict[str, int] = {}
    for value in graph.value_info:
        if value.name in skip:
            continue
        count = 1
        for dim in value.type.tensor_type.shape.dim:
            count *= dim.dim_value if dim.HasField("dim_value") else rows
        sizes[value.name] = count * _ONNX_ITEMSIZE.get(value.type.tensor_type.elem_type, 4)
    last: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in (*node.input, *node.output):
            if name in sizes:
                last[name] = index
    live = peak = 0
    for index, node in enumerate(graph.node):
        live += sum(sizes.get(name, 0) for name in node.output)
        peak = max(peak, live)
        for name in {*node.input, *node.output}:
            if last.get(name) == index:
                live -= sizes[name]
    return peak


def _largest_inputs(desc: ModelDesc) -> dict[str, Shape]:
    """The data inputs' shapes at a shaped model's largest gear or its ranges' maxima, at
    which its work space is largest; {} for other models."""
    data = desc.data_inputs()
    if desc.shape_kind == DYNAMIC:
        return {}  # no largest shape: GE plans a dynamic-shape OM's memory per execution
    if desc.shape_kind == RANGE:
        return {t.name: max_shape(r) for t, r in zip(data, desc.ranges, strict=True)}
    if desc.shape_gears:
        gear = max(desc.shape_gears, key=lambda g: sum(math.prod(s) for s in g))
        return {t.name: s for t, s in zip(data, gear, strict=True)}
    return {}


def _rows(desc: ModelDesc) -> int:
    return desc.gears[-1] if desc.gears else 1


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    if tensor.raw_data:
        return len(tensor.raw_data)
    count = math.prod(tensor.dims) if tensor.dims else 1
    return count * _ONNX_ITEMSIZE.get(int(tensor.data_type), 4)


def row_share(desc: ModelDesc, shapes: list[tuple[int, ...]], batching: bool) -> float:
    """A row's elements over a row's at the model's largest shape: the cost model prices
    smaller gears and shapes in proportion."""
    skip = 1 if batching else 0
    if desc.shape_kind == DYNAMIC:
        # No largest shape to price against: a row costs a whole sample, as in the
        # profile's own figures (npu_ge's ResNet-50 numbers are dynamic-shape runs). Gears
        # and ranges, priced in proportion, stay the faster choice.
        return 1.0
    largest = [list(g) for g in desc.shape_gears] or [
        [tuple(hi for _, hi in r) for r in desc.ranges]
    ]
    if not desc.shape_kind or not largest[0]:
        return 1.0
    most = max(sum(math.prod(s[skip:]) for s in gear) for gear in largest)
    return sum(math.prod(s[skip:]) for s in shapes) / most if most else 1.0


def check_declared(tensor: TensorDesc, shape: tuple[int, ...]) -> None:
    """An output must have the shape the model declares, -1 dims aside."""
    dims = tensor.dims
    if len(dims) != len(shape) or any(d >= 0 and d != g for d, g in zip(dims, shape, strict=True)):
        raise AclError(
            "aclmdlExecute (simulated)",
            ACL_ERROR_RT_INTERNAL_ERROR,
            f"output '{tensor.name}' has shape {list(shape)}, the model declares {list(dims)}",
        )
