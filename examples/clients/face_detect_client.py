#!/usr/bin/env python3
"""Find faces in an image with the `face_detect` pipeline (MTCNN) over HTTP or gRPC.

Build and serve the repository first (examples/face_detect/build.py), then send an image
file (PNG, JPEG, ...) as it is, one BYTES element. Prints each face's box (x1, y1, x2,
y2), score and five landmarks (eyes, nose, mouth corners); --draw writes a copy of the
image with them drawn in.

    python3 examples/clients/face_detect_client.py [--protocol http|grpc] [--url HOST:PORT]
                                                  IMAGE [--draw OUT.png] [--expect-faces N]

With --expect-faces, exits 1 unless exactly N faces come back.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

MODEL = "face_detect"
OUTPUTS = ("boxes", "scores", "landmarks")


def detect(protocol: str, url: str, image: bytes) -> tuple[Any, Any, Any]:
    """(boxes [N, 4], scores [N], landmarks [N, 5, 2]) as the server found them."""
    data = np.array([image], dtype=np.object_)
    if protocol == "grpc":
        import tritonclient.grpc as grpcclient

        gclient = grpcclient.InferenceServerClient(url=url)
        try:
            tensor = grpcclient.InferInput("image", [1], "BYTES")
            tensor.set_data_from_numpy(data)
            wanted = [grpcclient.InferRequestedOutput(name) for name in OUTPUTS]
            result = gclient.infer(MODEL, [tensor], outputs=wanted)
        finally:
            gclient.close()
    else:
        import tritonclient.http as httpclient

        hclient = httpclient.InferenceServerClient(url=url)
        try:
            htensor = httpclient.InferInput("image", [1], "BYTES")
            htensor.set_data_from_numpy(data, binary_data=True)
            hwanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in OUTPUTS]
            result = hclient.infer(MODEL, [htensor], outputs=hwanted)
        finally:
            hclient.close()
    boxes, scores, landmarks = (result.as_numpy(name) for name in OUTPUTS)
    if boxes is None or scores is None or landmarks is None:
        raise RuntimeError("the response lacks boxes, scores or landmarks")
    return boxes, scores, landmarks


def draw(image: Path, boxes: Any, landmarks: Any, out: Path) -> None:
    from PIL import Image, ImageDraw

    with Image.open(image) as opened:
        canvas = opened.convert("RGB")
    pen = ImageDraw.Draw(canvas)
    for box, points in zip(boxes, landmarks, strict=True):
        pen.rectangle([float(v) for v in box], outline="red", width=2)
        for x, y in points:
            pen.ellipse([x - 3, y - 3, x + 3, y + 3], outline="yellow", width=2)
    canvas.save(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("image", type=Path, help="an image file")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("-u", "--url", default=None, help="host:port, no scheme")
    parser.add_argument("--draw", type=Path, default=None, help="write the faces drawn in")
    parser.add_argument("--expect-faces", type=int, default=None)
    args = parser.parse_args()
    url = args.url or ("localhost:8001" if args.protocol == "grpc" else "localhost:8000")

    boxes, scores, landmarks = detect(args.protocol, url, args.image.read_bytes())
    for box, score, points in zip(boxes, scores, landmarks, strict=True):
        marks = " ".join(f"({x:.0f},{y:.0f})" for x, y in points)
        print(f"{score:.3f}  box {[round(float(v)) for v in box]}  landmarks {marks}")
    print(f"{len(boxes)} face(s)")
    if args.draw is not None:
        draw(args.image, boxes, landmarks, args.draw)
    if args.expect_faces is None:
        return 0
    ok = len(boxes) == args.expect_faces
    print(
        "PASS: face_detect_client"
        if ok
        else f"FAIL: face_detect_client: expected {args.expect_faces} face(s), got {len(boxes)}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
