#!/usr/bin/env python3
"""Classify an image with the `efficientnet` pipeline over HTTP or gRPC.

Build and serve the repository first (examples/efficientnet/build.py), then send an image
file (PNG, JPEG, ...) as it is, one BYTES element; the server decodes, resizes and crops
it. Prints the top-k ImageNet labels with their scores, best first.

    python3 examples/clients/efficientnet_client.py [--protocol http|grpc] [--url HOST:PORT]
                                                   [--top-k K] IMAGE [--expect-top1 WORD]

With --expect-top1, exits 1 unless the best label contains WORD.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

MODEL = "efficientnet"
OUTPUTS = ("labels", "scores", "classes")


def classify(protocol: str, url: str, image: bytes, top_k: int) -> list[tuple[str, float, int]]:
    """(label, score, class index) of the top-k classes the server found."""
    data = np.array([image], dtype=np.object_)
    params = {"top_k": top_k}
    if protocol == "grpc":
        import tritonclient.grpc as grpcclient

        gclient = grpcclient.InferenceServerClient(url=url)
        try:
            tensor = grpcclient.InferInput("image", [1], "BYTES")
            tensor.set_data_from_numpy(data)
            wanted = [grpcclient.InferRequestedOutput(name) for name in OUTPUTS]
            result = gclient.infer(MODEL, [tensor], outputs=wanted, parameters=params)
        finally:
            gclient.close()
    else:
        import tritonclient.http as httpclient

        hclient = httpclient.InferenceServerClient(url=url)
        try:
            htensor = httpclient.InferInput("image", [1], "BYTES")
            htensor.set_data_from_numpy(data, binary_data=True)
            hwanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in OUTPUTS]
            result = hclient.infer(MODEL, [htensor], outputs=hwanted, parameters=params)
        finally:
            hclient.close()
    labels, scores, classes = (result.as_numpy(name) for name in OUTPUTS)
    if labels is None or scores is None or classes is None:
        raise RuntimeError("the response lacks labels, scores or classes")
    return [
        (label.decode("utf-8"), float(score), int(index))
        for label, score, index in zip(labels, scores, classes, strict=True)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("image", type=Path, help="an image file")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("-u", "--url", default=None, help="host:port, no scheme")
    parser.add_argument("-k", "--top-k", type=int, default=5)
    parser.add_argument("--expect-top1", default=None, help="a word the best label holds")
    args = parser.parse_args()
    url = args.url or ("localhost:8001" if args.protocol == "grpc" else "localhost:8000")

    found = classify(args.protocol, url, args.image.read_bytes(), args.top_k)
    for label, score, index in found:
        print(f"{score:.3f}  {index:4d}  {label}")
    if args.expect_top1 is None:
        return 0
    ok = bool(found) and args.expect_top1.lower() in found[0][0].lower()
    best = found[0][0] if found else None
    print(
        "PASS: efficientnet_client"
        if ok
        else f"FAIL: efficientnet_client: expected '{args.expect_top1}' in the top 1, got {best}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
