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
from google.protobuf import text_format
from PIL import Image

from ge_serve.backends.ge.options import make_plan
from ge_serve.backends.ge.shapes import parse_input_shape
from ge_serve.protos import model_config_pb2

steps = ocrrepo.ocr_steps()
build_script = ocrrepo.build_script()


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
        assert "dynamic_batching" not in config
        model = onnx.load(str(built / name / "1" / "model.onnx"))
        assert [i.name for i in model.graph.input] == ["x"]
        assert [o.name for o in model.graph.output] == [output]
        assert f'name: "{output}"' in config


def _config(path: Path) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig()
    text_format.Parse(path.read_text(encoding="utf-8"), config)
    return config


def _input_shape(config: model_config_pb2.ModelConfig) -> str:
    return config.parameters["graph.ge.inputShape"].string_value


def test_the_onnx_models_are_on_the_ge_backend_with_shape_ranges(built: Path) -> None:
    det, cls, rec = (_config(built / n / "config.pbtxt") for n in ("ocr_det", "ocr_cls", "ocr_rec"))
    for config in (det, cls, rec):
        assert config.backend == "npu_ge"
        assert not config.instance_group  # KIND_CPU would keep it on the host
    assert _input_shape(det) == f"x:1~{det.max_batch_size},3,32~960,32~960"
    assert _input_shape(rec) == f"x:1~{rec.max_batch_size},3,48,320~2560"
    assert "graph.ge.inputShape" not in cls.parameters  # fixed: batch gears only
    assert list(cls.input[0].dims) == [3, 48, 192]
    # What the GE backend makes of them: the atc input shapes and modes.
    det_plan, cls_plan, rec_plan = (make_plan(c) for c in (det, cls, rec))
    assert (det_plan.shapes.kind, det_plan.input_shape) == ("range", "x:1~4,3,32~960,32~960")
    assert (rec_plan.shapes.kind, rec_plan.input_shape) == ("range", "x:1~16,3,48,320~2560")
    assert det_plan.gears == rec_plan.gears == ()  # ranges: any batch inside
    assert (cls_plan.input_shape, cls_plan.gears) == ("x:-1,3,48,192", (1, 2, 4, 8, 16, 32))


def test_rec_shapes_gears_lists_every_width_bucket_at_every_batch_gear() -> None:
    options = build_script.Options(rec_shapes="gears")
    shapes = build_script.ge_shapes("gears")["ocr_rec"]
    config = model_config_pb2.ModelConfig()
    text = build_script.onnx_config("ocr_rec", 16, "3, 48, -1", "probs:-1, 6625", options, shapes)
    text_format.Parse(text, config)
    plan = make_plan(config)
    assert plan.shapes.kind == "dims" and plan.gears == (1, 2, 4, 8, 16)
    assert plan.input_shape == "x:-1,3,48,-1"
    assert ("input_format", "ND") in plan.atc_options
    gears = {gear[0] for gear in plan.shapes.gears}
    assert gears == {(b, 3, 48, w) for b in plan.gears for w in steps.REC_BUCKETS}
    # Gears are exact: every batch the pre-processing sends, padded up to the next batch
    # gear by the scheduler, is one of them.
    crops = [Image.new("RGB", (w, 48)) for w in (4, 96, 400, 700, 1500, 2500, 9000)] * 3
    for _, tensor in steps.rec_batches(crops):
        padded = min(g for g in plan.gears if g >= len(tensor))
        assert (padded, *tensor.shape[1:]) in gears
    with pytest.raises(ValueError, match="not one of range, gears"):
        build_script.ge_shapes("exact")


def test_the_shape_ranges_hold_everything_the_pre_processing_makes(built: Path) -> None:
    # A shape outside a range is refused; every detector input and every recogniser
    # batch the `ocr` model can send must lie inside.
    ranges = {
        name: parse_input_shape(_input_shape(_config(built / name / "config.pbtxt")))[0]
        for name in ("ocr_det", "ocr_rec")
    }

    def inside(name: str, shape: tuple[int, ...]) -> bool:
        spec = ranges[name]
        return len(shape) == len(spec.ranges) and all(
            low <= d <= high for d, (low, high) in zip(shape, spec.ranges, strict=True)
        )

    for height, width in ((8, 8), (20, 5000), (959, 961), (3000, 100), (224, 640), (33, 47)):
        shape = steps.det_input(np.zeros((height, width, 3), np.uint8)).shape
        assert inside("ocr_det", shape), (height, width, shape)
        assert shape[2] % 32 == 0 and shape[3] % 32 == 0
    assert not inside("ocr_det", (1, 3, 992, 64))  # past the limit: refused
    crops = [Image.new("RGB", (w, 48)) for w in (4, 96, 400, 700, 1500, 2500, 9000)]
    crops *= 3  # more lines of a width than one call sends
    rec = _config(built / "ocr_rec" / "config.pbtxt")
    widths = set()
    for _, tensor in steps.rec_batches(crops):
        for start in range(0, len(tensor), build_script.MAX_REC_BATCH):
            part = tensor[start : start + build_script.MAX_REC_BATCH]
            assert inside("ocr_rec", part.shape), part.shape
            assert len(part) <= rec.max_batch_size
            widths.add(part.shape[3])
    assert widths <= set(steps.REC_BUCKETS) and min(widths) == 320 and max(widths) == 2560


def test_backend_onnxruntime_keeps_the_models_on_the_host_cpu(tmp_path: Path) -> None:
    try:
        build_script.wheel_models()
    except build_script.WheelMissing as exc:
        pytest.skip(f"the OCR example cannot be built: {exc}")
    code = build_script.main(["--out", str(tmp_path), "--backend", "onnxruntime"])
    assert code == 0
    for name in ("ocr_det", "ocr_cls", "ocr_rec"):
        config = _config(tmp_path / name / "config.pbtxt")
        assert config.backend == "onnxruntime"
        assert [g.kind for g in config.instance_group] == [
            model_config_pb2.ModelInstanceGroup.KIND_CPU
        ]
        assert "graph.ge.inputShape" not in config.parameters
        assert config.HasField("dynamic_batching")
