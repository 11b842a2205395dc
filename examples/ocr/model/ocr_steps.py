"""The OCR pipeline's pre- and post-processing, in numpy and Pillow, with no model calls.

The `ocr` Python model (model.py beside this file) calls these between its BLS calls to
the three PP-OCRv4 ONNX models:

1. `decode_image` and `det_input`: the image bytes to an RGB array, then the detector's
   input, its longer side at most `DET_LIMIT` and both sides multiples of 32 (DBNet
   downsamples by 32), normalised with ImageNet's mean and deviation in BGR order, as
   PaddleOCR trained it.
2. `text_boxes`: DB post-processing of the detector's probability map. Pixels over
   `thresh` form 8-connected regions (scipy.ndimage); each region's minimum-area
   rectangle (convex hull, then rotating calipers) is kept when its mean probability is
   at least `box_thresh`, then grown back by the distance DBNet shrank text by in
   training (area * ratio / perimeter on every side; for a rectangle that is exactly the
   minimum-area rectangle of its rounded offset polygon, so no polygon clipper is
   needed), and scaled to the original image.
3. `reading_order`, `crop`: boxes top to bottom and left to right in a line; each box cut
   out with a perspective (quad) transform, turned upright when taller than wide.
4. `cls_input`, `upright`: the direction classifier's input (48 x 192), and a crop turned
   by 180 degrees when the classifier is sure it is upside down.
5. `rec_batches`: recognition inputs, 48 pixels high, grouped by width bucket so that a
   request sends one tensor per bucket and requests of the same bucket can be batched by
   the server; a crop is padded on the right to its bucket's width.
6. `ctc_decode`: greedy CTC over the recogniser's per-column class probabilities
   (class 0 is the blank; repeats merge), with the mean probability of the kept
   characters as the score.

Every function takes and returns plain arrays, so each is tested without a server.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from PIL import Image, UnidentifiedImageError
from scipy import ndimage

F32 = npt.NDArray[np.float32]

DET_LIMIT = 960
DET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
DET_STD = np.array([0.229, 0.224, 0.225], np.float32)
CLS_SHAPE = (48, 192)
REC_HEIGHT = 48
# Widths a text line is padded to before recognition. PP-OCRv4's recogniser was trained at
# 320; wider lines keep their aspect ratio up to the last bucket and are squeezed past it.
REC_BUCKETS = (320, 480, 640, 800, 960, 1280, 1600, 1920, 2560)
MAX_PIXELS = 40_000_000


class BadImage(ValueError):
    """The request's bytes are not an image Pillow can read."""


@dataclass(frozen=True, slots=True)
class DetSettings:
    """DB post-processing thresholds (PaddleOCR's names)."""

    thresh: float = 0.3
    box_thresh: float = 0.5
    unclip_ratio: float = 1.6
    min_size: float = 3.0
    max_candidates: int = 1000


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


def decode_image(data: bytes) -> npt.NDArray[np.uint8]:
    """An encoded image (PNG, JPEG, ...) as an RGB uint8 array [H, W, 3]."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.width * image.height > MAX_PIXELS:
                raise BadImage(f"the image is {image.width}x{image.height}, too large")
            rgb = np.asarray(eight_bit(image).convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise BadImage(f"the input is not a readable image: {exc}") from None
    if rgb.shape[0] < 8 or rgb.shape[1] < 8:
        raise BadImage(f"the image is {rgb.shape[1]}x{rgb.shape[0]}, smaller than 8x8")
    return rgb


def _normalise(rgb: npt.NDArray[np.uint8], mean: F32, std: F32) -> F32:
    """HWC RGB uint8 to CHW float32 in BGR order, (x / 255 - mean) / std."""
    bgr = rgb[:, :, ::-1].astype(np.float32) / np.float32(255.0)
    chw: F32 = ((bgr - mean) / std).transpose(2, 0, 1)
    return np.ascontiguousarray(chw)


def det_input(rgb: npt.NDArray[np.uint8], limit: int = DET_LIMIT) -> F32:
    """The detector's input [1, 3, H', W']: longer side <= limit, sides multiples of 32."""
    height, width = rgb.shape[:2]
    ratio = min(1.0, limit / max(height, width))
    new_h = max(32, round(height * ratio / 32) * 32)
    new_w = max(32, round(width * ratio / 32) * 32)
    resized = np.asarray(
        Image.fromarray(rgb).resize((new_w, new_h), Image.Resampling.BILINEAR), np.uint8
    )
    return _normalise(resized, DET_MEAN, DET_STD)[None]


