"""A BF16 `pb_utils.Tensor` as a Python model sees it (qa identity_bf16): DLPack carries
it both ways, typed kDLBfloat 16 as Triton's is, and `as_numpy()` refuses it with
Triton's message."""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

from ge_serve.backends.python.child.pb_tensor import Tensor
from ge_serve.backends.python.child.pb_types import TritonModelException

_VALUES = [[1.5, 2.0], [3.0, -4.0]]


def _bf16() -> Tensor:
    return Tensor("INPUT0", np.array(_VALUES, ml_dtypes.bfloat16))


def _capsule_dtype(capsule: object) -> tuple[int, int, int]:
    """(code, bits, lanes) of a legacy DLPack capsule's DLTensor."""
    pointer = ctypes.pythonapi.PyCapsule_GetPointer
    pointer.restype = ctypes.c_void_p
    pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = pointer(capsule, b"dltensor")
    # DLTensor: data pointer, device (2 x int32), ndim (int32), then the dtype.
    raw = ctypes.string_at(address + ctypes.sizeof(ctypes.c_void_p) + 12, 4)
    return raw[0], raw[1], int.from_bytes(raw[2:4], "little")


def test_a_bf16_tensor_goes_out_through_dlpack_as_kdlbfloat() -> None:
    capsule = _bf16().to_dlpack()
    assert _capsule_dtype(capsule) == (4, 16, 1)  # kDLBfloat, 16 bits, 1 lane


def test_a_bf16_tensor_comes_back_from_dlpack() -> None:
    tensor = _bf16()
    for source in (tensor.to_dlpack(), tensor):
        back = Tensor.from_dlpack("OUTPUT0", source)
        assert back.triton_dtype() == 14  # TYPE_BF16
        assert back.shape() == [2, 2]
        assert back.data().astype(np.float32).tolist() == _VALUES


def test_as_numpy_on_a_bf16_tensor_raises_as_in_triton() -> None:
    with pytest.raises(TritonModelException, match="tensor dtype is bf16 and cannot be "):
        _bf16().as_numpy()
