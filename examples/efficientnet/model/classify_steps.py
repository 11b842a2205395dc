"""The `efficientnet` pipeline's pre- and post-processing, numpy and Pillow only.

Pre-processing is EfficientNet's evaluation transform: the image's shorter side resized
to 256 (bicubic), the centre 224 x 224 cut out, and each RGB value mapped to
``(v - 127) / 128``, the mean and scale the Lite checkpoints were trained with (not the
ImageNet mean and std of the full-size EfficientNets). Post-processing is a softmax over
the 1000 logits and the top k.
"""

from __future__ import annotations

import io

import numpy as np
import numpy.typing as npt
from PIL import Image, UnidentifiedImageError

IMAGE_SIZE = 224
RESIZE = 256
MEAN = np.float32(127.0)
SCALE = np.float32(128.0)
MAX_PIXELS = 40_000_000

F32 = npt.NDArray[np.float32]


class BadImage(ValueError):
    """The request cannot be served: its bytes are no image Pillow reads, or a parameter
    is out of range."""


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
    if rgb.width < 8 or rgb.height < 8:
        raise BadImage(f"the image is {rgb.width}x{rgb.height}, smaller than 8x8")
    return rgb


def model_input(image: Image.Image) -> F32:
    """The classifier's input [3, 224, 224]: resized, centre-cropped, normalised."""
    scale = RESIZE / min(image.width, image.height)
    width, height = (
        max(IMAGE_SIZE, round(image.width * scale)),
        max(IMAGE_SIZE, round(image.height * scale)),
    )
    resized = image.resize((width, height), Image.Resampling.BICUBIC)
    left, top = (width - IMAGE_SIZE) // 2, (height - IMAGE_SIZE) // 2
    crop = resized.crop((left, top, left + IMAGE_SIZE, top + IMAGE_SIZE))
    hwc = (np.asarray(crop, dtype=np.float32) - MEAN) / SCALE
    return np.ascontiguousarray(hwc.transpose(2, 0, 1))


def top_k(logits: F32, k: int) -> tuple[npt.NDArray[np.intp], F32]:
    """The k most likely classes of one image's logits [C], best first, and their
    softmax probabilities."""
    shifted = logits.astype(np.float64) - float(np.max(logits))
    probs = np.exp(shifted)
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")[: max(1, min(k, probs.size))]
    return order, probs[order].astype(np.float32)


def read_labels(text: str) -> list[str]:
    """labels.txt: one class name a line, in the model's class order."""
    labels = text.splitlines()
    if len(labels) != 1000:
        raise ValueError(f"labels.txt has {len(labels)} lines, not 1000")
    return labels
