"""The fake OM format: what the fake `atc` writes and the fake `acl` loads.

A fake OM is JSON: the SoC it was built for, the source ONNX (base64), and the tensor
descriptions `atc` would give the OM (input shapes from --input_shape, gears from
--dynamic_batch_size). The fake acl runs the ONNX with onnxruntime.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx

FORMAT = "fake-om/1"
_ACL_NUMPY = {
    0: np.float32, 1: np.float16, 2: np.int8, 3: np.int32, 4: np.uint8, 6: np.int16,
    7: np.uint16, 8: np.uint32, 9: np.int64, 10: np.uint64, 11: np.float64, 12: np.bool_,
}  # fmt: skip

# ONNX element type -> aclDataType
ONNX_TO_ACL: dict[int, int] = {
    onnx.TensorProto.FLOAT: 0,
    onnx.TensorProto.FLOAT16: 1,
    onnx.TensorProto.INT8: 2,
    onnx.TensorProto.INT32: 3,
    onnx.TensorProto.UINT8: 4,
    onnx.TensorProto.INT16: 6,
    onnx.TensorProto.UINT16: 7,
    onnx.TensorProto.UINT32: 8,
    onnx.TensorProto.INT64: 9,
    onnx.TensorProto.UINT64: 10,
    onnx.TensorProto.DOUBLE: 11,
    onnx.TensorProto.BOOL: 12,
}


class BuildError(ValueError):
    pass


def parse_input_shape(text: str) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        name, sep, dims = part.rpartition(":")
        if not sep or not name:
            raise BuildError(f"--input_shape entry '{part}' is not name:dims")
        try:
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise BuildError(
                f"--input_shape entry '{part}' has a dim that is not a number"
            ) from None
    return shapes


def _graph_dims(value: onnx.ValueInfoProto) -> list[int]:
    return [
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1
        for d in value.type.tensor_type.shape.dim
    ]


def _ranged(text: str) -> dict[str, list[tuple[int, int]]]:
    """--input_shape with ranges: name -> (low, high) per dim (fixed: d,d; -1: 1,-1)."""
    found: dict[str, list[tuple[int, int]]] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        name, _, dims = part.rpartition(":")
        pairs = []
        for item in dims.split(","):
            if "~" in item:
                low, high = item.split("~")
                pairs.append((int(low), int(high)))
            elif int(item) == -1:
                pairs.append((0, -1))
            else:
                pairs.append((int(item), int(item)))
        found[name] = pairs
    return found


def build_shaped(
    model_path: Path, soc_version: str, flags: dict[str, str], framework: int
) -> dict[str, Any]:
    """An OM with ND gears (--dynamic_dims), image-size gears (--dynamic_image_size) or
    shape ranges (~ or -1 in --input_shape), checked as atc checks them."""
    model = onnx.load(str(model_path))
    initializers = {i.name for i in model.graph.initializer}
    graph_inputs = [v for v in model.graph.input if v.name not in initializers]
    text = flags.get("input_shape", "")
    if not text:
        raise BuildError("dynamic dims, image sizes and ranges need --input_shape")
    ranges = _ranged(text)
    unknown = set(ranges) - {v.name for v in graph_inputs}
    if unknown:
        raise BuildError(f"--input_shape names {sorted(unknown)}, which are not model inputs")
    per_input = []
    for value in graph_inputs:
        pairs = ranges.get(value.name) or [(d, d) for d in _graph_dims(value)]
        if any(low < 0 for low, _ in pairs):
            raise BuildError(f"input '{value.name}' has unknown dims; set --input_shape")
        per_input.append(pairs)
    dynamic = [[i for i, (lo, hi) in enumerate(p) if lo != hi] for p in per_input]
    shape: dict[str, Any]
    if "dynamic_dims" in flags:
        if flags.get("input_format") != "ND":
            raise BuildError("--dynamic_dims needs --input_format=ND")
        count = sum(len(d) for d in dynamic)
        gears = [[int(v) for v in g.split(",")] for g in flags["dynamic_dims"].split(";") if g]
        if any(len(g) != count for g in gears):
            raise BuildError(f"each --dynamic_dims gear needs {count} values")
        full = []
        for gear in gears:
            it = iter(gear)
            full.append([[next(it) if lo != hi else lo for lo, hi in p] for p in per_input])
        shape = {"mode": "dims", "gears": gears, "full": full}
    elif "dynamic_image_size" in flags:
        if any(len(d) not in (0, 2) for d in dynamic):
            raise BuildError("--dynamic_image_size needs -1 at H and W of the inputs")
        gears = [[int(v) for v in g.split(",")] for g in flags["dynamic_image_size"].split(";")]
        if any(len(g) != 2 for g in gears):
            raise BuildError("--dynamic_image_size gears are height,width")
        full = []
        for height, width in gears:
            shapes = []
            for pairs, where in zip(per_input, dynamic, strict=True):
                values = iter((height, width))
                shapes.append(
                    [next(values) if i in where else lo for i, (lo, _) in enumerate(pairs)]
                )
            full.append(shapes)
        shape = {"mode": "hw", "gears": gears, "full": full}
    else:
        shape = {"mode": "range", "ranges": [[list(r) for r in p] for p in per_input]}
    inputs = []
    for value, pairs in zip(graph_inputs, per_input, strict=True):
        inputs.append(_tensor(value, [lo if lo == hi else -1 for lo, hi in pairs]))
    outputs = [_tensor(value, _graph_dims(value)) for value in model.graph.output]
    return {
        "format": FORMAT,
        "soc_version": soc_version,
        "framework": framework,
        # atc bakes the weights into the OM, external data included.
        "onnx_b64": base64.b64encode(model.SerializeToString()).decode(),
        "inputs": inputs,
        "outputs": outputs,
        "gears": [],
        "shape": shape,
    }


def shaped_tensors(data: dict[str, Any], session: Any) -> tuple[list[Any], list[Any]]:
    """Input and output descriptions of a shaped OM with the sizes pyACL reports: the
    largest gear's (found by running each gear), or 0 for ranges."""
    shape = data["shape"]
    inputs = [dict(t) for t in data["inputs"]]
    outputs = [dict(t) for t in data["outputs"]]
    if shape["mode"] == "range":
        for entry in inputs + outputs:
            entry["size"] = 0
        return inputs, outputs
    in_sizes = [0] * len(inputs)
    out_shapes: list[list[list[int]]] = []
    for gear in shape["full"]:
        feeds = {}
        for index, (entry, dims) in enumerate(zip(inputs, gear, strict=True)):
            dtype = np.dtype(_ACL_NUMPY[entry["dtype"]])
            feeds[entry["name"]] = np.zeros(dims, dtype=dtype)
            in_sizes[index] = max(in_sizes[index], int(np.prod(dims)) * dtype.itemsize)
        results = session.run([t["name"] for t in outputs], feeds)
        out_shapes.append([list(np.shape(r)) for r in results])
    for index, entry in enumerate(inputs):
        entry["size"] = in_sizes[index]
    for index, entry in enumerate(outputs):
        shapes = [gear[index] for gear in out_shapes]
        itemsize = np.dtype(_ACL_NUMPY[entry["dtype"]]).itemsize
        entry["size"] = max(int(np.prod(s)) for s in shapes) * itemsize
        entry["dims"] = [
            d if all(s[i] == d for s in shapes) else -1 for i, d in enumerate(shapes[0])
        ]
    return inputs, outputs


