"""Tensor wire layout shared by every front end: raw tensor bytes and length-prefixed BYTES.

Both the HTTP binary tensor extension and gRPC's `raw_input_contents` /
`raw_output_contents` carry a tensor as its row-major, little-endian memory, and a BYTES
tensor as a sequence of elements, each a 4-byte little-endian length and then its bytes.
Little-endian is numpy's native order on every host we run on (x86-64 and aarch64), so
fixed-size tensors travel as their raw memory and decode as zero-copy `np.frombuffer` views.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ..errors import ErrorCode, ServerError, invalid_arg
from . import error_texts
from .error_texts import InputRef
from .types import DataType, Tensor

_U32: Final = struct.Struct("<I")
_U32_MAX: Final = 0xFFFFFFFF

# Text formats (JSON numbers, gRPC typed contents) cannot carry these faithfully, so the
# protocol sends them only as raw bytes.
RAW_ONLY: Final = frozenset({DataType.FP16, DataType.BF16})


# --- BYTES tensors --------------------------------------------------------------------------


def serialize_bytes_tensor(arr: npt.NDArray[Any]) -> bytes:
    """Row-major BYTES elements, each as a 4-byte little-endian length and then its bytes.

    Elements may be `bytes`, `str` (sent as UTF-8) or anything else (sent as `str(x)`).
    """
    items = bytes_elements(arr)
    if not items:
        return b""
    if max(map(len, items)) > _U32_MAX:
        raise ServerError(ErrorCode.INTERNAL, "a BYTES element is larger than 4 GiB")
    parts: list[bytes] = [b""] * (2 * len(items))
    parts[0::2] = [_U32.pack(len(item)) for item in items]
    parts[1::2] = items
    return b"".join(parts)


def deserialize_bytes_tensor(
    buf: bytes | memoryview,
    count: int | None,
    *,
    what: str = "BYTES tensor",
    ref: InputRef | None = None,
) -> npt.NDArray[np.object_]:
    """Parse length-prefixed BYTES elements into a 1-D object array of `bytes`.

    With `count`, the buffer must hold exactly that many elements and nothing more. Errors
    are INVALID_ARG: for a request's input (`ref`) in Triton's words, otherwise prefixed
    with `what`.
    """
    view = memoryview(buf).cast("B")
    size = len(view)
    items: list[bytes] = []
    offset = 0
    while offset < size:
        if count is not None and len(items) == count:
            if ref is not None:
                raise error_texts.too_many_strings(ref, count + 1, count)
            raise invalid_arg(
                f"{what}: unexpected additional BYTES data, {size - offset} bytes after the "
                f"expected {count} elements"
            )
        if offset + 4 > size:
            if ref is not None:
                raise error_texts.incomplete_string_length(ref, size - offset)
            raise invalid_arg(
                f"{what}: BYTES element {len(items)} is truncated: its 4-byte length prefix "
                f"has only {size - offset} bytes left"
            )
        (length,) = _U32.unpack_from(view, offset)
        offset += 4
        end = offset + length
        if end > size:
            where = f"input '{ref.name}'" if ref is not None else what
            raise invalid_arg(
                f"{ref.tag if ref else ''}{where}: BYTES element {len(items)} has length "
                f"{length}, which overruns the buffer ({size - offset} bytes left)"
            )
        items.append(view[offset:end].tobytes())
        offset = end
    if count is not None and len(items) != count:
        if ref is not None:
            raise error_texts.too_few_strings(ref, count, len(items))
        raise invalid_arg(f"{what}: expected {count} BYTES elements, got {len(items)}")
    return object_array(items)


def object_array(items: list[bytes]) -> npt.NDArray[np.object_]:
    """A 1-D object array holding each `bytes` whole (np.array(items) could make 'S')."""
    arr = np.empty(len(items), dtype=np.object_)
    arr[:] = items
    return arr


def bytes_elements(arr: npt.NDArray[Any]) -> list[bytes]:
    """The row-major elements of a BYTES tensor as `bytes`."""
    values: list[Any] = np.asarray(arr).reshape(-1).tolist()
    return [_as_bytes(value) for value in values]


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return str(value).encode("utf-8")


# --- raw tensors ----------------------------------------------------------------------------


def raw_to_array(
    datatype: DataType, shape: tuple[int, ...], buf: bytes | memoryview, ref: InputRef
) -> npt.NDArray[Any]:
    """A request input from its raw wire bytes, shaped; fixed-size types are a zero-copy
    view. The byte count must match the shape exactly (for BYTES: exactly prod(shape)
    elements); errors are INVALID_ARG in Triton's words.
    """
    count = math.prod(shape)
    if datatype is DataType.BYTES:
        return deserialize_bytes_tensor(buf, count, ref=ref).reshape(shape)
    expected = count * datatype.itemsize
    size = memoryview(buf).nbytes
    if size != expected:
        raise error_texts.input_byte_size(ref, expected, size)
    return np.frombuffer(buf, dtype=datatype.numpy).reshape(shape)


def raw_output(tensor: Tensor) -> tuple[bytes | npt.NDArray[Any], int]:
    """A tensor's raw wire bytes and their count, copied only where the array is not them
    already: BYTES serialized; any other the C-contiguous array of its datatype's native
    type, which bytes.join and buffer writes read as its memory."""
    if tensor.datatype is DataType.BYTES:
        chunk = serialize_bytes_tensor(tensor.data)
        return chunk, len(chunk)
    data = tensor.data
    dtype = tensor.datatype.numpy
    if data.dtype != dtype or not data.flags.c_contiguous:
        data = np.ascontiguousarray(data, dtype=dtype)
    return data, data.nbytes


def tensor_to_raw(tensor: Tensor) -> bytes | memoryview:
    """A tensor's raw wire bytes as one flat buffer whose len() is their count."""
    chunk, _ = raw_output(tensor)
    if isinstance(chunk, np.ndarray):
        # A uint8 view, so len() is the byte count and join() copies the memory once.
        return chunk.reshape(-1).view(np.uint8).data
    return chunk
