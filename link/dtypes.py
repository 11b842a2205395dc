"""Triton's tensor datatypes and their numpy dtypes: the one table.

The server's `DataType` (server/types.py), the Python model's `pb_utils` and the link's
tensor code all read it. BF16 comes from ml_dtypes; a model's execution environment may
bring a numpy that ml_dtypes was not built for, and then BF16 is simply not offered there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
try:
    import ml_dtypes

    NUMPY_OF["BF16"] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - an environment without a working ml_dtypes
    pass

# Fixed-size dtypes back to their Triton names (BYTES has no one numpy dtype).
TRITON_OF: dict[np.dtype[Any], str] = {
    dtype: name for name, dtype in NUMPY_OF.items() if name != "BYTES"
}


def triton_of(dtype: np.dtype[Any]) -> str:
    """The Triton datatype of a numpy dtype; object, bytes and str arrays are BYTES."""
    found = TRITON_OF.get(dtype)
    if found is not None:
        return found
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    raise TypeError(f"numpy dtype {dtype} has no Triton datatype")
