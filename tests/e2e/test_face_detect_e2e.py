"""The face-detection example end to end: scikit-image's photos go to the `face_detect`
pipeline (a Python model running MTCNN's cascade, calling P-Net per pyramid level and
R-Net and O-Net on batches of candidates through BLS) as image bytes, over HTTP and gRPC.

The astronaut portrait (512 x 512) has one face: its box comes back around it, with the
eyes above the nose above the mouth. The repository is built once for the module as
examples/face_detect/build.py builds it by default: the three networks on the GE backend
(here the simulated NPU), P-Net with a shape range. The tests skip, saying why, where a
package is missing.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cvrepo
import cvserver
import numpy as np
import pytest
from cvserver import photo
from PIL import Image
from protocols import PROTOCOLS, Triton
from serverproc import REPO_ROOT, ServerProcess
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

OUTPUTS = ("boxes", "scores", "landmarks")
NETWORKS = ("mtcnn_pnet", "mtcnn_rnet", "mtcnn_onet")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("face-detect-models")
    with cvserver.example_server(cvrepo.face_detect_build(), repo, "face-detection") as proc:
        yield proc


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Triton]:
    client = Triton.connect(request.param, server)
    try:
        yield client
    finally:
        client.close()


def detect(triton: Triton, image: bytes) -> Any:
    return triton.infer("face_detect", {"image": np.array([image], dtype=np.object_)}, OUTPUTS)


def test_the_astronaut_has_one_face_where_her_face_is(triton: Triton) -> None:
    result = detect(triton, photo("astronaut.png"))
    boxes, scores, marks = (result.as_numpy(name) for name in OUTPUTS)
    assert boxes.dtype == np.float32 and boxes.shape == (1, 4), boxes
    assert scores.shape == (1,) and scores[0] > 0.95, scores
    assert marks.dtype == np.float32 and marks.shape == (1, 5, 2), marks
    x1, y1, x2, y2 = boxes[0]
    # Her face (brow to chin, cheek to cheek) spans about x 180-270, y 60-175.
    assert 160 <= x1 <= 200 and 250 <= x2 <= 290, boxes
    assert 40 <= y1 <= 85 and 150 <= y2 <= 195, boxes
    (lx, ly), (rx, ry), (nx, ny), (mlx, mly), (mrx, mry) = marks[0]
    assert lx < nx < rx and mlx < nx < mrx, marks  # left to right
    assert max(ly, ry) < ny < min(mly, mry), marks  # eyes, nose, mouth, top to bottom
    assert np.all((marks[0, :, 0] > x1) & (marks[0, :, 0] < x2)), marks
    assert np.all((marks[0, :, 1] > y1) & (marks[0, :, 1] < y2)), marks


def test_a_large_image_is_shrunk_for_the_pyramid_and_boxes_scale_back(
    server: ServerProcess,
) -> None:
    # 1536 x 1536: over face_steps.MAX_SIDE, so the cascade runs on a 1024 copy (P-Net's
    # levels must fit its shape range) and the results are scaled back up.
    with Image.open(io.BytesIO(photo("astronaut.png"))) as image:
        large = image.convert("RGB").resize((1536, 1536), Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    large.save(buffer, format="PNG")
    triton = Triton.connect("http", server)
    try:
        boxes = detect(triton, buffer.getvalue()).as_numpy("boxes")
    finally:
        triton.close()
    assert boxes.shape == (1, 4), boxes
    x1, y1, x2, y2 = boxes[0] / 3
    assert 160 <= x1 <= 200 and 250 <= x2 <= 290 and 40 <= y1 <= 85 and 150 <= y2 <= 195, boxes


def test_a_photo_without_faces_gives_none(triton: Triton) -> None:
    result = detect(triton, photo("coffee.png"))
    assert result.as_numpy("boxes").shape == (0, 4)
    assert result.as_numpy("scores").shape == (0,)
    assert result.as_numpy("landmarks").shape == (0, 5, 2)


def test_bytes_that_are_no_image_are_the_clients_error(triton: Triton) -> None:
    with pytest.raises(InferenceServerException) as raised:
        detect(triton, b"this is not a PNG")
    triton.expect_error(raised.value, "INVALID_ARGUMENT", "not a readable image")


def _counts(server: ServerProcess, model: str) -> tuple[int, int]:
    """(executions, inferences) of a model so far."""
    triton = Triton.connect("http", server)
    try:
        stats = triton.client.get_inference_statistics(model)["model_stats"][0]
    finally:
        triton.close()
    return int(stats.get("execution_count", 0)), int(stats.get("inference_count", 0))


def test_the_networks_run_on_the_simulated_npu_pnet_over_a_shape_range(
    server: ServerProcess,
) -> None:
    before = {m: _counts(server, m) for m in NETWORKS}
    triton = Triton.connect("grpc", server)
    try:
        assert detect(triton, photo("astronaut.png")).as_numpy("boxes").shape == (1, 4)
    finally:
        triton.close()
    after = {m: _counts(server, m) for m in NETWORKS}
    runs = {m: after[m][0] - before[m][0] for m in NETWORKS}
    rows = {m: after[m][1] - before[m][1] for m in NETWORKS}
    # P-Net once per pyramid level (10 for 512 x 512 at min face 20). R-Net takes the
    # candidates 64 at a time (over a hundred here), O-Net R-Net's few survivors in one batch.
    assert runs["mtcnn_pnet"] == rows["mtcnn_pnet"] == 10, (before, after)
    assert rows["mtcnn_rnet"] >= 1, (before, after)
    assert runs["mtcnn_rnet"] == -(-rows["mtcnn_rnet"] // 64), (before, after)
    assert runs["mtcnn_onet"] == 1 and rows["mtcnn_onet"] >= 1, (before, after)
    log = server.log()
    shapes = {
        "mtcnn_pnet": r"range shapes \(x \[1, 12~640, 12~640, 3\]\)",
        "mtcnn_rnet": r"gears \[1, 2, 4, 8, 16, 32, 64\]",
        "mtcnn_onet": r"gears \[1, 2, 4, 8, 16, 32\]",
    }
    for model, found in shapes.items():
        line = rf"model '{model}' version 1 on sim: 1 slot\(s\) on NPU 0, {found}"
        assert re.search(line, log), (model, log[-3000:])


def test_the_client_script_finds_the_face_and_draws_it(
    server: ServerProcess, tmp_path: Path
) -> None:
    image = tmp_path / "astronaut.png"
    image.write_bytes(photo("astronaut.png"))
    script = REPO_ROOT / "examples" / "clients" / "face_detect_client.py"
    for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
        drawn = tmp_path / f"drawn-{protocol}.png"
        command = [
            sys.executable, str(script), "--protocol", protocol, "--url", url,
            "--expect-faces", "1", "--draw", str(drawn), str(image),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, timeout=150)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "PASS: face_detect_client" in result.stdout and "1 face(s)" in result.stdout
        assert drawn.stat().st_size > 0
