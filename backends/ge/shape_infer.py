"""Shape inference on an ONNX model, for what a GE model's varying dims make its outputs.

A shape-range model's output buffers are sized at the ranges' maxima (`range_output_max`);
a GE dynamic-shape model's per request (`OutputSizer`); the simulated NPU describes an
OM's outputs at each gear. ONNX's own inference runs first, and onnxruntime's symbolic
inference where ONNX's cannot follow a computed Reshape (paddle2onnx exports). Large
weights are lifted out first (`lighten`), as inference copies the whole model each call.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from pathlib import Path

import onnx

from .shapes import RANGE, Shape, ShapePlan, max_shape


def _fixed_at(model: onnx.ModelProto, inputs: Mapping[str, Shape]) -> onnx.ModelProto:
    """A copy of `model` whose named inputs have these fixed shapes, and whose outputs
    declare no shape, so that only inference says what they are."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        shape = inputs.get(value.name)
        if shape is None:
            continue
        dims = value.type.tensor_type.shape.dim
        del dims[:]
        for d in shape:
            dims.add().dim_value = int(d)
    for value in fixed.graph.output:
        value.type.tensor_type.ClearField("shape")
    return fixed


def _known_outputs(model: onnx.ModelProto) -> dict[str, Shape | None]:
    """Each output's inferred shape, None where a dim (or the rank) is unknown."""
    found: dict[str, Shape | None] = {}
    for value in model.graph.output:
        tensor = value.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        known = tensor.HasField("shape") and all(d >= 0 for d in shape)
        found[value.name] = shape if known else None
    return found


def _symbolic(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """onnxruntime's symbolic shape inference, which follows shapes through
    Shape -> Slice -> Concat -> Reshape chains made of Constant nodes that ONNX's own
    inference (data propagation included) gives up on (exporters such as paddle2onnx
    write flatten and attention reshapes that way); None where it fails too. A missing
    package is not a failure of the model's: the ValueError names the package."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError as exc:
        raise ValueError(
            "this model's output shapes need onnxruntime's symbolic shape inference, which "
            f"needs the '{_missing_module(exc)}' package, not installed here ({exc}); "
            "ge-serve declares it as a dependency: reinstall ge-serve"
        ) from exc
    try:
        inferred: onnx.ModelProto = SymbolicShapeInference.infer_shapes(model, auto_merge=False)
    except Exception:
        return None
    return inferred


def _missing_module(exc: ImportError) -> str:
    """The top-level module an import failed for (onnxruntime re-raises sympy's
    ModuleNotFoundError as a plain ImportError, so the cause chain is searched)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ImportError) and seen.name:
            return seen.name.split(".")[0]
        seen = seen.__cause__ or seen.__context__
    return "sympy" if "sympy" in str(exc) else str(exc)


# Constants above this many elements are only shapes to shape inference (see
# `inference_model`). Smaller ones keep their values, which data propagation reads: a
# Reshape's shape, a Slice's ends, Unsqueeze's axes.
_VALUES_KEPT = 1024


def lighten(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model`, changed in place, as shape inference needs it: its large initializers and
    Constant nodes become graph inputs of the same type and shape. Shape inference copies
    the whole model into C++ and back on every call, weights included, which takes
    seconds for a BERT; a model with several gears is inferred once per gear."""
    graph = model.graph
    declared = {value.name for value in graph.input}
    outputs = {value.name for value in graph.output}

    def as_input(name: str, tensor: onnx.TensorProto) -> None:
        if name not in declared:
            graph.input.append(
                onnx.helper.make_tensor_value_info(name, tensor.data_type, tensor.dims)
            )
            declared.add(name)

    kept = []
    for tensor in graph.initializer:
        if math.prod(tensor.dims) <= _VALUES_KEPT:
            kept.append(tensor)
        else:
            as_input(tensor.name, tensor)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = []
    for node in graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if (
            node.op_type == "Constant"
            and value is not None
            and math.prod(value.dims) > _VALUES_KEPT
            and node.output[0] not in outputs
        ):
            as_input(node.output[0], value)
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def inference_model(path: Path) -> onnx.ModelProto:
    """The ONNX model at `path`, `lighten`ed: load it once to infer it at several shapes."""
    return lighten(onnx.load(str(path), load_external_data=False))


def inferred_model(source: Path | onnx.ModelProto, inputs: Mapping[str, Shape]) -> onnx.ModelProto:
    """The ONNX model at `source` (or an `inference_model`, left unchanged) with these
    input shapes and every shape inference can tell filled in (ONNX's inference first,
    onnxruntime's symbolic inference where that leaves an output unknown)."""
    model = inference_model(source) if isinstance(source, Path) else source
    fixed = _fixed_at(model, inputs)
    inferred = onnx.shape_inference.infer_shapes(fixed, data_prop=True)
    if all(s is not None for s in _known_outputs(inferred).values()):
        return inferred
    symbolic = _symbolic(fixed)
    return symbolic if symbolic is not None else inferred


def infer_output_shapes(
    source: Path | onnx.ModelProto, inputs: Mapping[str, Shape]
) -> dict[str, Shape]:
    """Every output's shape when the ONNX model at `source` (or an `inference_model`)
    runs at these input shapes; a ValueError names an output whose shape no shape
    inference can tell."""
    found: dict[str, Shape] = {}
    for name, shape in _known_outputs(inferred_model(source, inputs)).items():
        if shape is None:
            raise ValueError(
                f"output '{name}' has no shape that shape inference (ONNX's, then "
                f"onnxruntime's symbolic) can tell at inputs {dict(inputs)}; give it fixed "
                "dims in config.pbtxt"
            )
        found[name] = shape
    return found


def range_output_max(path: Path, plan: ShapePlan) -> tuple[tuple[str, Shape], ...]:
    """Each output's shape at the ranges' maxima (shape-range models), to size its device
    buffer; () for other models, or a model file that is not ONNX (a prebuilt OM)."""
    if plan.kind != RANGE or path.suffix.lower() != ".onnx":
        return ()
    model = onnx.load(str(path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    named = {s.name: max_shape(s.ranges) for s in plan.inputs}
    shapes: dict[str, Shape] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        if value.name in named:
            shapes[value.name] = named[value.name]
    return tuple(infer_output_shapes(lighten(model), shapes).items())


class OutputSizer:
    """Each output's shape for a request's input shapes, from shape inference on the ONNX
    model, cached per input shapes: a GE dynamic-shape OM has no maximum to size its
    output buffers for, so the executor sizes them per request (and grows them on demand).
    Thread-safe: every slot of a model shares one."""

    def __init__(self, path: Path, limit: int = 4096) -> None:
        model = onnx.load(str(path), load_external_data=False)
        initializers = {i.name for i in model.graph.initializer}
        self.inputs = tuple(v.name for v in model.graph.input if v.name not in initializers)
        self._model = lighten(model)
        self._cache: dict[tuple[Shape, ...], dict[str, Shape]] = {}
        self._limit = limit
        self._lock = threading.Lock()

    def __call__(self, shapes: Mapping[str, Shape]) -> dict[str, Shape]:
        key = tuple(tuple(shapes[name]) for name in self.inputs if name in shapes)
        with self._lock:
            found = self._cache.get(key)
        if found is not None:
            return found
        found = infer_output_shapes(self._model, dict(shapes))
        with self._lock:
            if len(self._cache) >= self._limit:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = found
        return found
