"""Dims other than the batch that vary at run time, the three ways GE compiles them.

An OM is compiled for one of atc's mutually exclusive shape modes, and ge-serve follows:

- **batch gears** (`--dynamic_batch_size`): only the batch dim varies (see `options`);
- **ND gears** (`--dynamic_dims` with `--input_format=ND`): `graph.ge.inputShape` names
  -1 dims and `graph.ge.dynamicDims` lists one value per -1 dim in each gear, across all
  inputs in order ("1,128;4,128;8,64" for `input_ids:-1,-1`). At run time pyACL's
  `set_input_dynamic_dims` selects a gear with every input's full dims;
- **image-size gears** (`--dynamic_image_size`, `graph.ge.dynamicImageSize`
  "640,640;960,960"): each input's two -1 dims are its height and width, selected with
  `set_dynamic_hw_size`;
- **shape ranges**: `graph.ge.inputShape` with ranges ("1~8,3,32~1280,32~1280"); each
  execution describes its input shapes with tensor descs and reads the output shapes
  back. Device buffers are sized once for each range's maximum;
- **GE dynamic shape** (npu_ge's default mode): dims other than the batch that vary with
  no gears and no upper bound (`-1` in the config's dims or in `graph.ge.inputShape`).
  atc compiles an OM with -1 dims; each execution describes its input shapes with tensor
  descs and reads the output shapes back, as for ranges. With no maximum to size for,
  device buffers grow on demand: each request's output shapes come from shape inference
  on the ONNX model (`OutputSizer`, cached per input shape).

Gear modes accept only their listed shapes, exactly: the scheduler pads requests up to a
gear (`ShapeBucket`) and an executor refuses anything else, as the NPU does. Ranges accept
any shape inside them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .acl import ModelDesc, TensorPlan

STATIC = "static"
BATCH = "batch"
DIMS = "dims"
HW = "hw"
RANGE = "range"
DYNAMIC = "dynamic"
# Modes whose executions describe their input shapes with tensor descs.
DESCRIBED = (RANGE, DYNAMIC)

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class InputShape:
    """One input of `--input_shape`: its dims (-1 where they vary) and (low, high) per dim
    (equal for a fixed dim; (0, -1) for an unbounded -1, which takes any size)."""

    name: str
    dims: Shape
    ranges: tuple[tuple[int, int], ...]

    @property
    def dynamic(self) -> bool:
        return any(d < 0 for d in self.dims)

    def text(self) -> str:
        parts = []
        for dim, (low, high) in zip(self.dims, self.ranges, strict=True):
            parts.append(f"{low}~{high}" if dim < 0 and high > 0 else str(dim))
        return f"{self.name}:" + ",".join(parts)


@dataclass(frozen=True, slots=True)
class ShapePlan:
    """How a model's dims vary, decided from its config (see the module docstring)."""

    kind: str
    # The inputs `--input_shape` names, in its order; empty for static and batch models.
    inputs: tuple[InputShape, ...] = ()
    # Gear modes: each gear's full shape of every input in `inputs`, smallest first.
    gears: tuple[tuple[Shape, ...], ...] = ()
    # atc flags that compile the mode (without dashes), besides --input_shape.
    atc_flags: tuple[tuple[str, str], ...] = ()

    @property
    def input_shape(self) -> str:
        return ";".join(i.text() for i in self.inputs)


def parse_input_shape(text: str) -> tuple[InputShape, ...]:
    """`name:1,3,-1,-1;mask:1~8,32~512`: dims, -1 or low~high ranges."""
    found: list[InputShape] = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        name, sep, dims_text = part.rpartition(":")
        if not sep or not name.strip():
            raise ValueError(f"graph.ge.inputShape entry '{part}' is not name:dims")
        dims: list[int] = []
        ranges: list[tuple[int, int]] = []
        for item in dims_text.split(","):
            item = item.strip()
            low_text, tilde, high_text = item.partition("~")
            try:
                low = int(low_text)
                high = int(high_text) if tilde else low
            except ValueError:
                raise ValueError(
                    f"graph.ge.inputShape entry '{part}': '{item}' is not a dim, -1 or a "
                    "range low~high"
                ) from None
            if tilde:
                if low < 1 or high < low:
                    raise ValueError(
                        f"graph.ge.inputShape entry '{part}': range '{item}' needs 1 <= low <= high"
                    )
                dims.append(-1)
                ranges.append((low, high))
            elif low == -1:
                dims.append(-1)
                ranges.append((0, -1))  # atc: -1 takes any size, 0 included
            elif low >= 1:
                dims.append(low)
                ranges.append((low, low))
            else:
                raise ValueError(f"graph.ge.inputShape entry '{part}': dim {low} is not valid")
        found.append(InputShape(name.strip(), tuple(dims), tuple(ranges)))
    if not found:
        raise ValueError(f"graph.ge.inputShape '{text}' names no input")
    return tuple(found)


