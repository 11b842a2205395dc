"""Tensor bytes on the link: where they travel, and how they are read back.

`place` puts bytes where the receiver reads them: inside the message when they are at
most `inline_max` bytes, else in a region of the sender's arena (the region is added to
`regions`, for the sender to free once the protocol says the receiver is done). `view`
is the receiver's side: a memoryview of the bytes, in place (a region is not copied).
`array` turns that view into a zero-copy numpy array.

BYTES tensors that travel as bytes use Triton's serialized form: each element a 4-byte
little-endian length and its bytes.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from .arena import EMPTY, Arena, PeerSegments
from .dtypes import NUMPY_OF, triton_of
from .messages import Region

Array = npt.NDArray[Any]
# Tensor bytes as they travel: the bytes themselves, or the region of the sender's arena.
Placed = bytes | Region
_LENGTH = struct.Struct("<I")


class ArenaTensor(msgspec.Struct, array_like=True, frozen=True):
    """A named tensor whose bytes were placed (`write_tensor`)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Placed


def place(arena: Arena, data: memoryview, regions: list[Region], inline_max: int) -> Placed:
    if data.nbytes <= inline_max or data.nbytes == 0:
        return bytes(data)
    region = arena.alloc(data.nbytes)
    seg, offset, size = region
    arena.buffer(seg)[offset : offset + size] = data.cast("B")
    regions.append(region)
    return region


def view(peers: PeerSegments, placed: Placed) -> memoryview:
    if isinstance(placed, bytes):
        return memoryview(placed)
    return peers.view(placed)


def regions_of(tensors: Iterable[ArenaTensor]) -> list[Region]:
    return [t.data for t in tensors if not isinstance(t.data, bytes) and t.data != EMPTY]


def raw_bytes(array: Array) -> memoryview:
    """A fixed-size array's bytes, row-major (a copy only if it is not contiguous)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


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


def write_tensor(
    arena: Arena, name: str, array: Array, regions: list[Region], inline_max: int = 0
) -> ArenaTensor:
    """A tensor's bytes placed (BYTES serialized); its Triton datatype from its dtype."""
    datatype = triton_of(array.dtype)
    shape = tuple(int(d) for d in array.shape)
    bytes_ = datatype == "BYTES"
    data = memoryview(serialize_bytes(array.flat)) if bytes_ else raw_bytes(array)
    return ArenaTensor(name, datatype, shape, place(arena, data, regions, inline_max))


def read_tensor(peers: PeerSegments, tensor: ArenaTensor, copy: bool) -> Array:
    """The tensor's array: a view of the sender's memory unless `copy` (BYTES: always
    decoded into an object array of `bytes`); ValueError when it does not fit its bytes."""
    dtype = NUMPY_OF.get(tensor.datatype)
    if dtype is None:
        raise ValueError(f"unknown datatype {tensor.datatype!r}")
    shape = tensor.shape
    count = math.prod(shape)
    data = view(peers, tensor.data)
    if tensor.datatype == "BYTES":
        return deserialize_bytes(data, count).reshape(shape)
    if count * dtype.itemsize != data.nbytes:
        raise ValueError(
            f"tensor {tensor.name!r} of shape {list(shape)} and type {tensor.datatype} does "
            f"not fit its {data.nbytes} bytes"
        )
    if count == 0:
        return np.empty(shape, dtype=dtype)
    array: Array = np.frombuffer(data, dtype=dtype, count=count).reshape(shape)
    return array.copy() if copy else array
