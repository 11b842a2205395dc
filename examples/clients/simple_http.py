#!/usr/bin/env python3
"""Infer on the `simple` model over HTTP with tritonclient.http (synchronous).

Sends the same request twice, once with binary tensors and once with JSON tensors,
prints INPUT0 + INPUT1 and INPUT0 - INPUT1, and exits non-zero on a wrong answer.

    python3 examples/clients/simple_http.py --url localhost:8000
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import numpy.typing as npt
import tritonclient.http as httpclient

MODEL = "simple"


def infer(
    client: httpclient.InferenceServerClient,
    input0: npt.NDArray[np.int32],
    input1: npt.NDArray[np.int32],
    binary: bool,
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    inputs = [
        httpclient.InferInput("INPUT0", list(input0.shape), "INT32"),
        httpclient.InferInput("INPUT1", list(input1.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(input0, binary_data=binary)
    inputs[1].set_data_from_numpy(input1, binary_data=binary)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = client.infer(MODEL, inputs, outputs=outputs, request_id="simple_http")
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-u", "--url", default="localhost:8000", help="host:port, no scheme")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()

    client = httpclient.InferenceServerClient(url=args.url, verbose=args.verbose)
    try:
        if not client.is_server_live() or not client.is_model_ready(MODEL):
            print(f"server at {args.url} is not live or {MODEL} is not ready", file=sys.stderr)
            return 1

        input0 = np.arange(16, dtype=np.int32).reshape(1, 16)
        input1 = np.ones((1, 16), dtype=np.int32)
        ok = True
        for binary in (True, False):
            sums, diffs = infer(client, input0, input1, binary)
            kind = "binary" if binary else "JSON"
            print(f"[{kind}]")
            for a, b, s, d in zip(input0[0], input1[0], sums[0], diffs[0], strict=True):
                print(f"  {a} + {b} = {s}    {a} - {b} = {d}")
            ok &= np.array_equal(sums, input0 + input1) and np.array_equal(diffs, input0 - input1)
    finally:
        client.close()

    print("PASS: simple_http" if ok else "FAIL: simple_http: wrong results")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
