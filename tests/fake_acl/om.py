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

import onnx

FORMAT = "fake-om/1"

# ONNX element type -> aclDataType
ONNX_TO_ACL = {
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
        "onnx_b64": base64.b64encode(model_path.read_bytes()).decode(),
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


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        raise ValueError("not a fake OM")
    return data
