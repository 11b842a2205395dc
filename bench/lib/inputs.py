"""Fixed, valid input data for perf_analyzer's `--input-data`.

perf_analyzer's own random data is random bytes: as FP32 that includes NaN and Inf, as INT64
token ids it indexes outside an embedding table. These helpers make one deterministic sample
per input (the shape WITHOUT the batch dimension) and write it as perf_analyzer's JSON or as
its directory of raw files.

    specs = specs_from_config(Path("examples/models/simple/config.pbtxt"))
    arrays = make_sample(specs, seed=0)
    write_json(arrays, Path("bench/.cache/inputs/simple.json"))       # --input-data FILE
    write_directory(arrays, Path("bench/.cache/inputs/simple_dir"))  # --input-data DIR
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.generic]

# Triton datatype names (as the HTTP/gRPC protocol spells them) to numpy dtypes.
NUMPY_DTYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}


@dataclass(frozen=True)
class InputSpec:
    """One model input: Triton datatype ("FP32", "INT32", "BYTES", ...) and the shape of ONE
    sample (no batch dimension). A dimension of -1 is filled with `variable_dim`."""

    name: str
    datatype: str
    shape: tuple[int, ...]


def _strip_type(data_type: str) -> str:
    name = data_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def specs_from_config(path: Path) -> list[InputSpec]:
    """Read a config.pbtxt (or a model folder holding one). Needs explicit inputs; `dims` in a
    Triton config already exclude the batch dimension."""
    from google.protobuf import text_format

    from ge_serve.protos import model_config_pb2

    config_path = path / "config.pbtxt" if path.is_dir() else path
    config = model_config_pb2.ModelConfig()
    text_format.Parse(config_path.read_text(), config)
    if not config.input:
        raise ValueError(f"{config_path} lists no inputs; use specs_from_metadata on the server")
    return [
        InputSpec(
            name=i.name,
            datatype=_strip_type(model_config_pb2.DataType.Name(i.data_type)),
            shape=tuple(int(d) for d in i.dims),
        )
        for i in config.input
    ]


def specs_from_metadata(metadata: Mapping[str, object], batched: bool) -> list[InputSpec]:
    """From the JSON of GET /v2/models/{m} (the server's autocompleted view). `batched`: the
    model has max_batch_size > 0, so the first metadata dimension is the batch."""
    specs: list[InputSpec] = []
    inputs = metadata.get("inputs", [])
    assert isinstance(inputs, list)
    for item in inputs:
        shape = tuple(int(d) for d in item["shape"])
        if batched:
            shape = shape[1:]
        specs.append(InputSpec(item["name"], str(item["datatype"]), shape))
    return specs


def make_array(
    spec: InputSpec,
    rng: np.random.Generator,
    int_high: int = 16,
    variable_dim: int = 8,
    string_length: int = 8,
) -> Array:
    """A valid sample: floats ~ N(0, 1) (no NaN/Inf), integers in [0, int_high) (valid token
    ids for any vocabulary of at least int_high), bools, short ASCII strings for BYTES."""
    shape = tuple(variable_dim if d < 0 else d for d in spec.shape)
    if spec.datatype == "BYTES":
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        flat = [
            "".join(rng.choice(letters, size=string_length)).encode()
            for _ in range(int(np.prod(shape, dtype=np.int64)))
        ]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(shape)
    if spec.datatype == "BF16":
        raise ValueError(f"input {spec.name}: BF16 is not supported by perf_analyzer input data")
    dtype = np.dtype(NUMPY_DTYPES[spec.datatype])
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    return rng.integers(0, int_high, size=shape).astype(dtype)


def make_sample(
    specs: Sequence[InputSpec], seed: int = 0, int_high: int = 16, variable_dim: int = 8
) -> dict[str, Array]:
    rng = np.random.default_rng(seed)
    return {s.name: make_array(s, rng, int_high=int_high, variable_dim=variable_dim) for s in specs}


def _json_entry(array: Array, b64_threshold: int) -> dict[str, object]:
    shape = [int(d) for d in array.shape]
    if array.dtype == np.object_:
        return {"content": [bytes(v).decode() for v in array.ravel().tolist()], "shape": shape}
    if array.size >= b64_threshold:
        raw = np.ascontiguousarray(array).tobytes()
        return {"b64": base64.b64encode(raw).decode("ascii"), "shape": shape}
    return {"content": array.flatten().tolist(), "shape": shape}


def write_json(arrays: Mapping[str, Array], path: Path, b64_threshold: int = 4096) -> Path:
    """perf_analyzer's input JSON: {"data": [{NAME: {"content"|"b64": ..., "shape": [...]}}]}.
    Large numeric tensors go as base64 of the raw little-endian bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"data": [{name: _json_entry(a, b64_threshold) for name, a in arrays.items()}]}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)
    return path


def write_directory(arrays: Mapping[str, Array], path: Path) -> Path:
    """perf_analyzer's directory form: one file per input named like it, holding the raw
    row-major batch-1 bytes (BYTES: one string per line). Shapes with -1 then need --shape."""
    path.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        target = path / name
        if array.dtype == np.object_:
            target.write_bytes(b"\n".join(bytes(v) for v in array.ravel().tolist()))
        else:
            target.write_bytes(np.ascontiguousarray(array).tobytes())
    return path


def input_json_for(
    config: Path, out: Path, seed: int = 0, int_high: int = 16, variable_dim: int = 8
) -> Path:
    """One call: config.pbtxt (or model folder) -> perf_analyzer JSON at `out`."""
    specs = specs_from_config(config)
    return write_json(make_sample(specs, seed, int_high, variable_dim), out)
