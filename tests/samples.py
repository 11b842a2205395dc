"""One sample array per datatype, with its edge values, for the codec tests."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

from ge_serve.server.inference.types import DataType

SAMPLES: dict[DataType, npt.NDArray[Any]] = {
    DataType.BOOL: np.array([[True, False, True], [False, False, True]]),
    DataType.UINT8: np.array([[0, 1, 255], [7, 8, 9]], dtype=np.uint8),
    DataType.UINT16: np.array([[0, 1, 65535], [7, 8, 9]], dtype=np.uint16),
    DataType.UINT32: np.array([[0, 1, 2**32 - 1], [7, 8, 9]], dtype=np.uint32),
    DataType.UINT64: np.array([[0, 1, 2**64 - 1], [7, 8, 9]], dtype=np.uint64),
    DataType.INT8: np.array([[-128, 0, 127], [7, -8, 9]], dtype=np.int8),
    DataType.INT16: np.array([[-32768, 0, 32767], [7, -8, 9]], dtype=np.int16),
    DataType.INT32: np.array([[-(2**31), 0, 2**31 - 1], [7, -8, 9]], dtype=np.int32),
    DataType.INT64: np.array([[-(2**63), 0, 2**63 - 1], [7, -8, 9]], dtype=np.int64),
    DataType.FP16: np.array([[0.5, -1.25, 65504.0], [1e-3, 2, 3]], dtype=np.float16),
    DataType.FP32: np.array([[0.1, -1.5, 3.4e38], [1e-30, 2, 3]], dtype=np.float32),
    DataType.FP64: np.array([[0.1, -1.5, 1e300], [5e-324, 2, 3]], dtype=np.float64),
    DataType.BF16: np.array([[0.5, -1.25, 3.0e38], [1e-3, 2, 3]], dtype=ml_dtypes.bfloat16),
    DataType.BYTES: np.array(
        [[b"", b"hello", "héllo wörld ✓".encode()], [b"\x00\x01", b"", b"z" * 300]],
        dtype=np.object_,
    ),
}
