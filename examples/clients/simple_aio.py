#!/usr/bin/env python3
"""Infer on the `simple` model over HTTP with tritonclient.http.aio (asyncio).

Sends several requests concurrently, prints the first result, and exits non-zero on a
wrong answer.

    python3 examples/clients/simple_aio.py --url localhost:8000
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import numpy as np
import numpy.typing as npt
import tritonclient.http.aio as aiohttpclient

MODEL = "simple"


async def infer_one(
    client: aiohttpclient.InferenceServerClient, offset: int
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], bool]:
    input0 = (np.arange(16, dtype=np.int32) + offset).reshape(1, 16)
    input1 = np.full((1, 16), offset + 1, dtype=np.int32)
    inputs = [
        aiohttpclient.InferInput("INPUT0", list(input0.shape), "INT32"),
        aiohttpclient.InferInput("INPUT1", list(input1.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(input0)
    inputs[1].set_data_from_numpy(input1)
    outputs = [
        aiohttpclient.InferRequestedOutput("OUTPUT0"),
        aiohttpclient.InferRequestedOutput("OUTPUT1"),
    ]
    result = await client.infer(MODEL, inputs, outputs=outputs, request_id=f"aio-{offset}")
    sums = result.as_numpy("OUTPUT0")
    diffs = result.as_numpy("OUTPUT1")
    ok = bool(np.array_equal(sums, input0 + input1) and np.array_equal(diffs, input0 - input1))
    return sums, diffs, ok


async def run(url: str, verbose: bool, requests: int) -> int:
    async with aiohttpclient.InferenceServerClient(url=url, verbose=verbose) as client:
        if not await client.is_server_live() or not await client.is_model_ready(MODEL):
            print(f"server at {url} is not live or {MODEL} is not ready", file=sys.stderr)
            return 1
        results = await asyncio.gather(*(infer_one(client, i) for i in range(requests)))

    sums, diffs, _ = results[0]
    print(f"OUTPUT0 (sum)  = {sums[0].tolist()}")
    print(f"OUTPUT1 (diff) = {diffs[0].tolist()}")
    ok = all(r[2] for r in results)
    print(f"PASS: simple_aio ({requests} requests)" if ok else "FAIL: simple_aio: wrong results")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-u", "--url", default="localhost:8000", help="host:port, no scheme")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-n", "--requests", type=int, default=8, help="concurrent requests")
    args = parser.parse_args()
    return asyncio.run(run(args.url, args.verbose, args.requests))


if __name__ == "__main__":
    sys.exit(main())
