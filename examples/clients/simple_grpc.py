#!/usr/bin/env python3
"""Infer on the `simple` model over gRPC with tritonclient.grpc.

Prints INPUT0 + INPUT1 and INPUT0 - INPUT1 and exits non-zero on a wrong answer.

    python3 examples/clients/simple_grpc.py --url localhost:8001
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import tritonclient.grpc as grpcclient

MODEL = "simple"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-u", "--url", default="localhost:8001", help="host:port, no scheme")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()

    client = grpcclient.InferenceServerClient(url=args.url, verbose=args.verbose)
    try:
        if not client.is_server_live() or not client.is_model_ready(MODEL):
            print(f"server at {args.url} is not live or {MODEL} is not ready", file=sys.stderr)
            return 1

        metadata = client.get_model_metadata(MODEL)
        print(f"model {metadata.name} versions={list(metadata.versions)}")

        input0 = np.arange(16, dtype=np.int32).reshape(1, 16)
        input1 = np.ones((1, 16), dtype=np.int32)
        inputs = [
            grpcclient.InferInput("INPUT0", list(input0.shape), "INT32"),
            grpcclient.InferInput("INPUT1", list(input1.shape), "INT32"),
        ]
        inputs[0].set_data_from_numpy(input0)
        inputs[1].set_data_from_numpy(input1)
        outputs = [
            grpcclient.InferRequestedOutput("OUTPUT0"),
            grpcclient.InferRequestedOutput("OUTPUT1"),
        ]
        result = client.infer(MODEL, inputs, outputs=outputs, request_id="simple_grpc")
        sums = result.as_numpy("OUTPUT0")
        diffs = result.as_numpy("OUTPUT1")
    finally:
        client.close()

    for a, b, s, d in zip(input0[0], input1[0], sums[0], diffs[0], strict=True):
        print(f"  {a} + {b} = {s}    {a} - {b} = {d}")
    ok = np.array_equal(sums, input0 + input1) and np.array_equal(diffs, input0 - input1)
    print("PASS: simple_grpc" if ok else "FAIL: simple_grpc: wrong results")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