def _hull(points: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Convex hull of 2-D points (Andrew's monotone chain), counter-clockwise."""
    pts = np.unique(points, axis=0)  # sorted by x, then y
    if len(pts) < 3:
        return pts

    def half(seq: npt.NDArray[np.float64]) -> list[npt.NDArray[np.float64]]:
        chain: list[npt.NDArray[np.float64]] = []
        for p in seq:
            while len(chain) >= 2:
                (ax, ay), (bx, by) = chain[-2], chain[-1]
                if (bx - ax) * (p[1] - ay) - (by - ay) * (p[0] - ax) > 0:
                    break
                chain.pop()
            chain.append(p)
        return chain

    lower, upper = half(pts), half(pts[::-1])
    return np.array(lower[:-1] + upper[:-1])


@dataclass(frozen=True, slots=True)
class Rect:
    """A rectangle in the frame whose axes are (cos, sin) and (-sin, cos): [u0, u1] along
    the first axis, [v0, v1] along the second."""

    cos: float
    sin: float
    u0: float
    u1: float
    v0: float
    v1: float

    @property
    def short_side(self) -> float:
        return min(self.u1 - self.u0, self.v1 - self.v0)

    @property
    def long_side(self) -> float:
        return max(self.u1 - self.u0, self.v1 - self.v0)

    def corners(self, grow: float = 0.0) -> npt.NDArray[np.float64]:
        """The corners [4, 2] in image coordinates, each side moved out by `grow`."""
        u0, u1, v0, v1 = self.u0 - grow, self.u1 + grow, self.v0 - grow, self.v1 + grow
        c, s = self.cos, self.sin
        return np.array(
            [[u * c - v * s, u * s + v * c] for u, v in ((u0, v0), (u1, v0), (u1, v1), (u0, v1))]
        )


def min_area_rect(points: npt.NDArray[np.float64]) -> Rect:
    """The minimum-area rectangle around 2-D `points`: one side lies on a convex hull
    edge (rotating calipers), so only the hull's edge directions are tried."""
    hull = _hull(points)
    if len(hull) < 3:  # one point, or all on one line
        lo, hi = points.min(axis=0), points.max(axis=0)
        return Rect(1.0, 0.0, float(lo[0]), float(hi[0]), float(lo[1]), float(hi[1]))
    edges = np.roll(hull, -1, axis=0) - hull
    angles = np.unique(np.mod(np.arctan2(edges[:, 1], edges[:, 0]), np.pi / 2))
    cos, sin = np.cos(angles), np.sin(angles)
    u = hull[:, 0][None] * cos[:, None] + hull[:, 1][None] * sin[:, None]
    v = -hull[:, 0][None] * sin[:, None] + hull[:, 1][None] * cos[:, None]
    u0, u1, v0, v1 = u.min(1), u.max(1), v.min(1), v.max(1)
    best = int(np.argmin((u1 - u0) * (v1 - v0)))
    return Rect(
        float(cos[best]), float(sin[best]),
        float(u0[best]), float(u1[best]), float(v0[best]), float(v1[best]),
    )  # fmt: skip


def order_corners(corners: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Four corners as top-left, top-right, bottom-right, bottom-left (image axes, y down)."""
    by_x = corners[np.argsort(corners[:, 0], kind="stable")]
    left, right = by_x[:2], by_x[2:]
    top_left, bottom_left = left[np.argsort(left[:, 1], kind="stable")]
    top_right, bottom_right = right[np.argsort(right[:, 1], kind="stable")]
    return np.array([top_left, top_right, bottom_right, bottom_left])


def _row_ends(region: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
    """The leftmost and rightmost pixel (x, y) of each row of `region`: every other pixel
    lies between two of them, so they have the region's convex hull."""
    rows = np.flatnonzero(region.any(axis=1))
    band = region[rows]
    left = band.argmax(axis=1)
    right = band.shape[1] - 1 - band[:, ::-1].argmax(axis=1)
    xs = np.concatenate([left, right])
    ys = np.concatenate([rows, rows])
    return np.stack([xs, ys], axis=1).astype(np.float64)


def text_boxes(
    prob: F32, image_shape: tuple[int, int], settings: DetSettings = DetSettings()
) -> tuple[F32, F32]:
    """DB post-processing: the probability map [H', W'] of the detector to boxes [N, 4, 2]
    (x, y in the original image, corners clockwise from top-left) and their mean
    probabilities [N]."""
    map_h, map_w = prob.shape
    height, width = image_shape
    mask = prob > settings.thresh
    # A 2x2 dilation joins characters that the shrunk map leaves one pixel apart.
    mask[1:, :] |= mask[:-1, :].copy()
    mask[:, 1:] |= mask[:, :-1].copy()
    labels, _ = ndimage.label(mask, structure=np.ones((3, 3), bool))
    boxes: list[npt.NDArray[np.float64]] = []
    scores: list[float] = []
    for index, found in enumerate(ndimage.find_objects(labels)[: settings.max_candidates]):
        if found is None:
            continue
        rows, cols = found
        region = labels[found] == index + 1
        points = _row_ends(region) + np.array([cols.start, rows.start], np.float64)
        rect = min_area_rect(points)
        if rect.short_side < settings.min_size:
            continue
        score = float(prob[found][region].mean())
        if score < settings.box_thresh:
            continue
        w, h = rect.long_side, rect.short_side
        distance = w * h * settings.unclip_ratio / (2.0 * (w + h))
        if h + 2.0 * distance < settings.min_size + 2.0:
            continue
        grown = rect.corners(distance)
        grown[:, 0] = np.clip(np.round(grown[:, 0] * width / map_w), 0, width)
        grown[:, 1] = np.clip(np.round(grown[:, 1] * height / map_h), 0, height)
        boxes.append(order_corners(grown))
        scores.append(score)
    if not boxes:
        return np.zeros((0, 4, 2), np.float32), np.zeros((0,), np.float32)
    return np.array(boxes, np.float32), np.array(scores, np.float32)


def reading_order(boxes: F32, line_tolerance: float = 10.0) -> npt.NDArray[np.intp]:
    """Indices of `boxes` top to bottom; boxes whose tops are within `line_tolerance`
    pixels of each other count as one line and go left to right."""
    if len(boxes) == 0:
        return np.zeros((0,), np.intp)
    tops = boxes[:, 0, :]
    order = list(np.lexsort((tops[:, 0], tops[:, 1])))
    for i in range(1, len(order)):
        j = i
        while j > 0:
            a, b = tops[order[j - 1]], tops[order[j]]
            if abs(float(b[1] - a[1])) < line_tolerance and b[0] < a[0]:
                order[j - 1], order[j] = order[j], order[j - 1]
                j -= 1
            else:
                break
    return np.array(order, np.intp)


def crop(image: Image.Image, box: F32) -> Image.Image:
    """The quad `box` (clockwise from top-left) cut out as an upright rectangle."""
    tl, tr, br, bl = (box[i].astype(np.float64) for i in range(4))
    width = max(1, round(max(np.hypot(*(tr - tl)), np.hypot(*(br - bl)))))
    height = max(1, round(max(np.hypot(*(bl - tl)), np.hypot(*(br - tr)))))
    quad = (*tl, *bl, *br, *tr)  # Pillow's order: upper-left, lower-left, lower-right, upper-right
    out = image.transform(
        (width, height),
        Image.Transform.QUAD,
        tuple(float(v) for v in quad),
        resample=Image.Resampling.BICUBIC,
    )
    if height / width >= 1.5:
        out = out.transpose(Image.Transpose.ROTATE_90)
    return out


def _line_input(image: Image.Image, height: int, width: int, max_width: int) -> F32:
    """A text line resized to `height` keeping its aspect ratio (at most `max_width` wide),
    normalised to [-1, 1], padded with zeros on the right to `width`."""
    resized_w = min(max_width, max(1, math.ceil(height * image.width / image.height)))
    line = np.asarray(
        image.convert("RGB").resize((resized_w, height), Image.Resampling.BILINEAR), np.uint8
    )
    chw = _normalise(line, np.full(3, 0.5, np.float32), np.full(3, 0.5, np.float32))
    out = np.zeros((3, height, width), np.float32)
    out[:, :, :resized_w] = chw
    return out


def cls_input(crops: Sequence[Image.Image]) -> F32:
    """The direction classifier's input [N, 3, 48, 192]."""
    height, width = CLS_SHAPE
    return np.stack([_line_input(c, height, width, width) for c in crops]).astype(np.float32)


def upright(crops: Sequence[Image.Image], probs: F32, thresh: float = 0.9) -> list[Image.Image]:
    """Crops the classifier finds upside down (class 1, '180', over `thresh`) turned."""
    out = []
    for image, p in zip(crops, probs, strict=True):
        turned = int(np.argmax(p)) == 1 and float(p[1]) > thresh
        out.append(image.transpose(Image.Transpose.ROTATE_180) if turned else image)
    return out


def rec_bucket(image: Image.Image) -> int:
    """The width bucket a text line is padded to for recognition."""
    natural = math.ceil(REC_HEIGHT * image.width / image.height)
    for bucket in REC_BUCKETS:
        if natural <= bucket:
            return bucket
    return REC_BUCKETS[-1]


def rec_batches(crops: Sequence[Image.Image]) -> list[tuple[list[int], F32]]:
    """Recognition inputs: (crop indices, tensor [n, 3, 48, bucket]) per width bucket."""
    groups: dict[int, list[int]] = {}
    for index, image in enumerate(crops):
        groups.setdefault(rec_bucket(image), []).append(index)
    return [
        (
            indices,
            np.stack([_line_input(crops[i], REC_HEIGHT, width, width) for i in indices]),
        )
        for width, indices in sorted(groups.items())
    ]


def ctc_decode(probs: F32, characters: Sequence[str]) -> list[tuple[str, float]]:
    """Greedy CTC over [N, T, C] class probabilities: `characters[k - 1]` is class k and
    class 0 the blank. Each line's score is the mean probability of its kept characters
    (0 for an empty line)."""
    best = probs.argmax(axis=2)
    confidence = probs.max(axis=2)
    out = []
    for idx, conf in zip(best, confidence, strict=True):
        keep = idx != 0
        keep[1:] &= idx[1:] != idx[:-1]
        text = "".join(characters[k - 1] for k in idx[keep] if k - 1 < len(characters))
        score = float(conf[keep].mean()) if keep.any() else 0.0
        out.append((text, score))
    return out


def characters_from(text: str) -> list[str]:
    """PP-OCR's dictionary (one character a line) plus the space its recogniser appends."""
    return [*text.splitlines(), " "]