def parse_values(text: str, what: str) -> tuple[tuple[int, ...], ...]:
    """Gears as atc writes them: "1,128;4,128" (values within a gear split by commas)."""
    gears: list[tuple[int, ...]] = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        try:
            values = tuple(int(v) for v in part.split(","))
        except ValueError:
            raise ValueError(f"{what} '{text}': gear '{part}' is not numbers") from None
        if any(v < 1 for v in values):
            raise ValueError(f"{what} '{text}': gear '{part}' has a value below 1")
        gears.append(values)
    if not gears:
        raise ValueError(f"{what} '{text}' names no gear")
    return tuple(gears)


def _config_shapes(
    plans: Sequence[TensorPlan], batching: bool, lead: int
) -> tuple[InputShape, ...]:
    """`--input_shape` from the config's tensors, for a mode whose inputShape is left out."""
    shapes = []
    for plan in plans:
        dims = ((lead,) if batching else ()) + tuple(plan.dims)
        ranges = tuple((0, -1) if d < 0 else (d, d) for d in dims)
        shapes.append(InputShape(plan.name, tuple(-1 if d < 0 else d for d in dims), ranges))
    return tuple(shapes)


def only_batch_varies(shapes: Sequence[InputShape], batching: bool) -> bool:
    """True when every -1 is a batch dim: a batch-gear model, not a shape mode."""
    return batching and all(all(d > 0 for d in s.dims[1:]) for s in shapes)


def plan_shapes(
    options: Mapping[str, str],
    plans: Sequence[TensorPlan],
    batching: bool,
    max_batch_size: int,
) -> ShapePlan:
    """The shape mode a model's GE options ask for (`ge.inputShape`, `ge.dynamicDims`,
    `ge.dynamicImageSize`, unscoped) and the config's tensors allow."""
    shape_text = options.get("ge.inputShape", "").strip()
    dims_text = options.get("ge.dynamicDims", "").strip()
    hw_text = options.get("ge.dynamicImageSize", "").strip()
    if dims_text and hw_text:
        raise ValueError(
            "graph.ge.dynamicDims and graph.ge.dynamicImageSize are mutually exclusive "
            "(atc compiles one dynamic mode per OM)"
        )
    given = parse_input_shape(shape_text) if shape_text else ()
    if hw_text:
        inputs = given or _config_shapes(plans, batching, max(max_batch_size, 1))
        return _hw_plan(inputs, parse_values(hw_text, "graph.ge.dynamicImageSize"))
    if dims_text:
        inputs = given or _config_shapes(plans, batching, -1)
        if not any(s.dynamic for s in inputs):
            return ShapePlan(BATCH if batching else STATIC)
        if only_batch_varies(inputs, batching) and (";" not in dims_text or "," not in dims_text):
            return ShapePlan(BATCH)  # "1;2;4;8" (or "1,2,4,8"): batch gears
        plan = _dims_plan(inputs, parse_values(dims_text, "graph.ge.dynamicDims"))
        if batching:
            for gear in plan.gears:
                if len({shape[0] for shape in gear}) > 1:
                    raise ValueError(
                        f"graph.ge.dynamicDims '{dims_text}' gives the inputs different batch "
                        f"sizes in one gear ({[list(s) for s in gear]}); every input of a "
                        "batching model shares its first dim"
                    )
        return plan
    if any(any(low != high for low, high in s.ranges if high > 0) for s in given):
        return _range_plan(given)
    inputs = given or _config_shapes(plans, batching, -1)
    if not any(s.dynamic for s in inputs) or only_batch_varies(inputs, batching):
        return ShapePlan(BATCH if batching else STATIC)
    if not given and batching and max_batch_size > 0:
        # The batch dim is bounded by max_batch_size even where the others are not.
        inputs = tuple(_bound_batch(s, max_batch_size) for s in inputs)
    return ShapePlan(DYNAMIC, tuple(inputs))


def _bound_batch(shape: InputShape, max_batch_size: int) -> InputShape:
    if not shape.dims or shape.dims[0] >= 0:
        return shape
    return InputShape(shape.name, shape.dims, ((1, max_batch_size), *shape.ranges[1:]))


MODE_NAMES = {
    DIMS: "ND gears",
    HW: "image-size gears",
    RANGE: "shape ranges",
    DYNAMIC: "GE dynamic shape",
}


def describe_mode(plan: ShapePlan, static_loop: bool = False) -> str:
    """Which mode a model runs in and why, for the load log."""
    if static_loop:
        return "static model: a batch-1 graph run once per row (static_model)"
    if plan.kind == DYNAMIC:
        return (
            f"GE dynamic shape ({plan.input_shape}): dims other than the batch vary with no "
            "gears or upper bound; gears (graph.ge.dynamicDims, graph.ge.dynamicImageSize) "
            "or ranges (graph.ge.inputShape low~high) run faster where the shapes are known"
        )
    if plan.kind == RANGE:
        return f"shape ranges ({plan.input_shape}), from graph.ge.inputShape"
    if plan.kind == DIMS:
        return "ND gears, from graph.ge.dynamicDims"
    if plan.kind == HW:
        return "image-size gears, from graph.ge.dynamicImageSize"
    return "fixed shapes" if plan.kind == STATIC else "batch gears"


