"""The OCR example end to end: lines of text rendered with Pillow go to the `ocr` pipeline
(a Python model calling PP-OCRv4's detector, direction classifier and recogniser through
BLS) as PNG bytes, over HTTP and gRPC, and the same strings come back with boxes where
they were drawn.

The repository is built once for the module from the installed rapidocr-onnxruntime
wheel, as examples/ocr/build.py builds it by default: the three ONNX models on the GE
backend, here the simulated NPU (onnxruntime underneath, so a request costs about what
it does on the host CPU backend), with the detector's and recogniser's varying dims as
shape ranges. The tests skip, saying why, where that wheel is missing.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import ocrrepo
import pytest
from polling import poll
from promtext import scrape
from protocols import PROTOCOLS, Triton
from serverproc import REPO_ROOT, ServerProcess, running_server
from tritonclient.utils import InferenceServerException

# Every request runs three ONNX models on the CPU; on a loaded 2-core machine one takes
# seconds, so the bound is per test, and the server gets longer than usual to load them.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

OUTPUTS = ("boxes", "text", "scores")
ONNX_MODELS = ("ocr_det", "ocr_cls", "ocr_rec")


@pytest.fixture(scope="module")
def ocr_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    build = ocrrepo.build_script()
    repo = tmp_path_factory.mktemp("ocr-models")
    try:
        build.build(repo)
    except build.WheelMissing as exc:
        pytest.skip(f"the OCR example cannot be built: {exc}")
    # --device sim: the models must land on the simulated NPU, never fall back elsewhere.
    with running_server([repo], ["--device", "sim"], timeout=150.0) as proc:
        yield proc


@pytest.fixture(scope="module")
def rendered() -> ocrrepo.Rendered:
    return ocrrepo.render()


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, ocr_server: ServerProcess) -> Iterator[Triton]:
    client = Triton.connect(request.param, ocr_server)
    try:
        yield client
    finally:
        client.close()


def read(triton: Triton, png: bytes) -> Any:
    return triton.infer("ocr", {"image": np.array([png], dtype=np.object_)}, OUTPUTS)


def texts(result: Any) -> list[str]:
    return [t.decode("utf-8") for t in result.as_numpy("text")]


def test_rendered_lines_come_back_where_they_were_drawn(
    triton: Triton, rendered: ocrrepo.Rendered
) -> None:
    result = read(triton, rendered.png)
    assert texts(result) == list(ocrrepo.LINES)
    boxes = result.as_numpy("boxes")
    scores = result.as_numpy("scores")
    assert boxes.dtype == np.float32 and boxes.shape == (len(ocrrepo.LINES), 4, 2)
    assert scores.dtype == np.float32 and scores.shape == (len(ocrrepo.LINES),)
    assert np.all((scores > 0.5) & (scores <= 1.0)), scores
    for box, (left, top, right, bottom) in zip(boxes, rendered.boxes, strict=True):
        # The box holds the ink it read, with a margin of a few pixels (DB's unclip).
        assert box[:, 0].min() <= left + 2 and box[:, 0].max() >= right - 2, (box, left, right)
        assert box[:, 1].min() <= top + 2 and box[:, 1].max() >= bottom - 2, (box, top, bottom)
        assert box[:, 0].min() >= left - 16 and box[:, 0].max() <= right + 16, box
        assert box[:, 1].min() >= top - 16 and box[:, 1].max() <= bottom + 16, box


def test_upside_down_and_tilted_text_reads_the_same(ocr_server: ServerProcess) -> None:
    # The direction classifier turns the upside-down lines; the detector's rotated boxes
    # and the quad crop straighten the tilted ones.
    lines = ["Turned Around 42", "Read it back, please"]
    triton = Triton.connect("http", ocr_server)
    try:
        turned = read(triton, ocrrepo.render(lines, angle=180).png)
        assert texts(turned) == lines[::-1]  # the last line is now on top
        tilted = read(triton, ocrrepo.render(lines, angle=8).png)
        assert texts(tilted) == lines
    finally:
        triton.close()


def test_a_page_of_more_lines_than_one_classifier_batch_reads_whole(triton: Triton) -> None:
    # The direction classifier takes at most 32 crops a call; a page has more lines.
    lines = [f"Line {n} of the page" for n in range(1, 41)]
    result = read(triton, ocrrepo.render(lines, size=24).png)
    assert texts(result) == lines


def test_an_image_without_text_gives_no_lines(triton: Triton) -> None:
    result = read(triton, ocrrepo.render([]).png)
    assert result.as_numpy("boxes").shape == (0, 4, 2)
    assert result.as_numpy("text").shape == (0,)
    assert result.as_numpy("scores").shape == (0,)


def test_bytes_that_are_no_image_are_the_clients_error(triton: Triton) -> None:
    with pytest.raises(InferenceServerException) as raised:
        read(triton, b"this is not a PNG")
    triton.expect_error(raised.value, "INVALID_ARGUMENT", "not a readable image")


def _success_count(ocr_server: ServerProcess, model: str) -> int:
    triton = Triton.connect("http", ocr_server)
    try:
        stats = triton.client.get_inference_statistics(model)
    finally:
        triton.close()
    return int(stats["model_stats"][0]["inference_stats"]["success"].get("count", 0))


def test_the_client_script_reads_the_image_and_the_models_count_it(
    ocr_server: ServerProcess, rendered: ocrrepo.Rendered, tmp_path: Path
) -> None:
    # The BLS calls go through each model's scheduler, so they count in its statistics.
    before = {m: _success_count(ocr_server, m) for m in ("ocr", "ocr_det", "ocr_rec")}
    image = tmp_path / "lines.png"
    image.write_bytes(rendered.png)
    expect = [arg for line in ocrrepo.LINES for arg in ("--expect", line)]
    script = REPO_ROOT / "examples" / "clients" / "ocr_http.py"
    command = [sys.executable, str(script), "--url", ocr_server.http_url, str(image), *expect]
    result = subprocess.run(command, capture_output=True, text=True, timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS: ocr_http" in result.stdout
    for line in ocrrepo.LINES:
        assert line in result.stdout
    after = {m: _success_count(ocr_server, m) for m in before}
    assert after["ocr"] == before["ocr"] + 1
    assert after["ocr_det"] == before["ocr_det"] + 1
    assert after["ocr_rec"] >= before["ocr_rec"] + 1


def _stats(ocr_server: ServerProcess, model: str) -> dict[str, int]:
    triton = Triton.connect("http", ocr_server)
    try:
        stats = triton.client.get_inference_statistics(model)["model_stats"][0]
    finally:
        triton.close()
    return {
        "inferences": int(stats.get("inference_count", 0)),
        "executions": int(stats.get("execution_count", 0)),
    }


def test_the_onnx_models_run_on_the_simulated_npu_with_shape_ranges(
    ocr_server: ServerProcess, rendered: ocrrepo.Rendered
) -> None:
    triton = Triton.connect("http", ocr_server)
    try:
        for model in ONNX_MODELS:
            assert triton.client.get_model_config(model)["backend"] == "npu_ge", model
        before = {m: _stats(ocr_server, m) for m in ONNX_MODELS}
        assert texts(read(triton, rendered.png)) == list(ocrrepo.LINES)
    finally:
        triton.close()
    log = ocr_server.log()
    # The GE backend's load line names the device and each model's shape mode.
    assert re.search(r"GE backend: simulated NPU", log), log[-3000:]
    ranges = {
        "ocr_det": r"range shapes \(x \[1~4, 3, 32~960, 32~960\]\)",
        "ocr_rec": r"range shapes \(x \[1~16, 3, 48, 320~2560\]\)",
        "ocr_cls": r"gears \[1, 2, 4, 8, 16, 32\]",
    }
    for model, shapes in ranges.items():
        line = rf"model '{model}' version 1 on sim: 1 slot\(s\) on NPU 0, {shapes}"
        assert re.search(line, log), (model, log[-3000:])
    # Each model executed the request on the device: its statistics moved, and the
    # simulated NPU's memory is the three models' own.
    for model in ONNX_MODELS:
        after = _stats(ocr_server, model)
        assert after["executions"] > before[model]["executions"], model
        assert after["inferences"] > before[model]["inferences"], model

    def device_memory_is_the_models() -> bool:
        exposition = scrape(ocr_server.metrics_url)
        held = sum(
            value
            for labels, value in exposition.find("ge_serve_model_memory_bytes")
            if labels["model"] in ONNX_MODELS
        )
        used = exposition.value("ge_serve_device_memory_used_bytes", device="sim0")
        return used > 0 and used == held

    poll(device_memory_is_the_models, 30.0, "device memory held by the three OCR models")
