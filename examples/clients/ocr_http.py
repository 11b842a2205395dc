#!/usr/bin/env python3
"""Read the text in an image with the `ocr` pipeline over HTTP.

Build and serve the repository first (examples/ocr/build.py), then send an image file
(PNG, JPEG, ...) as it is, one BYTES element; the server decodes it. Prints each line
found, in reading order, with its box (x, y corners clockwise from top-left) and score.

    python3 examples/clients/ocr_http.py --url localhost:8000 IMAGE [--expect "TEXT" ...]

With --expect, exits 1 unless exactly these lines come back, in this order.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

MODEL = "ocr"


def read_text(url: str, image: bytes, verbose: bool = False) -> list[tuple[str, float, list[int]]]:
    """(text, score, box as x0 y0 ... x3 y3) for each line the server found."""
    client = httpclient.InferenceServerClient(url=url, verbose=verbose)
    try:
        tensor = httpclient.InferInput("image", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([image], dtype=np.object_), binary_data=True)
        outputs = [
            httpclient.InferRequestedOutput(name, binary_data=True)
            for name in ("boxes", "text", "scores")
        ]
        result = client.infer(MODEL, [tensor], outputs=outputs)
    finally:
        client.close()
    boxes = result.as_numpy("boxes")
    texts = result.as_numpy("text")
    scores = result.as_numpy("scores")
    if boxes is None or texts is None or scores is None:
        raise RuntimeError("the response lacks boxes, text or scores")
    return [
        (text.decode("utf-8"), float(score), [round(float(v)) for v in box.reshape(-1)])
        for box, text, score in zip(boxes, texts, scores, strict=True)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("image", type=Path, help="an image file")
    parser.add_argument("-u", "--url", default="localhost:8000", help="host:port, no scheme")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--expect", action="append", default=[], help="a line to expect")
    args = parser.parse_args()

    lines = read_text(args.url, args.image.read_bytes(), args.verbose)
    for text, score, box in lines:
        print(f"{score:.3f}  {box}  {text}")
    if not args.expect:
        print(f"{len(lines)} line(s)")
        return 0
    found = [text for text, _, _ in lines]
    ok = found == args.expect
    print("PASS: ocr_http" if ok else f"FAIL: ocr_http: expected {args.expect}, got {found}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
