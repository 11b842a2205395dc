#!/usr/bin/env python3
"""Classify images with the `image_classifier` model over HTTP (classification extension).

Requests the top 3 classes per image (`class_count=3`); each result is a BYTES string
"score:index:label", with the label read from the model's labels.txt. The model has
random weights, so the classes are meaningless; the point is the protocol.

    python3 examples/clients/image_classifier_http.py --url localhost:8000 --batch 2
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import numpy.typing as npt
import tritonclient.http as httpclient

MODEL = "image_classifier"
TOP_K = 3


def make_images(batch: int, seed: int) -> npt.NDArray[np.float32]:
    """Random images in [0, 1), NCHW [batch, 3, 64, 64]."""
    images: npt.NDArray[np.float32] = (
        np.random.default_rng(seed).random((batch, 3, 64, 64)).astype(np.float32)
    )
    return images


def parse(entry: bytes | str) -> tuple[float, int, str]:
    text = entry.decode() if isinstance(entry, bytes) else entry
    score, index, label = text.split(":", 2)
    return float(score), int(index), label


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-u", "--url", default="localhost:8000", help="host:port, no scheme")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-b", "--batch", type=int, default=2, help="images per request (<= 8)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    images = make_images(args.batch, args.seed)
    client = httpclient.InferenceServerClient(url=args.url, verbose=args.verbose)
    try:
        inputs = [httpclient.InferInput("image", list(images.shape), "FP32")]
        inputs[0].set_data_from_numpy(images, binary_data=True)
        outputs = [httpclient.InferRequestedOutput("probabilities", class_count=TOP_K)]
        result = client.infer(MODEL, inputs, outputs=outputs)
        top = result.as_numpy("probabilities")
    finally:
        client.close()

    ok = top is not None and top.shape == (args.batch, TOP_K)
    if top is not None:
        for i, row in enumerate(top):
            entries = [parse(e) for e in row]
            print(f"image {i}:")
            for score, index, label in entries:
                print(f"  {score:.4f}  class {index}  {label}")
            scores = [e[0] for e in entries]
            ok &= scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
            ok &= all(label and 0 <= index < 10 for _, index, label in entries)
    print("PASS: image_classifier_http" if ok else "FAIL: image_classifier_http: bad result")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
