"""`triton_python_backend_utils` (1/5): datatypes, errors and flags, as Triton names them.

Triton's python_backend README is the contract for everything a model sees; the names,
values and behaviour here follow it, the code is ours.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_serve.link.dtypes import NUMPY_OF
from ge_serve.link.tensors import deserialize_bytes, serialize_bytes

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2

# ModelConfig's DataType enum, by number.
_TYPE_NUMBERS: dict[int, str] = {
    1: "BOOL",
    2: "UINT8",
    3: "UINT16",
    4: "UINT32",
    5: "UINT64",
    6: "INT8",
    7: "INT16",
    8: "INT32",
    9: "INT64",
    10: "FP16",
    11: "FP32",
    12: "FP64",
    13: "BYTES",
    14: "BF16",
}
_NUMBER_OF = {name: number for number, name in _TYPE_NUMBERS.items()}

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    f"TYPE_{'STRING' if name == 'BYTES' else name}": NUMPY_OF[name].type
    for name in _TYPE_NUMBERS.values()
    if name in NUMPY_OF
}


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """The numpy type of a config datatype name, such as "TYPE_FP32"."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    """The numpy type of a ModelConfig DataType number (TYPE_FP32 is 11); None if none."""
    name = _TYPE_NUMBERS.get(int(data_type))
    return None if name is None or name not in NUMPY_OF else NUMPY_OF[name].type


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The ModelConfig DataType number of a numpy type; object and bytes are TYPE_STRING."""
    dtype = np.dtype(data_type)
    if dtype.kind in ("O", "S", "U"):
        return _NUMBER_OF["BYTES"]
    for name, known in NUMPY_OF.items():
        if known == dtype and name != "BYTES":
            return _NUMBER_OF[name]
    return None


def type_number(datatype: str) -> int:
    return _NUMBER_OF[datatype]


def serialize_byte_tensor(input_tensor: Any) -> Any:
    """A BYTES tensor in Triton's serialized form, as a 1-D uint8 array (None when empty)."""
    array = np.asarray(input_tensor)
    if array.size == 0:
        return None
    raw = serialize_bytes(array.flat)
    return np.frombuffer(raw, dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: Any) -> Any:
    """The elements of Triton's serialized BYTES form, as a 1-D object array of bytes."""
    raw = encoded_tensor.tobytes() if hasattr(encoded_tensor, "tobytes") else encoded_tensor
    return deserialize_bytes(bytes(raw))


class TritonError:
    """An error for one response: a message and one of Triton's error codes."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {code_name(self._code)})"


_CODE_NAMES = {
    TritonError.UNKNOWN: "UNKNOWN",
    TritonError.INTERNAL: "INTERNAL",
    TritonError.NOT_FOUND: "NOT_FOUND",
    TritonError.INVALID_ARG: "INVALID_ARG",
    TritonError.UNAVAILABLE: "UNAVAILABLE",
    TritonError.UNSUPPORTED: "UNSUPPORTED",
    TritonError.ALREADY_EXISTS: "ALREADY_EXISTS",
    TritonError.CANCELLED: "CANCELLED",
}
_CODES = {name: code for code, name in _CODE_NAMES.items()}


def code_name(code: int) -> str:
    return _CODE_NAMES.get(code, "INTERNAL")


def code_of(name: str) -> int:
    return _CODES.get(name, TritonError.INTERNAL)


class TritonModelException(Exception):
    """Raised by a model (or by this module) to fail what it is doing, with a message."""
