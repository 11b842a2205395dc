#!/usr/bin/env python3
"""Infer on the `simple_string` model over HTTP with tritonclient.http.

The model takes decimal integers as strings (BYTES) and returns their sum and difference
as strings. Sends binary and JSON requests and exits non-zero on a wrong answer.

    python3 examples/clients/simple_string_http.py --url localhost:8000
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
import numpy.typing as npt
import tritonclient.http as httpclient

MODEL = "simple_string"


def to_ints(values: npt.NDArray[Any]) -> list[int]:
    """BYTES outputs come back as bytes (binary) or str (JSON); parse either."""
    return [int(v.decode() if isinstance(v, bytes) else v) for v in values.reshape(-1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-u", "--url", default="localhost:8000", help="host:port, no scheme")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()

    numbers0 = list(range(16))
    numbers1 = [1] * 16
    # BYTES tensors are numpy object arrays of bytes.
    input0 = np.array([str(n).encode() for n in numbers0], dtype=np.object_).reshape(1, 16)
    input1 = np.array([str(n).encode() for n in numbers1], dtype=np.object_).reshape(1, 16)

    ok = True
    client = httpclient.InferenceServerClient(url=args.url, verbose=args.verbose)
    try:
        for binary in (True, False):
            inputs = [
                httpclient.InferInput("INPUT0", list(input0.shape), "BYTES"),
                httpclient.InferInput("INPUT1", list(input1.shape), "BYTES"),
            ]
            inputs[0].set_data_from_numpy(input0, binary_data=binary)
            inputs[1].set_data_from_numpy(input1, binary_data=binary)
            outputs = [
                httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
                httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
            ]
            result = client.infer(MODEL, inputs, outputs=outputs)
            sums = to_ints(result.as_numpy("OUTPUT0"))
            diffs = to_ints(result.as_numpy("OUTPUT1"))
            print(f"[{'binary' if binary else 'JSON'}]")
            for a, b, s, d in zip(numbers0, numbers1, sums, diffs, strict=True):
                print(f'  "{a}" + "{b}" = "{s}"    "{a}" - "{b}" = "{d}"')
            ok &= sums == [a + b for a, b in zip(numbers0, numbers1, strict=True)]
            ok &= diffs == [a - b for a, b in zip(numbers0, numbers1, strict=True)]
    finally:
        client.close()

    print("PASS: simple_string_http" if ok else "FAIL: simple_string_http: wrong results")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
