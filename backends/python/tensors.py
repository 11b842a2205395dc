"""Tensors in shared memory: how one is written into an arena and read back.

A tensor travels as a descriptor `(name, datatype, shape, region)`, with the datatype by
its Triton name. Fixed-size types are their raw bytes, row-major. BYTES tensors are in
Triton's serialized form: each element a 4-byte little-endian length and its bytes.

Reading fixed-size data gives a numpy view of the shared memory (zero-copy) or a copy;
BYTES are always decoded into an object array of `bytes`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from .shm import EMPTY, Arena, PeerSegments, Region

_BF16: np.dtype[Any] | None
try:  # a model's execution environment may bring a numpy that ml_dtypes was not built for
    import ml_dtypes

    _BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - then BF16 tensors are not available
    _BF16 = None


Array = npt.NDArray[Any]
# (name, Triton datatype, shape, region)
TensorDesc = tuple[str, str, tuple[int, ...], Region]

NUMPY_OF: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
if _BF16 is not None:
    NUMPY_OF["BF16"] = _BF16
_TRITON_OF: dict[np.dtype[Any], str] = {
    dtype: name for name, dtype in NUMPY_OF.items() if name != "BYTES"
}
_LENGTH = struct.Struct("<I")


def datatype_of(array: Array) -> str:
    """The Triton datatype of a numpy array; object, bytes and str arrays are BYTES."""
    found = _TRITON_OF.get(array.dtype)
    if found is not None:
        return found
    if array.dtype.kind in ("O", "S", "U"):
        return "BYTES"
    raise TypeError(f"numpy dtype {array.dtype} has no Triton datatype")


def _element_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, np.bytes_ | bytearray | memoryview):
        return bytes(value)
    return str(value).encode("utf-8")


def serialize_bytes(values: Iterable[Any]) -> bytes:
    """Triton's serialized form of BYTES elements (str is written as UTF-8)."""
    parts: list[bytes] = []
    for value in values:
        raw = _element_bytes(value)
        parts.append(_LENGTH.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def deserialize_bytes(raw: bytes | memoryview, count: int | None = None) -> Array:
    """A 1-D object array of `bytes` from Triton's serialized form; ValueError when the
    data does not hold `count` whole elements (or ends mid-element)."""
    values: list[bytes] = []
    offset = 0
    size = len(raw)
    while offset < size and (count is None or len(values) < count):
        if offset + 4 > size:
            raise ValueError("serialized BYTES data ends inside an element's length")
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + length > size:
            raise ValueError("serialized BYTES data ends inside an element")
        values.append(bytes(raw[offset : offset + length]))
        offset += length
    if count is not None and len(values) != count:
        raise ValueError(f"serialized BYTES data holds {len(values)} elements, not {count}")
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def write_tensor(arena: Arena, name: str, array: Array) -> TensorDesc:
    datatype = datatype_of(array)
    shape = tuple(int(d) for d in array.shape)
    if datatype == "BYTES":
        raw = serialize_bytes(array.flat)
        region = arena.alloc(len(raw))
        if region != EMPTY:
            seg, offset, nbytes = region
            arena.buffer(seg)[offset : offset + nbytes] = raw
        return (name, datatype, shape, region)
    region = arena.alloc(array.nbytes)
    if region != EMPTY:
        seg, offset, _ = region
        target: Array = np.ndarray(shape, array.dtype, buffer=arena.buffer(seg), offset=offset)
        np.copyto(target, array, casting="no")
    return (name, datatype, shape, region)


def read_tensor(peers: PeerSegments, desc: TensorDesc, copy: bool) -> Array:
    """The tensor a descriptor names: a view of the shared memory unless `copy`."""
    _name, datatype, shape, region = desc
    dtype = NUMPY_OF.get(datatype)
    if dtype is None:
        raise ValueError(f"unknown datatype {datatype!r}")
    count = math.prod(shape)
    if datatype == "BYTES":
        return deserialize_bytes(peers.view(region), count).reshape(shape)
    if count * dtype.itemsize != region[2]:
        raise ValueError(
            f"tensor {_name!r} of shape {list(shape)} and type {datatype} does not fit its "
            f"{region[2]} bytes"
        )
    if count == 0:
        return np.empty(shape, dtype=dtype)
    array: Array = np.frombuffer(peers.view(region), dtype=dtype, count=count).reshape(shape)
    return array.copy() if copy else array
