"""The OCR example's processing (examples/ocr/model/ocr_steps.py) on inputs whose answers
are known, and its build script on the installed wheel, without a server."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import ocrrepo
import onnx
import pytest
from PIL import Image

steps = ocrrepo.ocr_steps()


def rotated_rectangle(width: float, height: float, degrees: float) -> np.ndarray:
    """Grid points filling a width x height rectangle turned by `degrees` about (100, 80)."""
    u, v = np.meshgrid(np.arange(0, width + 0.5, 0.5), np.arange(0, height + 0.5, 0.5))
    a = math.radians(degrees)
    x = 100 + u * math.cos(a) - v * math.sin(a)
    y = 80 + u * math.sin(a) + v * math.cos(a)
    return np.stack([x.ravel(), y.ravel()], axis=1)


@pytest.mark.parametrize("degrees", [0.0, 12.0, 30.0, 75.0])
def test_min_area_rect_finds_the_turned_rectangle(degrees: float) -> None:
    rect = steps.min_area_rect(rotated_rectangle(40, 10, degrees))
    assert rect.long_side == pytest.approx(40, abs=1e-6)
    assert rect.short_side == pytest.approx(10, abs=1e-6)
    corners = rect.corners()
    sides = np.hypot(*(np.roll(corners, -1, axis=0) - corners).T)
    assert sorted(sides) == pytest.approx([10, 10, 40, 40], abs=1e-6)


def test_min_area_rect_of_points_on_a_line_is_flat() -> None:
    rect = steps.min_area_rect(np.array([[0.0, 5.0], [3.0, 5.0], [9.0, 5.0]]))
    assert rect.short_side == 0 and rect.long_side == 9


def test_text_boxes_keep_confident_regions_grown_and_scaled() -> None:
    prob = np.zeros((64, 128), np.float32)
    prob[10:20, 10:70] = 0.9  # a line of text
    prob[40:50, 20:60] = 0.4  # over `thresh` but under `box_thresh`: dropped
    prob[30:32, 100:102] = 0.95  # too small: dropped
    boxes, scores = steps.text_boxes(prob, (128, 256))  # the image is twice the map
    assert boxes.shape == (1, 4, 2) and scores.shape == (1,)
    # The score is the mean over the region, whose 2x2 dilation added a ring of zeros.
    assert scores[0] == pytest.approx(0.9 * 60 * 10 / (61 * 11), abs=1e-4)
    # Region pixels 10..69 x 10..19, dilated by one pixel to 70 x 20; the region is 60 x 10
    # (centres), so DB's unclip grows each side by 60 * 10 * 1.6 / (2 * 70) ~ 6.9.
    (x0, y0), (x1, _), (_, y2), _ = boxes[0]
    grow = 60 * 10 * 1.6 / (2 * 70)
    assert x0 == pytest.approx(2 * (10 - grow), abs=2.5)
    assert x1 == pytest.approx(2 * (70 + grow), abs=2.5)
    assert y0 == pytest.approx(2 * (10 - grow), abs=2.5)
    assert y2 == pytest.approx(2 * (20 + grow), abs=2.5)


def test_text_boxes_on_an_empty_map() -> None:
    boxes, scores = steps.text_boxes(np.zeros((32, 32), np.float32), (32, 32))
    assert boxes.shape == (0, 4, 2) and scores.shape == (0,)


def test_reading_order_is_lines_top_down_then_left_to_right() -> None:
    def box(x: float, y: float) -> list[list[float]]:
        return [[x, y], [x + 10, y], [x + 10, y + 5], [x, y + 5]]

    boxes = np.array([box(50, 42), box(0, 0), box(40, 3), box(0, 40)], np.float32)
    assert steps.reading_order(boxes).tolist() == [1, 2, 3, 0]


def test_crop_cuts_the_quad_out_and_stands_tall_lines_up() -> None:
    image = Image.new("RGB", (100, 100), "white")
    image.paste((255, 0, 0), (20, 30, 80, 50))
    box = np.array([[20, 30], [80, 30], [80, 50], [20, 50]], np.float32)
    cut = steps.crop(image, box)
    assert cut.size == (60, 20)
    assert np.asarray(cut)[5:15, 5:55].tolist() == [[[255, 0, 0]] * 50] * 10
    tall = steps.crop(image, np.array([[10, 10], [20, 10], [20, 60], [10, 60]], np.float32))
    assert tall.size == (50, 10)


def test_rec_batches_group_lines_by_width_bucket_and_pad_with_zeros() -> None:
    short = Image.new("RGB", (96, 48), "black")  # natural width 96 -> 320
    medium = Image.new("RGB", (400, 48), "black")  # 400 -> 480
    long = Image.new("RGB", (9000, 48), "black")  # past the last bucket: squeezed
    batches = steps.rec_batches([short, medium, long, short])
    assert [(idx, t.shape) for idx, t in batches] == [
        ([0, 3], (2, 3, 48, 320)),
        ([1], (1, 3, 48, 480)),
        ([2], (1, 3, 48, 2560)),
    ]
    first = batches[0][1][0]
    assert np.all(first[:, :, :96] == -1.0)  # black, normalised to [-1, 1]
    assert np.all(first[:, :, 96:] == 0.0)


def test_cls_input_and_upright_turn_only_confident_upside_down_lines() -> None:
    crops = [Image.new("RGB", (30, 10), c) for c in ("red", "green", "blue")]
    crops[0].putpixel((0, 0), (0, 0, 0))
    assert steps.cls_input(crops).shape == (3, 3, 48, 192)
    probs = np.array([[0.02, 0.98], [0.2, 0.8], [0.99, 0.01]], np.float32)
    turned = steps.upright(crops, probs)
    assert turned[0].getpixel((29, 9)) == (0, 0, 0)  # turned by 180 degrees
    assert turned[1] is crops[1] and turned[2] is crops[2]


def test_ctc_decode_merges_repeats_and_drops_blanks() -> None:
    characters = steps.characters_from("a\nb\n")  # classes: blank, a, b, space
    sequence = [1, 1, 0, 2, 2, 0, 2, 3, 1]
    probs = np.full((1, len(sequence), 4), 0.1, np.float32)
    for t, k in enumerate(sequence):
        probs[0, t, k] = 0.7
    probs[0, 0, 1] = 0.9
    [(text, score)] = steps.ctc_decode(probs, characters)
    assert text == "abb a"
    assert score == pytest.approx((0.9 + 0.7 * 4) / 5)
    [(empty, zero)] = steps.ctc_decode(np.eye(4, dtype=np.float32)[[0, 0]][None], characters)
    assert (empty, zero) == ("", 0.0)


def test_decode_image_takes_any_pillow_format_and_refuses_the_rest() -> None:
    buffer = io.BytesIO()
    Image.new("RGBA", (20, 10), (1, 2, 3, 255)).save(buffer, format="PNG")
    rgb = steps.decode_image(buffer.getvalue())
    assert rgb.shape == (10, 20, 3) and rgb[0, 0].tolist() == [1, 2, 3]
    with pytest.raises(steps.BadImage, match="not a readable image"):
        steps.decode_image(b"GIF89a but not really")
    tiny = io.BytesIO()
    Image.new("RGB", (4, 4)).save(tiny, format="PNG")
    with pytest.raises(steps.BadImage, match="smaller than 8x8"):
        steps.decode_image(tiny.getvalue())


def test_det_input_is_a_multiple_of_32_within_the_limit() -> None:
    assert steps.det_input(np.zeros((100, 3000, 3), np.uint8)).shape == (1, 3, 32, 960)
    assert steps.det_input(np.zeros((224, 640, 3), np.uint8)).shape == (1, 3, 224, 640)


# --- the build script, on the installed wheel --------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = ocrrepo.build_script()
    out = tmp_path_factory.mktemp("ocr")
    try:
        build.build(out, build.Options(batching=False, instances=3))
    except build.WheelMissing as exc:
        pytest.skip(f"the OCR example cannot be built: {exc}")
    return out


def test_build_writes_the_repository_from_the_wheel(built: Path) -> None:
    files = sorted(str(p.relative_to(built)) for p in built.rglob("*") if p.is_file())
    assert files == [
        "ocr/1/model.py", "ocr/1/ocr_steps.py", "ocr/1/ppocr_keys.txt", "ocr/config.pbtxt",
        "ocr_cls/1/model.onnx", "ocr_cls/config.pbtxt", "ocr_det/1/model.onnx",
        "ocr_det/config.pbtxt", "ocr_rec/1/model.onnx", "ocr_rec/config.pbtxt",
    ]  # fmt: skip
    keys = (built / "ocr" / "1" / "ppocr_keys.txt").read_text(encoding="utf-8").splitlines()
    assert len(keys) == 6623 and "A" in keys and "7" in keys
    assert "count: 3" in (built / "ocr" / "config.pbtxt").read_text()
    for name, output in (("ocr_det", "maps"), ("ocr_cls", "probs"), ("ocr_rec", "probs")):
        config = (built / name / "config.pbtxt").read_text()
        assert 'backend: "onnxruntime"' in config and "dynamic_batching" not in config
        model = onnx.load(str(built / name / "1" / "model.onnx"))
        assert [i.name for i in model.graph.input] == ["x"]
        assert [o.name for o in model.graph.output] == [output]
        assert f'name: "{output}"' in config


def test_the_classifier_can_be_put_on_the_ge_backend() -> None:
    build = ocrrepo.build_script()
    options = build.Options(cls_backend="npu_ge")
    config = build.onnx_config("ocr_cls", 32, "3, 48, 192", "probs:2", options, "npu_ge")
    assert 'backend: "npu_ge"' in config and "dims: [ 3, 48, 192 ]" in config
    assert "KIND_CPU" not in config  # which would keep it on the host
    assert "dynamic_batching" in config
