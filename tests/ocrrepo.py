"""The OCR example for tests and the bench: its build script and processing module loaded
from examples/ocr/, and images of known text rendered with Pillow.

The text is drawn in Pillow's built-in scalable font (`ImageFont.load_default(size=...)`,
Pillow >= 10.1), so every machine renders the same image without a font package.
"""

from __future__ import annotations

import importlib.util
import io
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from PIL import Image, ImageDraw, ImageFont

ROOT = Path(__file__).resolve().parent.parent
OCR_EXAMPLE = ROOT / "examples" / "ocr"
LINES = ("Hello ge-serve 2024", "Triton OCR pipeline", "PP-OCRv4 on numpy")


def _load(name: str, path: Path) -> ModuleType:
    """The module at `path`, imported once under `name` (dataclasses look their module
    up in sys.modules)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build_script() -> ModuleType:
    """examples/ocr/build.py as a module."""
    return _load("ocr_build", OCR_EXAMPLE / "build.py")


def ocr_steps() -> ModuleType:
    """examples/ocr/model/ocr_steps.py, the pipeline's pre- and post-processing."""
    return _load("ocr_steps", OCR_EXAMPLE / "model" / "ocr_steps.py")


@dataclass(frozen=True)
class Rendered:
    png: bytes
    # Each line's ink as drawn: (left, top, right, bottom) in pixels.
    boxes: tuple[tuple[int, int, int, int], ...]


def render(
    lines: Sequence[str] = LINES, size: int = 32, width: int = 640, angle: float = 0.0
) -> Rendered:
    """Black lines of text on white, one every 2 x `size` pixels, as PNG bytes; turned by
    `angle` degrees about the centre (boxes are those before turning)."""
    font = ImageFont.load_default(size=size)
    height = size * (2 * len(lines) + 1)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    boxes = []
    for index, line in enumerate(lines):
        origin = (size, size // 2 + 2 * size * index)
        draw.text(origin, line, fill="black", font=font)
        left, top, right, bottom = draw.textbbox(origin, line, font=font)
        boxes.append((int(left), int(top), int(right), int(bottom)))
    if angle:
        image = image.rotate(angle, fillcolor="white")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return Rendered(buffer.getvalue(), tuple(boxes))
