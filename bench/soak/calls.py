"""The soak's valid requests (`simple`, `simple_string`) over each wire form, and the checks
of their answers, value for value."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx
import numpy as np
import numpy.typing as npt

from ge_serve.protos import grpc_service_pb2 as pb

HEADER_LENGTH: Final = "Inference-Header-Content-Length"
U32: Final = struct.Struct("<I")
Int32Array = npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True)
class Expected:
    """What a valid request must get back: OUTPUT0 = a + b and OUTPUT1 = a - b."""

    model: str  # "simple" (INT32) or "simple_string" (BYTES holding decimal integers)
    a: Int32Array
    b: Int32Array

    def outputs(self) -> dict[str, Int32Array]:
        return {"OUTPUT0": self.a + self.b, "OUTPUT1": self.a - self.b}


@dataclass(frozen=True, slots=True)
class HttpCall:
    method: str
    path: str
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class GrpcCall:
    rpc: str  # "ModelInfer" or "ModelMetadata"
    request: Any  # pb.ModelInferRequest or pb.ModelMetadataRequest


def random_operands(rng: np.random.Generator, model: str) -> Expected:
    # Batches of 1 mostly, up to simple's max_batch_size of 8; values far from int32's ends.
    batch = int(rng.choice([1, 1, 1, 2, 4, 8]))
    a = rng.integers(-(2**20), 2**20, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-(2**20), 2**20, size=(batch, 16), dtype=np.int32)
    return Expected(model, a, b)


def _wire_type(model: str) -> str:
    return "BYTES" if model == "simple_string" else "INT32"


def _raw(model: str, values: Int32Array) -> bytes:
    if model == "simple_string":
        return b"".join(U32.pack(len(s)) + s for s in (str(int(v)).encode() for v in values.flat))
    return np.ascontiguousarray(values, dtype="<i4").tobytes()


def _json_data(model: str, values: Int32Array) -> list[Any]:
    if model == "simple_string":
        return [str(int(v)) for v in values.flat]
    return [int(v) for v in values.flat]


def http_json_call(expected: Expected) -> HttpCall:
    """A whole-JSON infer: tensors as JSON data, outputs as JSON data."""
    dtype = _wire_type(expected.model)
    document = {
        "inputs": [
            {
                "name": name,
                "shape": list(values.shape),
                "datatype": dtype,
                "data": _json_data(expected.model, values),
            }
            for name, values in (("INPUT0", expected.a), ("INPUT1", expected.b))
        ]
    }
    body = json.dumps(document).encode()
    return HttpCall(
        "POST", f"/v2/models/{expected.model}/infer", body, (("Content-Type", "application/json"),)
    )


def http_binary_call(expected: Expected) -> HttpCall:
    """The binary tensor extension both ways: raw tensors after a JSON header."""
    dtype = _wire_type(expected.model)
    raws = [_raw(expected.model, expected.a), _raw(expected.model, expected.b)]
    header = {
        "inputs": [
            {
                "name": name,
                "shape": list(expected.a.shape),
                "datatype": dtype,
                "parameters": {"binary_data_size": len(raw)},
            }
            for name, raw in zip(("INPUT0", "INPUT1"), raws, strict=True)
        ],
        "outputs": [
            {"name": name, "parameters": {"binary_data": True}} for name in ("OUTPUT0", "OUTPUT1")
        ],
    }
    head = json.dumps(header).encode()
    return HttpCall(
        "POST",
        f"/v2/models/{expected.model}/infer",
        head + b"".join(raws),
        (("Content-Type", "application/octet-stream"), (HEADER_LENGTH, str(len(head)))),
    )


def grpc_infer_request(expected: Expected, typed: bool) -> pb.ModelInferRequest:
    """Raw input contents, or (typed) each tensor in its typed contents field."""
    dtype = _wire_type(expected.model)
    request = pb.ModelInferRequest(model_name=expected.model)
    for name, values in (("INPUT0", expected.a), ("INPUT1", expected.b)):
        tensor = request.inputs.add(name=name, datatype=dtype, shape=list(values.shape))
        if not typed:
            request.raw_input_contents.append(_raw(expected.model, values))
        elif expected.model == "simple_string":
            tensor.contents.bytes_contents.extend(str(int(v)).encode() for v in values.flat)
        else:
            tensor.contents.int_contents.extend(int(v) for v in values.flat)
    return request


def _decode_tensor(datatype: str, shape: Sequence[int], raw: bytes) -> npt.NDArray[Any]:
    count = math.prod(shape)
    if datatype == "INT32":
        if len(raw) != 4 * count:
            raise ValueError(f"{len(raw)} bytes for INT32 shape {list(shape)}")
        return np.frombuffer(raw, dtype="<i4").reshape(tuple(shape))
    if datatype == "BYTES":
        items: list[bytes] = []
        offset = 0
        while offset < len(raw):
            (length,) = U32.unpack_from(raw, offset)
            items.append(raw[offset + 4 : offset + 4 + length])
            offset += 4 + length
        if len(items) != count or offset != len(raw):
            raise ValueError(f"{len(items)} BYTES elements for shape {list(shape)}")
        return np.array(items, dtype=object).reshape(tuple(shape))
    raise ValueError(f"unexpected output datatype {datatype}")


def _compare(expected: Expected, got: dict[str, npt.NDArray[Any]]) -> str | None:
    for name, want in expected.outputs().items():
        if name not in got:
            return f"{expected.model}: no {name} in the response"
        value = got[name]
        if value.shape != want.shape:
            return f"{expected.model}: {name} has shape {list(value.shape)}, not {list(want.shape)}"
        if expected.model == "simple_string":
            try:
                value = np.array([int(bytes(v)) for v in value.flat]).reshape(value.shape)
            except ValueError:
                return f"{expected.model}: {name} holds something other than integers"
        if not np.array_equal(value, want):
            return f"{expected.model}: {name} has wrong values"
    return None


def check_http_answer(
    expected: Expected, status: int, headers: httpx.Headers | dict[str, str], body: bytes
) -> str | None:
    """None when the answer is a 200 with the right outputs, else what is wrong."""
    if status != 200:
        return f"HTTP {status}: {body[:200]!r}"
    try:
        length_text = headers.get(HEADER_LENGTH) or headers.get(HEADER_LENGTH.lower())
        length = int(length_text) if length_text is not None else len(body)
        document = json.loads(body[:length])
        binary = body[length:]
        got: dict[str, npt.NDArray[Any]] = {}
        offset = 0
        for entry in document["outputs"]:
            shape = [int(d) for d in entry["shape"]]
            size = entry.get("parameters", {}).get("binary_data_size")
            if size is not None:
                got[entry["name"]] = _decode_tensor(
                    entry["datatype"], shape, binary[offset : offset + size]
                )
                offset += size
            elif entry["datatype"] == "BYTES":
                items = [str(v).encode() for v in entry["data"]]
                got[entry["name"]] = np.array(items, dtype=object).reshape(shape)
            else:
                got[entry["name"]] = np.array(entry["data"], dtype=np.int64).reshape(shape)
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        return f"unreadable response: {type(exc).__name__}: {exc}"
    return _compare(expected, got)


def check_grpc_answer(expected: Expected, response: pb.ModelInferResponse) -> str | None:
    """None when the response carries the right outputs, else what is wrong."""
    got: dict[str, npt.NDArray[Any]] = {}
    try:
        for index, output in enumerate(response.outputs):
            shape = [int(d) for d in output.shape]
            if index < len(response.raw_output_contents):
                raw = response.raw_output_contents[index]
                got[output.name] = _decode_tensor(output.datatype, shape, raw)
            elif output.datatype == "BYTES":
                items = list(output.contents.bytes_contents)
                got[output.name] = np.array(items, dtype=object).reshape(shape)
            else:
                values = list(output.contents.int_contents)
                got[output.name] = np.array(values, dtype=np.int64).reshape(shape)
    except (ValueError, struct.error) as exc:
        return f"unreadable response: {type(exc).__name__}: {exc}"
    return _compare(expected, got)
