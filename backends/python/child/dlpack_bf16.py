"""BF16 through DLPack, which numpy does not speak for it (it has no kDLBfloat).

A BF16 tensor leaves as its uint16 bits with the capsule's dtype set to kDLBfloat, so
torch and the others read it as bfloat16 (Triton's `to_dlpack` gives the same); a
kDLBfloat capsule coming in is read as uint16 and viewed as ml_dtypes' bfloat16. Only a
legacy, unconsumed `dltensor` capsule (what `__dlpack__()` gives) is handled here.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

_KDL_UINT = 1
_KDL_BFLOAT = 4
_NAME = b"dltensor"


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _Tensor(ctypes.Structure):
    """DLTensor, which a DLManagedTensor starts with."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_pointer.restype = ctypes.c_void_p
_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dtype(capsule: Any) -> _DataType | None:
    if not _is_valid(capsule, _NAME):
        return None
    address = _pointer(capsule, _NAME)
    return None if not address else _Tensor.from_address(address).dtype


def export(array: np.ndarray[Any, Any]) -> Any:
    """A DLPack capsule of a BF16 array, typed kDLBfloat 16."""
    capsule = array.view(np.uint16).__dlpack__()
    dtype = _dtype(capsule)
    if dtype is None:
        raise BufferError("no DLPack capsule for the BF16 tensor")
    dtype.code = _KDL_BFLOAT
    return capsule


def as_uint16(capsule: Any) -> bool:
    """Retype a kDLBfloat 16 capsule as uint16 (numpy can read that); whether it was one."""
    dtype = _dtype(capsule)
    if dtype is None or dtype.code != _KDL_BFLOAT or dtype.bits != 16 or dtype.lanes != 1:
        return False
    dtype.code = _KDL_UINT
    return True