def _fill(inputs: Sequence[InputShape], values: Sequence[int]) -> tuple[Shape, ...]:
    it = iter(values)
    return tuple(tuple(next(it) if d < 0 else d for d in s.dims) for s in inputs)


def _ordered(gears: Sequence[tuple[Shape, ...]]) -> tuple[tuple[Shape, ...], ...]:
    unique = list(dict.fromkeys(gears))
    return tuple(sorted(unique, key=lambda g: (sum(math.prod(s) for s in g), g)))


def _dims_plan(inputs: Sequence[InputShape], gears: Sequence[tuple[int, ...]]) -> ShapePlan:
    wanted = sum(1 for s in inputs for d in s.dims if d < 0)
    if wanted == 0:
        raise ValueError("graph.ge.dynamicDims needs -1 dims in graph.ge.inputShape")
    for gear in gears:
        if len(gear) != wanted:
            raise ValueError(
                f"graph.ge.dynamicDims gear '{','.join(map(str, gear))}' has {len(gear)} "
                f"value(s); graph.ge.inputShape '{';'.join(s.text() for s in inputs)}' has "
                f"{wanted} -1 dim(s), and each gear gives one value per -1 dim"
            )
    values = ";".join(",".join(str(v) for v in g) for g in gears)
    return ShapePlan(
        DIMS,
        tuple(inputs),
        _ordered([_fill(inputs, g) for g in gears]),
        (("input_format", "ND"), ("dynamic_dims", values)),
    )


def _hw_plan(inputs: Sequence[InputShape], gears: Sequence[tuple[int, ...]]) -> ShapePlan:
    for shape in inputs:
        if shape.dynamic and sum(1 for d in shape.dims if d < 0) != 2:
            raise ValueError(
                f"graph.ge.dynamicImageSize: input '{shape.name}' {list(shape.dims)} must have "
                "exactly two -1 dims, its height and width"
            )
    for gear in gears:
        if len(gear) != 2:
            raise ValueError(
                f"graph.ge.dynamicImageSize gear '{','.join(map(str, gear))}' is not height,width"
            )
    if not any(s.dynamic for s in inputs):
        raise ValueError("graph.ge.dynamicImageSize needs inputs with -1 height and width")
    values = ";".join(f"{h},{w}" for h, w in gears)
    return ShapePlan(
        HW,
        tuple(inputs),
        _ordered([_fill(inputs, (h, w) * len(inputs)) for h, w in gears]),
        (("dynamic_image_size", values),),
    )


def _range_plan(inputs: Sequence[InputShape]) -> ShapePlan:
    """Ranges, or GE dynamic shape where a -1 dim has no upper bound (atc compiles both as
    one dynamic-shape OM; only the buffer sizing differs)."""
    unbounded = any(
        dim < 0 and high < 0
        for shape in inputs
        for dim, (_, high) in zip(shape.dims, shape.ranges, strict=True)
    )
    return ShapePlan(DYNAMIC if unbounded else RANGE, tuple(inputs))


# --- at run time, against what the loaded model reports ---------------------------------


def max_shape(ranges: Sequence[tuple[int, int]]) -> Shape:
    return tuple(high for _, high in ranges)


def gear_index(desc: ModelDesc, shapes: Sequence[Shape]) -> int | None:
    """The gear whose shapes are exactly `shapes` (every data input, in order), if any."""
    wanted = tuple(tuple(s) for s in shapes)
    for index, gear in enumerate(desc.shape_gears):
        if gear == wanted:
            return index
    return None


def gear_values(desc: ModelDesc, index: int) -> tuple[int, ...]:
    """What selects gear `index`: every input's full dims in a row (ND gears), or the
    height and width filling the first dynamic input's -1 dims (image-size gears)."""
    gear = desc.shape_gears[index]
    if desc.shape_kind == DIMS:
        return tuple(d for shape in gear for d in shape)
    for tensor, shape in zip(desc.data_inputs(), gear, strict=True):
        filled = [d for d, own in zip(shape, tensor.dims, strict=True) if own < 0]
        if filled:
            return tuple(filled[:2])
    raise ValueError("the model has no dynamic image size input")


def describe_gears(desc: ModelDesc) -> str:
    names = [t.name for t in desc.data_inputs()]
    return "; ".join(
        ", ".join(f"{n} {list(s)}" for n, s in zip(names, gear, strict=True))
        for gear in desc.shape_gears
    )


def in_range(shape: Shape, ranges: Sequence[tuple[int, int]]) -> bool:
    """Inside the ranges; a high of -1 has no upper bound (GE dynamic shape)."""
    return len(shape) == len(ranges) and all(
        low <= d and (high < 0 or d <= high) for d, (low, high) in zip(shape, ranges, strict=True)
    )


def format_range(ranges: Sequence[tuple[int, int]]) -> str:
    def one(low: int, high: int) -> str:
        if high < 0:
            return "-1" if low <= 1 else f"{low}~-1"
        return str(low) if low == high else f"{low}~{high}"

    return "[" + ", ".join(one(lo, hi) for lo, hi in ranges) + "]"