def build(
    model_path: Path, soc_version: str, input_shape: str, gears: list[int], framework: int
) -> dict[str, Any]:
    """Describe the OM that atc would make, or raise BuildError as atc would fail."""
    if framework == 3:
        return {
            "format": FORMAT,
            "soc_version": soc_version,
            "framework": 3,
            "onnx_b64": None,
            "inputs": [],
            "outputs": [],
            "gears": gears,
        }
    model = onnx.load(str(model_path))
    initializers = {i.name for i in model.graph.initializer}
    graph_inputs = [v for v in model.graph.input if v.name not in initializers]
    given = parse_input_shape(input_shape) if input_shape else {}
    unknown = set(given) - {v.name for v in graph_inputs}
    if unknown:
        raise BuildError(f"--input_shape names {sorted(unknown)}, which are not model inputs")
    if gears and len(gears) < 2:
        raise BuildError("--dynamic_batch_size needs at least two gears")
    inputs = []
    for value in graph_inputs:
        dims = given.get(value.name, _graph_dims(value))
        if gears:
            if not dims or dims[0] != -1:
                raise BuildError(
                    f"--dynamic_batch_size needs -1 as the first dim of input '{value.name}'"
                )
            if any(d < 0 for d in dims[1:]):
                raise BuildError(f"input '{value.name}' has unknown dims {dims}")
        elif any(d < 0 for d in dims):
            raise BuildError(f"input '{value.name}' has dynamic dims {dims}; set --input_shape")
        inputs.append(_tensor(value, dims))
    batch = -1 if gears else (inputs[0]["dims"][0] if inputs and inputs[0]["dims"] else 1)
    outputs = []
    for value in model.graph.output:
        dims = _graph_dims(value)
        if dims and dims[0] < 0:
            dims = [batch, *dims[1:]]
        if any(d < 0 for d in dims[1:]):
            raise BuildError(f"output '{value.name}' has unknown dims {dims}")
        outputs.append(_tensor(value, dims))
    return {
        "format": FORMAT,
        "soc_version": soc_version,
        "framework": framework,
        # atc bakes the weights into the OM, external data included.
        "onnx_b64": base64.b64encode(model.SerializeToString()).decode(),
        "inputs": inputs,
        "outputs": outputs,
        "gears": sorted(gears),
    }


def _tensor(value: onnx.ValueInfoProto, dims: list[int]) -> dict[str, Any]:
    elem = value.type.tensor_type.elem_type
    if elem not in ONNX_TO_ACL:
        raise BuildError(f"tensor '{value.name}' has an element type atc does not support")
    return {"name": value.name, "dtype": ONNX_TO_ACL[elem], "dims": dims}


def write(om: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(om))


def read_path(path: str) -> dict[str, Any]:
    return read(Path(path))


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        raise ValueError("not a fake OM")
    return data
