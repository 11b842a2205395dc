"""`triton_python_backend_utils` (2/5): `Tensor`, a named numpy array.

A request's input tensors are views of the shared memory the server wrote them to, so
reading one copies nothing. Every tensor lives on the CPU here: DLPack goes through
numpy, which speaks it for CPU arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_serve.link.dtypes import NUMPY_OF, triton_of
from ge_serve.link.tensors import Array

from . import dlpack_bf16
from .pb_types import TritonModelException, type_number

# ml_dtypes' bfloat16, where this numpy has it.
_BF16 = NUMPY_OF.get("BF16")


def _is_bf16(dtype: np.dtype[Any]) -> bool:
    return _BF16 is not None and dtype == _BF16


class Tensor:
    def __init__(self, name: str | bytes, data: Any, dtype: Any = None) -> None:
        """`Tensor(name, numpy_array)`; lists and scalars are made into arrays. A str
        array becomes an object array of UTF-8 `bytes` (a BYTES tensor)."""
        if not isinstance(name, str | bytes):
            # Triton's binding takes a str name: pybind11's TypeError for anything else.
            raise TypeError(
                f"Tensor.__init__(): incompatible constructor arguments: name must be a str, "
                f"not {type(name)}"
            )
        if isinstance(name, bytes):
            name = name.decode("utf-8")
        array = np.asarray(data) if dtype is None else np.asarray(data, dtype=dtype)
        if array.dtype.kind in ("U", "S"):
            flat = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.flat]
            converted = np.empty(len(flat), dtype=object)
            converted[:] = flat
            array = converted.reshape(array.shape)
        try:
            triton_of(array.dtype)
        except TypeError as exc:
            raise TritonModelException(f"tensor '{name}': {exc}") from None
        self._name = str(name)
        self._array: Array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> Array:
        if _is_bf16(self._array.dtype):
            # Triton's: numpy has no bf16; DLPack (to_dlpack) carries it.
            raise TritonModelException("tensor dtype is bf16 and cannot be converted to numpy")
        return self._array

    def data(self) -> Array:
        """The array, whatever its type (BF16 as ml_dtypes.bfloat16): for the backend."""
        return self._array

    def triton_dtype(self) -> int:
        """The ModelConfig DataType number (TYPE_FP32 is 11)."""
        return type_number(triton_of(self._array.dtype))

    def shape(self) -> list[int]:
        return [int(d) for d in self._array.shape]

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._array.dtype == np.object_:
            raise TritonModelException(f"BYTES tensor '{self._name}' has no DLPack form")
        if _is_bf16(self._array.dtype):
            return dlpack_bf16.export(self._array)
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU, device 0

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor from a DLPack capsule or any object with `__dlpack__` (CPU memory,
        C-contiguous, as Triton asks)."""
        try:
            if hasattr(capsule, "__dlpack__"):
                capsule = capsule.__dlpack__()
            # numpy has no kDLBfloat: a BF16 tensor is read as uint16, then viewed as one.
            bf16 = dlpack_bf16.as_uint16(capsule)
            array = np.from_dlpack(_Capsule(capsule))
            if bf16 and _BF16 is not None:
                array = array.view(_BF16)
        except (TypeError, RuntimeError, BufferError) as exc:
            raise TritonModelException(f"tensor '{name}' from DLPack: {exc}") from None
        if not array.flags.c_contiguous:
            raise TritonModelException(
                f"tensor '{name}' from DLPack: only C-contiguous tensors are supported"
            )
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


class _Capsule:
    """A bare DLPack capsule, dressed as the object numpy's from_dlpack expects."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)
