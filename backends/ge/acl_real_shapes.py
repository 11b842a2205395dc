"""Reading how a loaded OM's dims vary, through pyACL (for `acl_real.AclReal`).

An OM says which of atc's shape modes it was compiled for:
- ND gears: `acl.mdl.get_input_dynamic_gear_count(desc, -1)` gears, each read by
  `acl.mdl.get_input_dynamic_dims(desc, -1, count)` as every input's full dims in a row
  (the gear input `ascend_mbatch_shape_data` excluded), split here per input;
- image-size gears: `acl.mdl.get_dynamic_hw(desc, -1)`, (height, width) per gear, which
  fill each input's two -1 dims;
- shape ranges: -1 dims and no gears; `acl.mdl.get_input_dims_range(desc, i)` gives each
  input's (low, high) per dim;
- GE dynamic shape: the same, with a high of -1 where a dim has no upper bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .acl import AclError, TensorDesc
from .shapes import DIMS, DYNAMIC, HW, RANGE, Shape


def _value(result: Any, call: str) -> Any:
    if not isinstance(result, tuple) or len(result) != 2:
        raise AclError(call, -1, f"expected a (value, ret) pair, got {result!r}")
    got, ret = result
    if int(ret) != 0:
        raise AclError(call, int(ret))
    return got


@dataclass(frozen=True, slots=True)
class ReadShapes:
    kind: str = ""
    # ND gears: each gear's dims in a row; image-size gears: (height, width) per gear.
    rows: tuple[tuple[int, ...], ...] = ()
    ranges: tuple[tuple[tuple[int, int], ...], ...] = ()

    def gears(
        self, inputs: Sequence[TensorDesc], dynamic_index: int | None
    ) -> tuple[tuple[Shape, ...], ...]:
        """Each gear's full shape of every data input, in input order."""
        data = [t for t in inputs if t.index != dynamic_index]
        found = []
        for row in self.rows:
            if self.kind == DIMS:
                shapes, at = [], 0
                for tensor in data:
                    shapes.append(tuple(row[at : at + len(tensor.dims)]))
                    at += len(tensor.dims)
                if at != len(row):
                    raise AclError(
                        "acl.mdl.get_input_dynamic_dims",
                        -1,
                        f"a gear has {len(row)} dims, the inputs have {at}",
                    )
            else:
                shapes = []
                for tensor in data:
                    values = iter(row)
                    shapes.append(tuple(next(values) if d < 0 else d for d in tensor.dims))
            found.append(tuple(shapes))
        return tuple(found)


def read_shapes(
    acl: Any, desc: Any, inputs: Sequence[TensorDesc], dynamic_name: str, batch_gears: bool
) -> ReadShapes:
    """How the OM's dims vary; nothing to read for a batch-gear OM (the modes exclude
    each other)."""
    if batch_gears:
        return ReadShapes()
    mdl = acl.mdl
    count = int(
        _value(mdl.get_input_dynamic_gear_count(desc, -1), "acl.mdl.get_input_dynamic_gear_count")
    )
    if count > 0:
        found = _value(
            mdl.get_input_dynamic_dims(desc, -1, count), "acl.mdl.get_input_dynamic_dims"
        )
        rows = tuple(
            tuple(int(d) for d in list(gear["dims"])[: int(gear["dimCount"])])
            for gear in list(found)[:count]
        )
        return ReadShapes(DIMS, rows)
    hw = _value(mdl.get_dynamic_hw(desc, -1), "acl.mdl.get_dynamic_hw")
    hw_count = int(hw.get("hwCount", 0))
    if hw_count > 0:
        rows = tuple((int(h), int(w)) for h, w in list(hw["hw"])[:hw_count])
        return ReadShapes(HW, rows)
    data = [t for t in inputs if t.name != dynamic_name]
    if not any(d < 0 for t in data for d in t.dims):
        return ReadShapes()
    ranges: list[tuple[tuple[int, int], ...]] = []
    for tensor in data:
        got = _value(mdl.get_input_dims_range(desc, tensor.index), "acl.mdl.get_input_dims_range")
        listed = list(got["range"])[: int(got["rangeCount"])]
        ranges.append(tuple((int(low), int(high)) for low, high in listed))
    for tensor, pairs in zip(data, ranges, strict=True):
        if len(pairs) != len(tensor.dims):
            raise AclError(
                "acl.mdl.get_input_dims_range",
                -1,
                f"input '{tensor.name}' {list(tensor.dims)} reports ranges {pairs}, not one "
                "per dim",
            )
    unbounded = any(high < 0 for pairs in ranges for _, high in pairs)
    return ReadShapes(DYNAMIC if unbounded else RANGE, (), tuple(ranges))
