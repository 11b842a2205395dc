"""The CV examples (examples/efficientnet, examples/face_detect) for tests and the bench:
their build scripts loaded from examples/, and scikit-image's sample photos.

The photos ship in the scikit-image wheel (`skimage/data/`): a cat (`chelsea.png`), a
cup of coffee (`coffee.png`) and a portrait (`astronaut.png`, 512 x 512, one face). They
are read as files, found through the wheel's installed-file list; skimage is not imported.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


class PhotoMissing(RuntimeError):
    """scikit-image, or the photo asked for, is not installed."""


def load_module(name: str, path: Path) -> ModuleType:
    """The module at `path`, imported once under `name`."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def efficientnet_build() -> ModuleType:
    """examples/efficientnet/build.py as a module."""
    return load_module("efficientnet_build", EXAMPLES / "efficientnet" / "build.py")


def face_detect_build() -> ModuleType:
    """examples/face_detect/build.py as a module."""
    return load_module("face_detect_build", EXAMPLES / "face_detect" / "build.py")


def photo(name: str) -> bytes:
    """The bytes of one of scikit-image's sample photos, as shipped (PNG or JPEG)."""
    try:
        dist = importlib.metadata.distribution("scikit-image")
    except importlib.metadata.PackageNotFoundError:
        raise PhotoMissing("scikit-image is not installed: pip install -e '.[test]'") from None
    for entry in dist.files or ():
        parts = Path(str(entry)).parts
        if parts[-2:] == ("data", name) and parts[0] == "skimage":
            return Path(str(dist.locate_file(entry))).read_bytes()
    raise PhotoMissing(f"scikit-image {dist.version} has no skimage/data/{name}")
